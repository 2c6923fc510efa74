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
  there is no delayed exchange, transactions where there are none) is refused with
  ``ScenarioError`` naming the field and what to do, never silently ignored. A factory that
  has a ``check_workload(workload)`` attribute (``workload_check`` below) is asked before the
  cluster starts, so the refusal comes before minutes of start-up and a matrix can mark the
  cell "not supported"; the factory refuses again when called, for callers that skip the check.
- Operations the protocol has no way to confirm are ``info``, not ``ok``: the checkers
  believe what the history says.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypedDict, TypeVar

from harness.spec.broker import HeldTotal
from harness.spec.errors import one_line
from harness.spec.history import Recorder
from harness.spec.scenario import ConsumerSection, DelaySection, WorkloadSection

#: ``(node, queue) -> (ready, unacked)``, ``HeldTotal(n)`` when the broker plugin can tell only the
#: total it holds, or None when it cannot tell.
QueueDepth = Callable[[str, str], Awaitable[tuple[int, int] | HeldTotal | None]]
QueueHolders = Callable[[str, str], Awaitable[list[dict[str, Any]] | None]]
"""(node, queue) -> what the broker lists as holding the queue's deliveries (``BrokerPlugin.queue_holders``)."""
NodeHoldings = Callable[[str, str], Awaitable[list[tuple[int | None, str]] | None]]
"""(node, queue) -> what the node's own copy holds (``BrokerPlugin.node_holdings``), off the event loop."""
QueueReplicas = Callable[[str, str], Awaitable[set[str] | None]]
"""(node, queue) -> the nodes the broker names as holding a copy (``BrokerPlugin.queue_replicas``)."""


@dataclass
class Endpoint:
    node: str
    host: str
    port: int
    #: The node's further client ports (``BrokerPlugin.extra_client_ports``): container port ->
    #: (host, port) of its client proxy.
    extra: dict[int, tuple[str, int]] = field(default_factory=dict)


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
    #: The broker plugin's ``queue_replicas``, likewise (None: the plugin cannot tell).
    queue_replicas: QueueReplicas | None


class Driver(Protocol):
    """What a protocol driver offers the scheduler.

    The final drain: ``drain_reader(process, queue)`` returns the protocol's read of one node
    per visit (``DrainReader``); the harness runs the rounds, the stop rule and the ``drain``
    op (``harness.drain``).
    """

    async def setup(self, queues: Sequence[str]) -> None: ...
    async def produce(self, process: str, queue: str, stop: asyncio.Event) -> None: ...
    async def consume(self, process: str, queue: str, stop: asyncio.Event) -> None: ...
    def drain_reader(self, process: str, queue: str) -> DrainReader: ...


@dataclass(frozen=True)
class NoCopy:
    """A drain visit's answer for a node that cannot serve reads of the queue (a replica that
    refuses consumes, a node that only forwards): it holds no copy the drain could empty, so
    the stop rule leaves it out. ``why`` says what the node answered. What such a node holds is
    still evidence: ``BrokerPlugin.node_holdings`` reports it after the drain.

    ``gone``: the answer came from the cluster, not from this node's own copy: the cluster says
    the queue does not exist (a metadata layer that lists no such queue, answered the same through
    any node). Other nodes may hold a copy while this one holds none; a queue that does not exist
    is held by none. A drain round in which every node answers so ends the drain complete with
    the queue gone (``harness.drain``): what was confirmed and never consumed is lost, and the
    checkers do not count that drain as the queue answering (it did not come back). A flag, not
    a class of its own, because such a node is still one that holds no copy to drain: every
    reader and the stop rule that handle ``NoCopy`` stay right, and only the end rule looks at
    ``gone``. Say ``gone`` only for an answer the whole cluster gives (never for one node's
    missing replica, a refused connection or a timeout, which say nothing about the others)."""

    why: str
    gone: bool = False


