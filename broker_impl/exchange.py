"""Exchanges: routing a message to the set of queue names that want it.

Exchanges hold bindings by queue *name*; the vhost resolves names to queue
objects, so deleting a queue only needs its bindings removed here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from pamqp import commands

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")


@dataclass(slots=True)
class Binding:
    source: str
    destination: str
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def key(self) -> tuple[str, str, str, tuple[tuple[str, str], ...]]:
        return (
            self.source,
            self.destination,
            self.routing_key,
            tuple(sorted((k, repr(v)) for k, v in self.arguments.items())),
        )


# An exchange-to-exchange binding's destination: the exchange's name behind a NUL, so one binding
# table (and every exchange type's matching) serves both kinds and no queue name can collide.
_TO_EXCHANGE = "\x00"


def exchange_destination(name: str) -> str:
    """The ``Binding.destination`` of a binding whose destination is exchange ``name``."""
    return _TO_EXCHANGE + name


def destination_exchange(destination: str) -> str | None:
    """The exchange a binding's destination names, or None when it names a queue."""
    return destination[1:] if destination.startswith(_TO_EXCHANGE) else None


class Exchange:
    """Base: a set of bindings and a ``route`` that picks destination names (queues, or exchanges)."""

    type = ""

    def __init__(
        self,
        name: str,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments or {})
        self.bindings: dict[tuple[Any, ...], Binding] = {}
        self._setup()

    def _setup(self) -> None:
        """A kind's own reading of its ``arguments`` (raise ``ValueError`` to refuse them); none here."""

    def bind(self, b: Binding) -> None:
        self.bindings[b.key()] = b

    def unbind(self, b: Binding) -> bool:
        return self.bindings.pop(b.key(), None) is not None

    def unbind_queue(self, queue: str) -> None:
        for k in [k for k, b in self.bindings.items() if b.destination == queue]:
            del self.bindings[k]

    def route(self, routing_key: str, properties: commands.Basic.Properties) -> set[str]:
        raise NotImplementedError

    def equivalent(
        self, type_: str, durable: bool, auto_delete: bool, internal: bool, arguments: dict[str, Any]
    ) -> bool:
        """RabbitMQ refuses a redeclare that changes any of these (406)."""
        return (
            type_ == self.type
            and durable == self.durable
            and auto_delete == self.auto_delete
            and internal == self.internal
            and _norm_args(arguments) == _norm_args(self.arguments)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "durable": self.durable,
            "auto_delete": self.auto_delete,
            "internal": self.internal,
            "arguments": self.arguments,
        }


def _norm_args(a: dict[str, Any]) -> dict[str, Any]:
    # Clients may send alternate-exchange etc.; only compare what was given.
    return {k: v for k, v in (a or {}).items()}


class DirectExchange(Exchange):
    type = "direct"

    def route(self, routing_key: str, properties: commands.Basic.Properties) -> set[str]:
        return {b.destination for b in self.bindings.values() if b.routing_key == routing_key}


class FanoutExchange(Exchange):
    type = "fanout"

    def route(self, routing_key: str, properties: commands.Basic.Properties) -> set[str]:
        return {b.destination for b in self.bindings.values()}


def topic_match(pattern: str, routing_key: str) -> bool:
    """``*`` matches exactly one word, ``#`` zero or more; words are dot-separated."""
    return _match_words(tuple(pattern.split(".")), tuple(routing_key.split(".")))


@functools.lru_cache(maxsize=65536)
def _match_words(pat: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if not pat:
        return not words
    head, rest = pat[0], pat[1:]
    if head == "#":
        return any(_match_words(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    if head == "*" or head == words[0]:
        return _match_words(rest, words[1:])
    return False


class TopicExchange(Exchange):
    type = "topic"

    def route(self, routing_key: str, properties: commands.Basic.Properties) -> set[str]:
        return {b.destination for b in self.bindings.values() if topic_match(b.routing_key, routing_key)}


class HeadersExchange(Exchange):
    type = "headers"

    def route(self, routing_key: str, properties: commands.Basic.Properties) -> set[str]:
        headers = properties.headers or {}
        out = set()
        for b in self.bindings.values():
            args = dict(b.arguments)
            mode = args.pop("x-match", "all")
            wanted = {k: v for k, v in args.items() if not k.startswith("x-")}
            if not wanted:
                out.add(b.destination)
                continue
            hits = [k in headers and (v is None or headers[k] == v) for k, v in wanted.items()]
            if (mode == "any" and any(hits)) or (mode != "any" and all(hits)):
                out.add(b.destination)
        return out


_ROUTING: dict[str, type[Exchange]] = {
    "direct": DirectExchange,
    "fanout": FanoutExchange,
    "topic": TopicExchange,
    "headers": HeadersExchange,
}


def make_routing_exchange(type_: str, name: str, **kwargs: Any) -> Exchange:
    """One of the four routing types (``broker_impl.exchange_types.make_exchange`` has them all);
    KeyError for any other type."""
    return _ROUTING[type_](name, **kwargs)
