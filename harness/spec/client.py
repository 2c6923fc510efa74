"""The client contract: what a workload driver for one wire protocol offers the scheduler.

A client plugin registers a factory per protocol (``register.add_client``); a broker
plugin names the protocol it speaks (``BrokerPlugin.protocol``) and so the driver it
needs. The factory is called as ``factory(endpoints, recorder, first_node=...,
**options)`` with ``endpoints`` a ``{node: Endpoint}`` of the client ports through the
proxies, ``recorder`` the run's history writer (``harness.spec.history`` says what
each operation records) and ``options`` from ``driver_options`` (credentials, the
scenario's workload section, the seed, ``queue_depth``). It returns a ``Driver``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.spec.scenario import ConsumerSection, DelaySection

#: ``(node, queue) -> (ready, unacked)``, or None when the broker plugin cannot tell.
QueueDepth = Callable[[str, str], Awaitable[tuple[int, int] | None]]
QueueHolders = Callable[[str, str], Awaitable[list[dict[str, Any]] | None]]
"""(node, queue) -> what the broker lists as holding the queue's deliveries (``BrokerPlugin.queue_holders``)."""


@dataclass
class Endpoint:
    node: str
    host: str
    port: int
    #: The node's further client ports (``BrokerPlugin.extra_client_ports``): container port ->
    #: (host, port) of its client proxy.
    extra: dict[int, tuple[str, int]] = field(default_factory=dict)


class Driver(Protocol):
    """What a protocol driver offers the scheduler."""

    async def setup(self, queues: Sequence[str]) -> None: ...
    async def produce(self, process: str, queue: str, stop: asyncio.Event) -> None: ...
    async def consume(self, process: str, queue: str, stop: asyncio.Event) -> None: ...
    async def drain(self, process: str, queue: str) -> int: ...