class DrainReader(Protocol):
    """One queue's final drain as a driver reads it: one node per visit. The harness visits every
    node in turn, round after round, until one full round finds every node that serves reads
    empty with nothing new consumed, or every node answers that the queue does not exist
    (``NoCopy.gone``), or ``workload.drain_timeout`` runs out (``harness.drain``), and records
    the ``drain`` op (``harness.spec.history``) with value ``{"consumed": n, "nodes": views(),
    "rounds": [...], **await extra()}``."""

    #: Acks the drain completed ``ok`` so far, over every visit.
    consumed: int

    async def visit(self, node: str, left: Callable[[], float]) -> bool | NoCopy:
        """Drain through ``node``: read and ack until it is idle, then ask it (the broker's own
        depth, ``queue_depth``) whether the queue is empty. True: empty; False: not (or the
        visit failed: the node's view keeps the error); ``NoCopy``: the node cannot serve
        reads of it (``NoCopy(why, gone=True)``: the cluster says the queue does not exist).
        ``left()`` is the drain's time left in seconds: stop before it runs out, and end a
        visit that makes no progress with False and an error rather than spend the whole time
        on one node, so the rounds go on to the others."""
        ...

    def views(self) -> dict[str, dict[str, Any]]:
        """What the drain saw per node: ``{node: {consumed, ready, unacked, empty_at_ns, error,
        ...}}`` (``error`` None once the node reported empty). Cheap: also read on cancellation."""
        ...

    async def extra(self) -> dict[str, Any]:
        """Whatever else the drain op's value shows that the protocol can tell (e.g. each
        server's own view of a stream, under ``replicas``; ``{OFFSETS: SPARSE}`` for a stream
        whose offsets are sparse, ``harness.spec.history``); ``{}`` for nothing."""
        ...

    # Optional: ``read(process, queue, stop)``, an ordered stream reader (``workload.readers``)
    # that records ``read`` ops (and ``seek`` before a restart from an offset) until ``stop``
    # and then until it has read to the stream's end; a driver without it refuses readers.


class DrainView(Protocol):
    """What a drain reader keeps per node, at the least (a dataclass: ``views()`` is its ``asdict``)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    consumed: int
    empty_at_ns: int | None
    error: str | None


class _Acks(Protocol):
    acked: int


V = TypeVar("V", bound=DrainView)
C = TypeVar("C")
S = TypeVar("S", bound=_Acks)


class NodeDrain(Generic[V]):
    """The part of a ``DrainReader`` every protocol does alike: a view per node, the acks counted
    on the node and over the drain, ``views()``, ``extra()`` with nothing more to tell, a node
    marked empty, and ``visit_with``: one visit's connect, read within the time left and close."""

    def __init__(self, nodes: Iterable[str], view: Callable[[], V]) -> None:
        self.node_views: dict[str, V] = {n: view() for n in nodes}
        self.consumed = 0

    def views(self) -> dict[str, dict[str, Any]]:
        return {n: asdict(v) for n, v in self.node_views.items()}

    async def extra(self) -> dict[str, Any]:
        return {}

    def count(self, view: V, acked: int) -> None:
        """``acked`` more acks completed through the node of ``view``."""
        view.consumed += acked
        self.consumed += acked

    @staticmethod
    def emptied(view: V, now_ns: int) -> bool:
        """The node reported the queue empty (the first time is kept): True, the visit's answer."""
        view.error = None
        if view.empty_at_ns is None:
            view.empty_at_ns = now_ns
        return True

    async def visit_with(
        self,
        view: V,
        left: Callable[[], float],
        *,
        connect: Callable[[], Awaitable[C]],
        session: Callable[[C], S],
        read: Callable[[C, S], Awaitable[bool | NoCopy]],
        close: Callable[[C], Awaitable[object]],
        errors: tuple[type[BaseException], ...],
        read_errors: tuple[type[BaseException], ...] | None = None,
        drain_timeout: float,
    ) -> bool | NoCopy:
        """Connect, ``read`` until the node is empty within the drain's time ``left()``, count the
        session's acks and close. A failure is the node's ``error`` and the answer False:
        ``errors`` connecting, ``read_errors`` (default ``errors``) reading, or the time out.
        Only the drain's own time running out is named so: a client library's timeout (often a
        ``TimeoutError`` too) raised inside ``read`` is that node's error, said as it was."""
        try:
            conn = await connect()
        except errors as exc:
            view.error = f"connect: {reason(exc)}"
            return False
        reading, caught = session(conn), errors if read_errors is None else read_errors
        budget = asyncio.timeout(max(0.1, left()))
        try:
            async with budget:
                return await read(conn, reading)
        except TimeoutError as exc:
            ran_out = budget.expired()
            view.error = (
                f"drain_timeout ({drain_timeout:g}s) ran out on this node" if ran_out else reason(exc)
            )
            return False
        except caught as exc:
            view.error = reason(exc)
            return False
        finally:
            self.count(view, reading.acked)
            await close(conn)


