"""A virtual host: its exchanges, queues and bindings, and routing between them.

Declarations that change durable state call back into the broker so the
metadata store is rewritten before the client sees ``declare-ok``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from pamqp import commands

from broker_impl.backing_queue import BackingQueue
from broker_impl.codec import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    ChannelError,
    ConnectionError_,
)
from broker_impl.exchange import Binding, Exchange, destination_exchange, exchange_destination
from broker_impl.exchange_types import make_exchange
from broker_impl.message import Message, copy_properties
from broker_impl.queue import Queue

log = logging.getLogger("broker_impl.vhost")


class VHostOwner(Protocol):
    """What a vhost needs from the node it lives on (``broker_impl.broker.Broker``)."""

    def metadata_changed(self, persist: bool = True) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

    async def open_backing(self, vhost: str, name: str, durable: bool) -> BackingQueue: ...

    def make_queue(self, vhost: VHost, name: str, bq: BackingQueue, **kwargs: Any) -> Queue: ...

    def effective_policy(self, vhost: str, queue: str, apply_to: str = "queues") -> dict[str, Any] | None: ...

    def apply_policies(self, q: Queue) -> None: ...


_BUILTIN_EXCHANGES = (
    ("", "direct"),
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)

_QUEUE_ARGS_COMPARED = (
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-expires",
    "x-queue-type",
)


class VHost:
    def __init__(self, broker: VHostOwner, name: str) -> None:
        self.broker = broker
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        for ename, etype in _BUILTIN_EXCHANGES:
            self.exchanges[ename] = make_exchange(etype, ename, durable=True)

    # -- exchanges ----------------------------------------------------------------
    def declare_exchange(
        self,
        name: str,
        type_: str,
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Exchange:
        if passive:
            return self.get_exchange(name)
        arguments = arguments or {}
        existing = self.exchanges.get(name)
        if name == "" or (name.startswith("amq.") and existing is None):
            raise ChannelError(ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'")
        if existing is not None:
            if not existing.equivalent(type_, durable, auto_delete, internal, arguments):
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"inequivalent arg 'type' or flags for exchange '{name}' in vhost '{self.name}': "
                    f"received '{type_}' but current is '{existing.type}'",
                )
            return existing
        try:
            ex = make_exchange(
                type_, name, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments
            )
        except KeyError:
            raise ConnectionError_(COMMAND_INVALID, f"unknown exchange type '{type_}'") from None
        except ValueError as exc:
            raise ChannelError(PRECONDITION_FAILED, str(exc)) from None
        self.exchanges[name] = ex
        self.broker.metadata_changed(persist=durable)
        return ex

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        ex = self.exchanges.get(name)
        if ex is None:
            return  # RabbitMQ >= 3.2: deleting a missing exchange is not an error
        if name == "" or name.startswith("amq."):
            raise ChannelError(ACCESS_REFUSED, f"operation not permitted on the default exchange '{name}'")
        if if_unused and ex.bindings:
            raise ChannelError(PRECONDITION_FAILED, f"exchange '{name}' in vhost '{self.name}' in use")
        del self.exchanges[name]  # its bindings go with it, and so do the bindings that lead to it
        dest = exchange_destination(name)
        for other in self.exchanges.values():
            other.unbind_queue(dest)
        self.broker.metadata_changed(persist=ex.durable)

    def get_exchange(self, name: str) -> Exchange:
        ex = self.exchanges.get(name)
        if ex is None:
            raise ChannelError(NOT_FOUND, f"no exchange '{name}' in vhost '{self.name}'")
        return ex

    # -- queues ---------------------------------------------------------------------
    def get_queue(self, name: str, owner: object | None = None) -> Queue:
        q = self.queues.get(name)
        if q is None or q.deleted:
            raise ChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{self.name}'")
        if q.exclusive_owner is not None and owner is not None and q.exclusive_owner is not owner:
            raise ChannelError(
                RESOURCE_LOCKED,
                f"cannot obtain exclusive access to locked queue '{name}' in vhost '{self.name}'. "
                "It could be originally declared on another connection or the exclusive property value "
                "does not match that of the original declaration.",
            )
        return q

    async def declare_queue(
        self,
        name: str,
        *,
        owner: object,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Queue:
        arguments = arguments or {}
        if passive:
            return self.get_queue(name, owner)
        if not name:
            name = "amq.gen-" + secrets.token_urlsafe(16)
        elif name.startswith("amq."):
            raise ChannelError(ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'")
        existing = self.queues.get(name)
        if existing is not None and not existing.deleted:
            q = self.get_queue(name, owner)
            self._check_equivalent(
                q, durable=durable, exclusive=exclusive, auto_delete=auto_delete, arguments=arguments
            )
            q.touch()
            return q
        self._check_new_queue_args(name, arguments)
        bq = await self.broker.open_backing(self.name, name, durable)
        try:
            q = self.broker.make_queue(
                self,
                name,
                bq,
                durable=durable,
                exclusive_owner=owner if exclusive else None,
                auto_delete=auto_delete,
                arguments=arguments,
            )
        except ValueError as exc:
            await bq.delete()
            raise ChannelError(PRECONDITION_FAILED, str(exc)) from None
        self.queues[name] = q
        self.exchanges[""].bind(Binding("", name, name))
        self.broker.apply_policies(q)
        self.broker.metadata_changed(persist=durable)
        q.touch()
        if durable:
            q.restore_deadlines()
        return q

    def _check_equivalent(
        self, q: Queue, *, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict[str, Any]
    ) -> None:
        """A re-declare of an existing queue must match it (RabbitMQ's PRECONDITION_FAILED otherwise)."""
        name = q.name
        if (
            q.durable != durable
            or (q.exclusive_owner is not None) != exclusive
            or q.auto_delete != auto_delete
        ):
            raise ChannelError(
                PRECONDITION_FAILED,
                f"inequivalent arg 'durable' for queue '{name}' in vhost '{self.name}': "
                f"received '{str(durable).lower()}' but current is '{str(q.durable).lower()}'",
            )
        for key in _QUEUE_ARGS_COMPARED:
            if arguments.get(key) != q.arguments.get(key):
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"inequivalent arg '{key}' for queue '{name}' in vhost '{self.name}': "
                    f"received {arguments.get(key)!r} but current is {q.arguments.get(key)!r}",
                )

    def _check_new_queue_args(self, name: str, arguments: dict[str, Any]) -> None:
        """The arguments a new queue is refused for, each with RabbitMQ's PRECONDITION_FAILED."""
        qtype = arguments.get("x-queue-type", "classic")
        if qtype != "classic":
            # RabbitMQ refuses what it does not implement; a quorum or stream queue quietly made classic
            # would promise a replication and durability model this broker does not give it.
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid arg 'x-queue-type' for queue '{name}' in vhost '{self.name}': queue type {qtype!r} "
                "is not supported by this broker (classic queues only; replicate them with an ha-mode policy)",
            )
        expires = arguments.get("x-expires")
        if expires is not None and (
            isinstance(expires, bool) or not isinstance(expires, int) or expires <= 0
        ):
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid arg 'x-expires' for queue '{name}' in vhost "
                f"'{self.name}': {expires!r} is not a positive integer (milliseconds)",
            )
        dlx = arguments.get("x-dead-letter-exchange")
        if dlx is not None and not isinstance(dlx, str):
            raise ChannelError(
                PRECONDITION_FAILED, f"invalid arg 'x-dead-letter-exchange' for queue '{name}'"
            )
        if "x-dead-letter-routing-key" in arguments and dlx is None:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid arg 'x-dead-letter-routing-key' for queue '{name}' in vhost '{self.name}': "
                "Key x-dead-letter-exchange should be present",
            )

    async def delete_queue(self, q: Queue, if_unused: bool = False, if_empty: bool = False) -> int:
        if if_unused and q.consumers:
            raise ChannelError(PRECONDITION_FAILED, f"queue '{q.name}' in vhost '{self.name}' in use")
        if if_empty and q.message_count():
            raise ChannelError(PRECONDITION_FAILED, f"queue '{q.name}' in vhost '{self.name}' is not empty")
        if self.queues.get(q.name) is q:
            del self.queues[q.name]
        for ex in self.exchanges.values():
            ex.unbind_queue(q.name)
        count = await q.delete()
        self.broker.metadata_changed(persist=q.durable)
        log.debug("deleted queue %r in vhost %r", q.name, self.name)
        return count

    def delete_queue_soon(self, q: Queue) -> None:
        """Auto-delete and exclusive cleanup happen outside the caller's flow (a consumer cancel, a close)."""
        self.broker.spawn(self.delete_queue(q))

    # -- bindings ------------------------------------------------------------------------
    def bind(self, queue: Queue, exchange: str, routing_key: str, arguments: dict[str, Any]) -> None:
        if exchange == "":
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        ex = self.get_exchange(exchange)
        ex.bind(Binding(exchange, queue.name, routing_key, dict(arguments or {})))
        self.broker.metadata_changed(persist=ex.durable and queue.durable)

    def unbind(self, queue: Queue, exchange: str, routing_key: str, arguments: dict[str, Any]) -> None:
        if exchange == "":
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        ex = self.get_exchange(exchange)
        if ex.unbind(Binding(exchange, queue.name, routing_key, dict(arguments or {}))):
            self.broker.metadata_changed(persist=ex.durable and queue.durable)

    def bind_exchange(
        self, destination: str, source: str, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        """An exchange-to-exchange binding: what ``source`` routes by it goes on through ``destination``."""
        if "" in (source, destination):
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        src, dst = self.get_exchange(source), self.get_exchange(destination)
        src.bind(Binding(source, exchange_destination(destination), routing_key, dict(arguments or {})))
        self.broker.metadata_changed(persist=src.durable and dst.durable)

    def unbind_exchange(
        self, destination: str, source: str, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        if "" in (source, destination):
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        src, dst = self.get_exchange(source), self.get_exchange(destination)
        if src.unbind(Binding(source, exchange_destination(destination), routing_key, dict(arguments or {}))):
            self.broker.metadata_changed(persist=src.durable and dst.durable)

    def bindings(self) -> list[Binding]:
        return [b for ex in self.exchanges.values() if ex.name != "" for b in ex.bindings.values()]

    # -- routing -------------------------------------------------------------------------
    def route(
        self, exchange: Exchange, routing_key: str, properties: commands.Basic.Properties
    ) -> list[Queue]:
        """The queues a publish reaches; what ``exchange`` cannot route goes to its alternate exchange.

        As RabbitMQ: the ``alternate-exchange`` argument (or policy key) names an
        exchange that gets, with the same routing key, every message the first one
        routes nowhere; it may have an alternate of its own, and a cycle ends the chain.
        """
        if exchange.name == "":
            q = self.queues.get(routing_key)
            return [q] if q is not None and not q.deleted else []
        tried: set[str] = set()
        ex: Exchange | None = exchange
        while ex is not None and ex.name not in tried:
            tried.add(ex.name)
            out = self._route_through(ex, routing_key, properties)
            if out:
                return out
            ae = ex.arguments.get("alternate-exchange") or self._policy_ae(ex.name)
            ex = self.exchanges.get(ae) if isinstance(ae, str) and ae else None
        return []

    def _route_through(
        self, exchange: Exchange, routing_key: str, properties: commands.Basic.Properties
    ) -> list[Queue]:
        """The queues reached from ``exchange``, following exchange-to-exchange bindings (each exchange once)."""
        found: dict[str, Queue] = {}
        seen = {exchange.name}
        todo = [exchange]
        while todo:
            ex = todo.pop()
            for dest in ex.route(routing_key, properties):
                xname = destination_exchange(dest)
                if xname is None:
                    q = self.queues.get(dest)
                    if q is not None and not q.deleted:
                        found[dest] = q
                elif xname not in seen and (nxt := self.exchanges.get(xname)) is not None:
                    seen.add(xname)
                    todo.append(nxt)
        return list(found.values())

    def _policy_ae(self, exchange: str) -> str | None:
        policy = self.broker.effective_policy(self.name, exchange, apply_to="exchanges")
        ae = (policy or {}).get("definition", {}).get("alternate-exchange")
        return ae if isinstance(ae, str) else None

    def dead_letter(self, message: Message, queue: str, reason: str, dlx: str, dlrk: str | None) -> None:
        """Republish to the dead-letter exchange with an x-death record, as RabbitMQ does."""
        ex = self.exchanges.get(dlx)
        if ex is None:
            return
        props = message.properties
        headers = dict(props.headers or {})
        previous = headers.get("x-death")
        deaths: list[Any] = list(previous) if isinstance(previous, list) else []
        deaths.insert(
            0,
            {
                "count": 1,
                "reason": reason,
                "queue": queue,
                "time": int(time.time()),
                "exchange": message.exchange,
                "routing-keys": [message.routing_key],
            },
        )
        headers["x-death"] = deaths
        headers.setdefault("x-first-death-reason", reason)
        headers.setdefault("x-first-death-queue", queue)
        headers.setdefault("x-first-death-exchange", message.exchange)
        new_props = copy_properties(props)
        new_props.headers = headers
        if reason == "expired":
            new_props.expiration = None
        rk = dlrk if dlrk is not None else message.routing_key
        dead = Message(dlx, rk, new_props, message.body)
        for q in self.route(ex, rk, new_props):
            if q.name == queue and reason != "rejected":
                continue  # a cycle without rejection would loop forever; RabbitMQ drops it
            q.enqueue(dead, None, None)

    # -- lifecycle -------------------------------------------------------------------------
    def owned_by(self, owner: object) -> list[Queue]:
        return [q for q in self.queues.values() if q.exclusive_owner is owner]

    def durable_queues(self) -> list[Queue]:
        return [q for q in self.queues.values() if q.durable]
