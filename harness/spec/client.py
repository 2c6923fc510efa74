"""The client contract: what a workload driver for one wire protocol offers the scheduler.

A client plugin registers a factory per protocol (``register.add_client``); a broker
plugin names the protocol it speaks (``BrokerPlugin.protocol``) and so the driver it
needs. The harness calls the factory as ``factory(endpoints, recorder, **options)``:

- ``endpoints``: ``{node: Endpoint}``, each node's client port as the harness reaches it,
  through that node's client proxy (a partition that cuts a client link cuts this one);
- ``recorder``: the run's history writer (``harness.spec.history.Recorder``; that module
  says what each operation records);
- ``options``: the keyword options of ``DriverOptions`` below, every one always given. A
  factory that also accepts unknown ones (``**_``) keeps working when an option is added.

It returns a ``Driver``. Three things the harness cannot check for a client plugin:

- Its Python dependencies (the protocol's client library) are imported in the harness's own
  process, so they must be installed where brokerchaos runs (the plugin distribution's
  dependencies); an ``ImageRecipe``'s ``python_packages`` go into the broker's image only.
- A scenario asking for a workload feature the protocol lacks (a delayed publish where
  there is no delayed exchange, transactions where there are none) is refused by the
  factory with ``ScenarioError`` naming the field and what to do, never silently ignored.
- Operations the protocol has no way to confirm are ``info``, not ``ok``: the checkers
  believe what the history says.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

from harness.spec.scenario import ConsumerSection, DelaySection, WorkloadSection

#: ``(node, queue) -> (ready, unacked)``, or None when the broker plugin cannot tell.
QueueDepth = Callable[[str, str], Awaitable[tuple[int, int] | None]]
QueueHolders = Callable[[str, str], Awaitable[list[dict[str, Any]] | None]]
"""(node, queue) -> what the broker lists as holding the queue's deliveries (``BrokerPlugin.queue_holders``)."""
NodeHoldings = Callable[[str, str], Awaitable[list[tuple[int | None, str]] | None]]
"""(node, queue) -> what the node's own copy holds (``BrokerPlugin.node_holdings``), off the event loop."""


@dataclass
class Endpoint:
    node: str
    host: str
    port: int


class DriverOptions(TypedDict):
    """The keyword options every client factory is called with (``factory(endpoints, recorder,
    **options)``). Broker-side values come from the broker plugin's attributes and hooks
    (``harness.spec.broker.BrokerPlugin``), so a client never needs to know which broker it
    talks to; the rest from the scenario and the run."""

    #: The scenario's workload section: rates, sizes, consumer behaviour, drain timing.
    workload: WorkloadSection
    #: The scenario's seed (message bodies, consumer behaviour, delays are drawn from it).
    seed: int
    #: Which node each producer (``p1``..) and consumer (``c1``..) connects to first.
    first_node: Mapping[str, str]
    #: ``BrokerPlugin.username`` / ``password``: the credentials the workload logs in with.
    username: str
    password: str
    #: ``BrokerPlugin.vhost``: AMQP's virtual host; a protocol without one ignores it.
    vhost: str
    #: ``BrokerPlugin.queue_arguments(settings)``: AMQP's ``queue.declare`` arguments (a queue type).
    queue_arguments: dict[str, Any]
    #: ``BrokerPlugin.client_settings(settings)``: whatever else of the broker's settings the
    #: client must act on, in the client's own terms (a stream's replica count, how many
    #: replicas a write waits for, where to ask for the current primary).
    client_settings: dict[str, Any]
    #: The broker plugin's ``queue_depth``, awaitable and off the event loop (None: not given).
    queue_depth: QueueDepth | None
    #: The broker plugin's ``queue_holders``, likewise.
    queue_holders: QueueHolders | None


class Driver(Protocol):
    """What a protocol driver offers the scheduler.

    The final drain: a driver offers ``drain_reader(process, queue) -> DrainReader`` (its
    protocol's read of one node per visit; the harness runs the rounds, the stop rule and the
    ``drain`` op), or, as the drivers written before it do, ``drain(process, queue) -> int``
    doing all of it itself with ``drain_rounds``. The harness prefers ``drain_reader``.
    """

    async def setup(self, queues: Sequence[str]) -> None: ...
    async def produce(self, process: str, queue: str, stop: asyncio.Event) -> None: ...
    async def consume(self, process: str, queue: str, stop: asyncio.Event) -> None: ...
    async def drain(self, process: str, queue: str) -> int: ...


@dataclass(frozen=True)
class NoCopy:
    """A drain visit's answer for a node that cannot serve reads of the queue (a replica that
    refuses consumes, a node that only forwards): it holds no copy the drain could empty, so
    the stop rule leaves it out. ``why`` says what the node answered. What such a node holds is
    still evidence: ``BrokerPlugin.node_holdings`` reports it after the drain."""

    why: str


class DrainReader(Protocol):
    """One queue's final drain as a driver reads it: one node per visit. The harness visits every
    node in turn, round after round, until one full round finds every node that serves reads
    empty with nothing new consumed (``drain_rounds``), or ``workload.drain_timeout`` runs out,
    and records the ``drain`` op (``harness.spec.history``)."""

    #: Acks the drain completed ``ok`` so far, over every visit.
    consumed: int

    async def visit(self, node: str, left: Callable[[], float]) -> bool | NoCopy:
        """Drain through ``node``: read and ack until it is idle, then ask it (the broker's own
        depth, ``queue_depth``) whether the queue is empty. True: empty; False: not (or the
        visit failed: keep the node's error for ``errors``); ``NoCopy``: the node cannot serve
        reads of it. ``left()`` is the drain's time left in seconds: stop before it runs out."""
        ...

    def errors(self) -> Mapping[str, str | None]:
        """Each node's last error (None once it reported empty)."""
        ...

    async def value(self) -> dict[str, Any]:
        """The drain op's value but for ``consumed`` and ``rounds`` (the harness adds those):
        ``nodes`` = ``{node: {consumed, ready, unacked, empty_at_ns, error, ...}}`` and whatever
        else the protocol can show (e.g. each server's own view of a stream)."""
        ...


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
    visit: Callable[[str], Awaitable[bool | NoCopy]],
    consumed: Callable[[], int],
    left: Callable[[], float],
    pause: float,
    on_round: Callable[[list[str]], None] | None = None,
) -> DrainEnd:
    """A drain's rounds: visit every node in turn until one full round finds every node empty
    and consumes nothing new, or the time ``left`` runs out. ``visit`` drains through one node
    and says whether that node reported the queue empty, or that it holds no copy to drain
    (``NoCopy``: left out of the rule, but a round in which no node at all served reads is not
    an empty one); ``on_round`` hears after each round (also one the time cut short) which
    nodes reported empty, so the drain can record every round: a queue that does not answer is
    tried again round after round, and one that comes back late within the time is drained then."""
    while True:
        before = consumed()
        every_empty = True
        empty: list[str] = []
        for i, node in enumerate(nodes):
            if left() <= 0:
                if on_round is not None:
                    on_round(empty)
                return DrainEnd(False, tuple(nodes[i:]))
            got = await visit(node)
            if isinstance(got, NoCopy):
                continue
            if got:
                empty.append(node)
            else:
                every_empty = False
        if on_round is not None:
            on_round(empty)
        if every_empty and empty and consumed() == before:
            return DrainEnd(True)
        if left() <= 0:
            return DrainEnd(False)
        if not every_empty or not empty:
            await asyncio.sleep(min(pause, max(0.0, left())))