class _Nodes(Protocol):
    @property
    def nodes(self) -> Sequence[str]: ...


D = TypeVar("D", bound=_Nodes)


class DriverDrain(NodeDrain[V], Generic[D, V]):
    """A ``NodeDrain`` of one ``queue`` for ``process`` through a driver's own nodes: the driver
    is ``d``, the running event loop ``loop`` (its clock times the drain's idle spells)."""

    def __init__(self, driver: D, process: str, queue: str, view: Callable[[], V]) -> None:
        super().__init__(driver.nodes, view)
        self.d, self.process, self.queue = driver, process, queue
        self.loop = asyncio.get_running_loop()


class StreamEnd:
    """Where an ordered stream reader (``DrainReader``'s optional ``read``) stops: after ``stop``,
    once its reads have found nothing for ``idle`` seconds in a row; ``done`` is set then."""

    def __init__(self, stop: asyncio.Event, idle: float) -> None:
        self.stop, self.idle = stop, idle
        self.done = asyncio.Event()
        self.idle_since: float | None = None
        self.loop = asyncio.get_running_loop()

    def read(self, got: bool) -> bool:
        """One read's outcome (``got``: it found entries); whether the reader has reached the end."""
        if got:
            self.idle_since = None
        elif self.stop.is_set():
            now = self.loop.time()
            self.idle_since = now if self.idle_since is None else self.idle_since
            if now - self.idle_since >= self.idle:
                self.done.set()
        return self.done.is_set()


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


#: The longest ``reason`` (its exception's name aside).
REASON_CHARS = 200