class RateLimiter:
    """Evenly spaced permits at ``rate`` per second (0 = unlimited); no catch-up bursts."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next = time.monotonic()

    async def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        if self.next > now:
            await asyncio.sleep(self.next - now)
            self.next += self.interval
        else:
            self.next = now + self.interval


def reason(exc: BaseException) -> str:
    """One line for the history's ``error`` column."""
    text = str(exc).strip().splitlines()
    detail = text[0][:160] if text else ""
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile (a client's back-off)."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


class Behaviour:
    """When one consumer gives deliveries back. Seeded by the scenario's seed and the consumer's
    name, with each gap drawn from [0.5, 1.5] of its mean so consumers do not act in step."""

    def __init__(self, section: ConsumerSection, seed: int, process: str, *, slow: bool, now: float) -> None:
        self.rng = random.Random(f"{seed}:{process}")
        self.requeue = section.requeue
        self.slow_ack = section.slow_ack_ms / 1000 if slow else 0.0
        every = {"recover": section.recover_every, "close": section.close_every, "crash": section.crash_every}
        self.every = {k: v for k, v in every.items() if v > 0}
        self.due = {k: now + self._gap(k) for k in self.every}

    @classmethod
    def none(cls) -> Behaviour:
        return cls(ConsumerSection(), 0, "", slow=False, now=0.0)

    def _gap(self, kind: str) -> float:
        return self.every[kind] * self.rng.uniform(0.5, 1.5)

    def next(self) -> tuple[str | None, float]:
        if not self.due:
            return None, math.inf
        kind = min(self.due, key=lambda k: self.due[k])
        return kind, self.due[kind]

    def done(self, kind: str, now: float) -> None:
        self.due[kind] = now + self._gap(kind)


#: The exchange a driver routes delayed publishes through; it binds every workload queue by its own name.
DELAYED_EXCHANGE = "brokerchaos.delayed"


class Delays:
    """Which of one producer's publishes are delayed, and by how much (``workload.delay``).

    Seeded by the scenario's seed and the producer's name, so a rerun delays the same
    sequence numbers by the same amounts. A driver records the delay it asked for in the
    publish invoke's ``detail`` as ``{"delay_ms": n}`` (``harness.spec.history``).
    """

    def __init__(self, section: DelaySection | None, seed: int, process: str) -> None:
        self.section = section
        self.rng = random.Random(f"{seed}:{process}:delay")

    def next(self) -> int | None:
        """The delay in milliseconds for the next publish, or None to publish it undelayed."""
        d = self.section
        if d is None or self.rng.random() >= d.share:
            return None
        return self.rng.randint(d.min_ms, d.max_ms)


def slow_consumers(section: ConsumerSection, consumers: int, seed: int) -> set[str]:
    """Which of ``c1..cN`` are slow: ``section.slow`` of them, drawn from the seed."""
    names = [f"c{i}" for i in range(1, consumers + 1)]
    return set(random.Random(f"{seed}:slow").sample(names, min(section.slow, len(names))))


def node_rotation(nodes: Sequence[str], first: str | None) -> itertools.cycle[str]:
    """The nodes in turn from ``first``: where a client goes next after a failure."""
    nodes = list(nodes)
    i = nodes.index(first) if first in nodes else 0
    return itertools.cycle(nodes[i:] + nodes[:i])


def drain_order(nodes: list[str], rotation: Iterator[str]) -> list[str]:
    """Every node once, starting where the drainer's rotation starts."""
    return [next(rotation) for _ in nodes]


class DrainUnfinished(Exception):
    """The drain could not see every node empty in time (recorded as an ``info`` drain)."""

    def __init__(self, consumed: int, why: str) -> None:
        super().__init__(f"unfinished after consuming {consumed}: {why}")
        self.consumed = consumed


@dataclass(frozen=True)
class DrainEnd:
    """How a drain's rounds ended: ``empty`` when one full round found every node empty and
    consumed nothing new; otherwise ``unreached`` holds the nodes the last round did not get
    to before the time ran out."""

    empty: bool
    unreached: tuple[str, ...] = ()

    def why(self, queue: str, timeout: float, errors: Mapping[str, str | None]) -> str:
        """The one line an unfinished drain records: every node's error, and every node the
        time ran out before (so a node that was never reached is named, not left out)."""
        parts = [f"{n}: {e}" for n, e in errors.items() if e]
        parts += [
            f"{n}: the time ran out before the drain reached it" for n in self.unreached if not errors.get(n)
        ]
        return f"not every node reported {queue} empty within {timeout:g}s" + (
            ": " + "; ".join(parts) if parts else ""
        )


MAX_ROUNDS = 100
"""A drain op's value records at most this many rounds: the first ones and the last."""


def add_round(
    rounds: list[dict[str, Any]],
    now_ns: int,
    consumed: int,
    empty: list[str],
    errors: Mapping[str, str | None],
) -> None:
    """Append one round as a drain op's value records it (``harness.spec.results.DrainRound``),
    keeping the first MAX_ROUNDS - 1 rounds and the last."""
    rounds[MAX_ROUNDS - 1 :] = []
    rounds.append(
        {
            "end_ns": now_ns,
            "consumed": consumed,
            "empty": list(empty),
            "errors": {n: e for n, e in errors.items() if e and n not in empty},
        }
    )


async def drain_rounds(
    nodes: Sequence[str],
    visit: Callable[[str], Awaitable[bool]],
    consumed: Callable[[], int],
    left: Callable[[], float],
    pause: float,
    on_round: Callable[[list[str]], None] | None = None,
) -> DrainEnd:
    """A drain's rounds: visit every node in turn until one full round finds every node empty
    and consumes nothing new, or the time ``left`` runs out. ``visit`` drains through one node
    and says whether that node reported the queue empty; ``on_round`` hears after each round
    (also one the time cut short) which nodes did, so the drain can record every round: a queue
    that does not answer is tried again round after round, and one that comes back late within
    the time is drained then."""
    while True:
        before = consumed()
        every_empty = True
        empty: list[str] = []
        for i, node in enumerate(nodes):
            if left() <= 0:
                if on_round is not None:
                    on_round(empty)
                return DrainEnd(False, tuple(nodes[i:]))
            if await visit(node):
                empty.append(node)
            else:
                every_empty = False
        if on_round is not None:
            on_round(empty)
        if every_empty and consumed() == before:
            return DrainEnd(True)
        if left() <= 0:
            return DrainEnd(False)
        if not every_empty:
            await asyncio.sleep(min(pause, max(0.0, left())))