def reason(exc: BaseException) -> str:
    """One line for the history's ``error`` column: the exception's name and its whole message
    on one line, shortened in the middle (``one_line``) so neither what failed nor why is lost."""
    detail = one_line(str(exc), REASON_CHARS)
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def record_event(
    recorder: Recorder,
    process: str,
    f: str,
    *,
    node: str | None,
    queue: str | None,
    value: str | None,
    detail: dict[str, Any],
    digest: str | None = None,
) -> None:
    """An op whose invoke and ``ok`` are one event (an ordered reader's ``read`` or ``seek``)."""
    recorder.invoke(process, f, node=node, queue=queue, value=value).ok(
        value=value, detail=detail, digest=digest
    )


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile (a client's back-off)."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass


async def close_quietly(closing: Awaitable[object], seconds: float) -> None:
    """Await a connection's close for at most ``seconds``, whatever it raises: closing a dead
    connection raises all kinds of things, and there is nothing left to do about it."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(seconds):
            await closing


async def acquired(window: asyncio.Semaphore, seconds: float) -> bool:
    """Whether a slot of a publisher's in-flight ``window`` was taken within ``seconds`` (False:
    every slot still waits on a confirm; the publisher looks at its stop and asks again)."""
    try:
        async with asyncio.timeout(seconds):
            await window.acquire()
    except TimeoutError:
        return False
    return True


async def reconnecting(
    nodes: Iterator[str],
    connect: Callable[[str], Awaitable[C]],
    close: Callable[[C], Awaitable[Any]],
    stop: asyncio.Event,
    *,
    errors: tuple[type[BaseException], ...],
    delay: float,
) -> AsyncGenerator[C, None]:
    """One connection at a time until ``stop``, each to the next of ``nodes`` (``node_rotation``):
    a connect failing with one of ``errors`` is retried after ``delay``; a connection is closed once
    the loop body is done with it, and the next one waits ``delay`` too."""
    while not stop.is_set():
        try:
            conn = await connect(next(nodes))
        except errors:
            await wait_or_stop(stop, delay)
            continue
        try:
            yield conn
        finally:
            await close(conn)
        if not stop.is_set():
            await wait_or_stop(stop, delay)


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


#: The exchange workload queues dead-letter through (``workload.dead_letter``): a direct exchange that
#: binds each dead-letter queue (``harness.spec.history.dead_letter_queue``) by its workload queue's name.
DEAD_LETTER_EXCHANGE = "brokerchaos.dead-letter"


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


def workload_check(factory: Any, workload: WorkloadSection) -> None:
    """Ask a client factory whether it can drive ``workload``: its ``check_workload(workload)``
    if it has one (raising ``ScenarioError``), nothing otherwise."""
    check = getattr(factory, "check_workload", None)
    if callable(check):
        check(workload)


class DriverBase:
    """What every driver keeps of the harness's call (``factory(endpoints, recorder, **options)``,
    the options of ``DriverOptions``) and works out from it the same way: the nodes in order,
    where each process goes first and next, which consumers are slow. A driver reads what its
    protocol uses from these attributes; building on it is a convenience, not part of the
    contract."""

    def __init__(
        self,
        endpoints: Mapping[str, Endpoint],
        recorder: Recorder,
        *,
        workload: WorkloadSection,
        seed: int = 0,
        first_node: Mapping[str, str] | None = None,
        username: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        queue_arguments: Mapping[str, Any] | None = None,
        client_settings: Mapping[str, Any] | None = None,
        queue_depth: QueueDepth | None = None,
        queue_holders: QueueHolders | None = None,
        queue_replicas: QueueReplicas | None = None,
        **_: Any,
    ) -> None:
        self.endpoints = dict(endpoints)
        self.nodes = list(self.endpoints)
        self.recorder = recorder
        self.w = workload
        self.seed = seed  # bodies are message_body(id, seed, size): a consumer can check what it got
        self.first_node = dict(first_node or {})
        self.username, self.password, self.vhost = username, password, vhost
        self.queue_arguments = dict(queue_arguments or {})
        self.client_settings = dict(client_settings or {})
        self.queue_depth = queue_depth
        self.queue_holders = queue_holders
        self.queue_replicas = queue_replicas
        self.slow = slow_consumers(workload.consumer, workload.consumers, seed)

    def rotation(self, process: str) -> itertools.cycle[str]:
        """The nodes ``process`` goes through, from its first (``node_rotation``)."""
        return node_rotation(self.nodes, self.first_node.get(process))

    def behaviour(self, process: str, now: float) -> Behaviour:
        """When consumer ``process`` gives deliveries back, slow or not as the seed drew it."""
        return Behaviour(self.w.consumer, self.seed, process, slow=process in self.slow, now=now)


class Closing(Protocol):
    """A driver's connection to one node: it closes itself."""

    async def close(self) -> Any: ...


CC = TypeVar("CC", bound=Closing)


async def _closed(conn: Closing) -> None:
    await conn.close()


class ConnectingDriver(DriverBase, Generic[CC]):
    """A driver whose processes hold one connection at a time (``connections``) and whose setup
    acts through the first node that answers (``on_first_answering``), both ways over its own
    ``connect`` and the failures its broker's client raises (``broker_errors``)."""

    broker_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    reconnect_delay: ClassVar[float] = 0.5  # seconds between one connection and the next

    async def connect(self, node: str) -> CC:
        raise NotImplementedError

    def connections(self, process: str, stop: asyncio.Event) -> AsyncGenerator[CC, None]:
        """One connection at a time until ``stop``, each through the next node of the process's
        rotation (``reconnecting``); a connection is closed once the loop body is done with it."""
        return reconnecting(
            self.rotation(process),
            self.connect,
            _closed,
            stop,
            errors=self.broker_errors,
            delay=self.reconnect_delay,
        )

    async def on_first_answering(
        self,
        act: Callable[[CC], Awaitable[Any]],
        *,
        what: str,
        rounds: int = 1,
        errors: tuple[type[BaseException], ...] = (),
    ) -> None:
        """``act`` through the first node that answers (``through_first_answering``); ``errors``:
        more that move on to the next node besides the broker's."""
        await through_first_answering(
            self.nodes,
            self.connect,
            _closed,
            act,
            errors=(*self.broker_errors, *errors),
            what=what,
            rounds=rounds,
        )


async def through_first_answering(
    nodes: Sequence[str],
    connect: Callable[[str], Awaitable[C]],
    close: Callable[[C], Awaitable[Any]],
    act: Callable[[C], Awaitable[Any]],
    *,
    errors: tuple[type[BaseException], ...],
    what: str,
    rounds: int = 1,
    pause: float = 1.0,
) -> None:
    """``act`` on a connection to the first of ``nodes`` that answers (a driver's ``setup``): a
    connect or an ``act`` failing with one of ``errors`` moves on to the next node; after
    ``rounds`` passes over them, ``pause`` seconds apart, ``ConnectionError`` says ``what`` was
    not done and the last reason."""
    last: BaseException | None = None
    for attempt in range(rounds):
        if attempt:
            await asyncio.sleep(pause)
        for node in nodes:
            try:
                conn = await connect(node)
            except errors as exc:
                last = exc
                continue
            try:
                await act(conn)
                return
            except errors as exc:
                last = exc
            finally:
                await close(conn)
    raise ConnectionError(f"{what}: {reason(last) if last else '?'}")


class DrainUnfinished(Exception):
    """The drain could not see every node empty in time (recorded as an ``info`` drain)."""

    def __init__(self, consumed: int, why: str) -> None:
        super().__init__(f"unfinished after consuming {consumed}: {why}")
        self.consumed = consumed


class ThreadBridge:
    """A thread-based client library inside the asyncio driver (most STOMP, MQTT and JMS clients:
    blocking calls, and callbacks on the library's own receiver thread).

    ``call`` runs a blocking call (connect, send, subscribe) on a worker thread, bounded by a
    timeout, so the event loop goes on meanwhile; a call still blocked when its time runs out
    goes on in its thread, and its outcome is the caller's ``TimeoutError`` (an ``info``). A
    reply the library reports through a callback (a STOMP receipt, an MQTT PUBACK) is awaited
    with ``expect(key)`` and delivered from the library's thread with ``resolve(key, value)``
    or ``fail(key, exc)``; a lost connection fails every awaited reply at once (``fail_all``).
    Deliveries pushed from the library's thread go through a ``ThreadQueue``. Create it on the
    event loop's thread (it keeps the running loop).
    """

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._waiting: dict[str, asyncio.Future[Any]] = {}

    async def call(self, fn: Callable[..., Any], *args: Any, timeout: float, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on a worker thread; ``TimeoutError`` after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            return await asyncio.to_thread(fn, *args, **kwargs)

    def expect(self, key: str) -> asyncio.Future[Any]:
        """A future the library's callback settles with ``resolve``/``fail`` for ``key``."""
        fut = self.loop.create_future()
        self._waiting[key] = fut
        return fut

    def forget(self, key: str) -> None:
        """Stop waiting for ``key`` (its awaiter gave up); a late reply is then dropped."""
        self._waiting.pop(key, None)

    def resolve(self, key: str, value: Any = None) -> None:
        """From any thread: the reply for ``key`` arrived."""
        self._threadsafe(self._settle, key, value, None)

    def fail(self, key: str, exc: BaseException) -> None:
        """From any thread: the request ``key`` was refused (an error frame naming it)."""
        self._threadsafe(self._settle, key, None, exc)

    def fail_all(self, exc: BaseException) -> None:
        """From any thread: the connection is gone, so no awaited reply will come."""
        self._threadsafe(self._fail_all, exc)

    def queue(self) -> ThreadQueue:
        """A queue the library's thread puts into and the driver awaits."""
        return ThreadQueue(self)

    def _threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the run is over, nobody awaits the reply
            pass

    def _settle(self, key: str, value: Any, exc: BaseException | None) -> None:
        fut = self._waiting.pop(key, None)
        if fut is None or fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)

    def _fail_all(self, exc: BaseException) -> None:
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(exc)


class ThreadQueue:
    """What a library's thread hands the event loop, in order (``ThreadBridge.queue``)."""

    def __init__(self, bridge: ThreadBridge) -> None:
        self._bridge = bridge
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def put(self, item: Any) -> None:
        """From any thread."""
        self._bridge._threadsafe(self._queue.put_nowait, item)

    async def get(self, timeout: float) -> Any:
        """The next item; ``TimeoutError`` if none comes within ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            return await self._queue.get()

    def empty(self) -> bool:
        return self._queue.empty()
