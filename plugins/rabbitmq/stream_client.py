"""The RabbitMQ stream protocol workload driver (client plugin ``rabbitmq-stream``), on ``rstream``.

``rstream``'s low-level ``Client`` speaks the protocol (framing, SASL, publish, subscribe,
offset tracking); this driver chooses every node itself and reaches it through that node's
client proxy. The servers advertise their node names (``stream.advertised_host``), and the
stream's metadata (leader and replicas) is mapped from those names to the proxies, never
dialled directly: rstream's own pool (or its ``load_balancer_mode``) would dial the advertised
address or loop through one address until it lands on the leader.

One stream per workload queue (created by the first node that answers, ``initial-cluster-size``
from ``client_settings["replicas"]``, every node by default). What the history records
(``harness.spec.history``), in stream terms:

- ``publish``: one message from a publisher declared on the stream's leader (found from the
  metadata of whichever node the producer reached, then dialled through the leader's proxy);
  ``ok`` = the stream's publish confirm (RabbitMQ confirms once a quorum of the stream's
  replicas has written the entry), ``fail`` = a publish error naming the publishing id,
  ``info`` = no answer within ``confirm_timeout`` or the connection lost. The confirm does not
  carry the entry's offset, so a publish ``ok`` has none.
- ``consume``: an entry a consumer read (``detail.stream_seq`` = the entry's stream offset),
  through any node (a node serves reads from its own replica). The workload's consumers are one
  group under RabbitMQ's single active consumer for streams: each subscribes with the
  ``single-active-consumer`` property and the group's name (``brokerchaos``, also the reference
  its offsets are stored under); the broker keeps one of them active and, when it goes (its
  connection closed or lost), activates the next. Nothing is dispatched to a consumer before
  the broker's consumer update says it is active; the driver then answers with where to start:
  after the offset stored under the group's name (or the first entry when none is stored). The
  consumers share the work over time (the active one does it, a standby takes over on failure),
  not side by side: that is what RabbitMQ offers on one stream (super streams partition the work
  over several streams, a different topology from the other rows' one queue).
- ``seek``: a consumer activated where an offset was stored resumes after it: recorded as the
  consumer's ``seek`` to that offset + 1 (``detail.stored_offset``, ``detail.single_active``),
  before its first ``consume``. What it reads again (entries the previous active consumer was
  sent but whose offset was not yet stored) are deliveries marked ``redelivered``: the checkers
  grade them as duplicates or unconfirmed acks, never as loss.
- ``ack``: the stream's consumer acknowledgement is offset tracking: after each chunk the
  consumer stores its last offset under the reference and asks for it back; ``ok`` once the
  node answers an offset at or past it, ``info`` otherwise.
- ``read``/``seek``: ordered readers (``workload.readers``) read the stream from the first
  entry; after a failure they subscribe again through the next node from the offset after the
  last one read, recorded as a ``seek``.
- ``drain``: through every node, the whole stream from its first entry until the node has
  sent nothing for ``drain_idle``: each entry no consumer acked is recorded as consumed (a
  stream keeps what is read, so the drain's read is its consumption and its ``ack`` is ``ok``
  at once). The node's copy as read (entries, first and last offset) is the drain's
  ``replicas`` view for the replica comparison; the offsets are ``sparse`` (a stream's offsets
  also count chunks no consumer is sent, such as offset-tracking records).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rstream import exceptions as rexc
from rstream import schema
from rstream.client import Client
from rstream.constants import OffsetType
from rstream.schema import OffsetSpecification

from harness import ClusterError, ScenarioError, hookimpl
from harness.spec import (
    Endpoint,
    Invocation,
    RateLimiter,
    Recorder,
    WorkloadSection,
    body_digest,
    message_body,
)
from harness.spec.client import (
    ConnectingDriver,
    NoCopy,
    StreamEnd,
    acquired,
    close_quietly,
    reason,
    record_event,
)
from harness.spec.history import OFFSETS, SEEK, SPARSE

REFERENCE = "brokerchaos"  # the consumers' group name: their single-active-consumer name and offset reference
PUBLISHER_ID = 1
SUBSCRIPTION_ID = 1
CONNECT_TIMEOUT = 5.0
OP_TIMEOUT = 5.0
FRAME_MAX = 1_048_576
HEARTBEAT = 5
CREDIT = 8  # chunks in flight per subscription
RECONNECT_DELAY = 0.5
ROTATE_AFTER = 5.0  # a consumer that got nothing for this long tries the next node
STANDBY_ROTATE_AFTER = 20.0  # a standby (not active) consumer moves on after this long on one node

#: What a broker round trip raises when the broker, the network or the connection fails.
BROKER_ERRORS = (rexc.ServerError, OSError, TimeoutError, ConnectionError, asyncio.IncompleteReadError)


def entry_id(data: bytes) -> str:
    """The id the producer put at the head of the body (``id|check|payload``)."""
    return bytes(data).split(b"|", 1)[0].decode(errors="replace")


@dataclass
class _Conn:
    node: str
    client: Client
    closed: asyncio.Event

    @property
    def alive(self) -> bool:
        return (
            self.client.is_connection_alive() and not self.closed.is_set() and self.reader_failure() is None
        )

    def reader_failure(self) -> str | None:
        """Why the client's frame reader stopped, if it did. rstream's reader ends on a frame it
        cannot decode (a chunk whose CRC does not match: ``ValueError: Invalid checksum``) without
        closing the connection or calling its closed handler, so the connection still looks alive
        while nothing more is read from it. rstream keeps no public handle on that task."""
        task = self.client._tasks.get("listener")
        if task is None or not task.done() or task.cancelled():
            return None
        exc = task.exception()
        if exc is None:
            return None
        # rstream wraps the check that failed: "Could not decode <Deliver>" from "Invalid checksum".
        return reason(exc) + (f" ({reason(exc.__cause__)})" if exc.__cause__ is not None else "")

    async def close(self) -> None:
        await close_quietly(self.client.close(), 3.0)


class _Subscription:
    """One subscription's entries, in order, as (offset, body) from a queue the handler fills.

    With a ``group``, the subscription joins that single-active-consumer group: nothing comes
    until the broker's consumer update activates it, answered by ``activation``."""

    def __init__(self, conn: _Conn, start: int | None, group: str | None = None) -> None:
        self.conn = conn
        self.start = start
        self.group = group
        self.active = group is None
        #: Asked when the broker activates the subscription: the offset stored for the group (None: none).
        self.activation: Callable[[], Awaitable[int | None]] | None = None
        self.entries: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self._answers: set[asyncio.Task[None]] = set()

    async def open(self, stream: str) -> None:
        client = self.conn.client
        client.add_handler(schema.Deliver, self._on_deliver, name=str(SUBSCRIPTION_ID))
        if self.group is not None:
            client.add_handler(schema.ConsumerUpdateResponse, self._on_update, name=str(SUBSCRIPTION_ID))
        await client.run_queue_listener_task(SUBSCRIPTION_ID, self._on_deliver)
        spec = (
            schema.OffsetSpec.from_params(OffsetType.FIRST, None)
            if self.start is None
            else schema.OffsetSpec.from_params(OffsetType.OFFSET, self.start)
        )
        props = None if self.group is None else sac_properties(self.group)
        async with asyncio.timeout(OP_TIMEOUT):
            await client.subscribe(stream, SUBSCRIPTION_ID, spec, initial_credit=CREDIT, properties=props)

    def _on_update(self, frame: schema.ConsumerUpdateResponse) -> None:
        """The broker's consumer update (activated, or stepped down): answered from a task of its
        own, since the answer needs a round trip the connection's frame reader must serve."""
        if frame.subscription_id != SUBSCRIPTION_ID:
            return
        task = asyncio.create_task(self._answer(frame.correlation_id, bool(frame.active)))
        self._answers.add(task)
        task.add_done_callback(self._answers.discard)

    async def _answer(self, correlation_id: int, active: bool) -> None:
        if not active:  # stepped down: the offset is ignored, but the protocol wants one
            self.active = False
            await self.conn.client.consumer_update(correlation_id, OffsetSpecification(OffsetType.NEXT, 0))
            return
        stored: int | None = None
        try:
            if self.activation is not None:
                stored = await self.activation()
        except Exception:  # noqa: BLE001 - where to start is unknown: drop the connection, rejoin
            self.conn.closed.set()
            return
        self.start = None if stored is None else stored + 1
        await self.conn.client.consumer_update(correlation_id, resume_spec(stored))
        self.active = True

    async def _on_deliver(self, frame: schema.Deliver) -> None:
        if frame.subscription_id != SUBSCRIPTION_ID:
            return
        await self.conn.client.credit(SUBSCRIPTION_ID, 1)
        for i, data in enumerate(frame.get_messages()):
            offset = frame.chunk_first_offset + i
            if self.start is None or offset >= self.start:  # a chunk may begin before the asked offset
                self.entries.put_nowait((offset, bytes(data)))

    async def batch(self, wait: float) -> list[tuple[int, bytes]]:
        """What arrived, waiting up to ``wait`` seconds for the first; [] if nothing came."""
        try:
            async with asyncio.timeout(wait):
                got = [await self.entries.get()]
        except TimeoutError:
            return []
        while not self.entries.empty():
            got.append(self.entries.get_nowait())
        return got


class StreamDriver(ConnectingDriver[_Conn]):
    broker_errors = BROKER_ERRORS
    reconnect_delay = RECONNECT_DELAY

    #: What a stream cannot do, refused before the cluster starts (``workload_check``).
    @staticmethod
    def check_workload(w: WorkloadSection) -> None:
        refuse_unsupported(w)

    def __init__(self, endpoints: Mapping[str, Endpoint], recorder: Recorder, **options: Any) -> None:
        super().__init__(endpoints, recorder, **options)
        refuse_unsupported(self.w)
        self.replicas = int(self.client_settings.get("replicas") or len(self.nodes))
        self.acked: set[str] = set()  # ids some consumer's stored offset covers (ack ok)
        self.highest: dict[str, int] = {}  # per stream, the highest offset any consumer was sent

    # -- connections ----------------------------------------------------------------------

    async def connect(self, node: str) -> _Conn:
        ep = self.endpoints[node]
        closed = asyncio.Event()

        async def on_closed(_info: Any) -> None:
            closed.set()

        client = Client(
            ep.host,
            ep.port,
            frame_max=FRAME_MAX,
            heartbeat=HEARTBEAT,
            connection_name=f"brokerchaos-{node}",
            connection_closed_handler=on_closed,
        )
        client.add_stream("-")  # rstream calls the closed handler only for clients that carry a stream
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await client.start()
                await client.authenticate(self.vhost, self.username, self.password)
        except BaseException:
            await _Conn(node, client, closed).close()
            raise
        return _Conn(node, client, closed)

    async def leader(self, conn: _Conn, stream: str) -> str | None:
        """The node the stream's metadata (as ``conn``'s node tells it) names as its leader."""
        async with asyncio.timeout(OP_TIMEOUT):
            lead, _replicas = await conn.client.query_leader_and_replicas(stream)
        return lead.host if lead.host in self.endpoints else None

    async def setup(self, queues: Sequence[str]) -> None:
        """Create each queue's stream through the first node that answers."""

        async def create(conn: _Conn) -> None:
            for q in queues:
                async with asyncio.timeout(OP_TIMEOUT * 3):
                    if not await conn.client.stream_exists(q):
                        await conn.client.create_stream(q, {"initial-cluster-size": self.replicas})

        await self.on_first_answering(
            create, what="no node created the streams", rounds=3, errors=(rexc.StreamAlreadyExists,)
        )

    # -- producers ------------------------------------------------------------------------

    async def produce(self, process: str, queue: str, stop: asyncio.Event) -> None:
        rate = self.w.rate / max(1, self.w.producers) if self.w.rate else 0
        limiter = RateLimiter(rate)
        seq = itertools.count(1)
        async with contextlib.aclosing(self.connections(process, stop)) as conns:
            async for conn in conns:
                try:
                    target = await self.leader(conn, queue)
                except (*BROKER_ERRORS, rexc.LeaderNotAvailable, rexc.StreamDoesNotExist):
                    continue
                if target is not None and target != conn.node:
                    await conn.close()
                    try:
                        conn = await self.connect(target)
                    except BROKER_ERRORS:
                        continue
                try:
                    await _Publisher(self, conn, process, queue).run(stop, limiter, seq)
                finally:
                    await conn.close()

    # -- consumers ------------------------------------------------------------------------

    async def consume(self, process: str, queue: str, stop: asyncio.Event) -> None:
        async with contextlib.aclosing(self.connections(process, stop)) as conns:
            async for conn in conns:
                await self._consume_on(conn, process, queue, stop)

    async def _consume_on(self, conn: _Conn, process: str, queue: str, stop: asyncio.Event) -> None:
        """Join the group on ``conn``'s node; once active, read and store offsets until the
        connection goes, ``stop``, or nothing came for a while (the node may be cut off)."""
        sub = _Subscription(conn, None, group=REFERENCE)
        sub.activation = lambda: self._activated(conn, process, queue)
        try:
            await sub.open(queue)
        except (*BROKER_ERRORS, rexc.StreamDoesNotExist, rexc.StreamNotAvailable):
            return
        idle = 0.0
        while not stop.is_set() and conn.alive:
            got = await sub.batch(1.0)
            if not got:
                idle += 1.0
                if idle >= (ROTATE_AFTER if sub.active else STANDBY_ROTATE_AFTER):
                    return
                continue
            idle = 0.0
            self._consumed(process, conn.node, queue, got)
            await self._ack(conn, process, queue, got)

    def _consumed(self, process: str, node: str, queue: str, got: list[tuple[int, bytes]]) -> None:
        """A batch a consumer read: an offset at or below the highest any consumer of the group was
        sent (a takeover, or a rejoin, resuming after the stored offset) is a redelivery."""
        for offset, data in got:
            again = offset <= self.highest.get(queue, -1)
            self.highest[queue] = max(offset, self.highest.get(queue, -1))
            self._delivered(process, node, queue, offset, data, redelivered=again)

    async def _activated(self, conn: _Conn, process: str, queue: str) -> int | None:
        """The broker made this consumer the group's active one: where its group stored its offset
        (None: nothing stored, it starts at the first entry); resuming after a stored offset is
        the consumer's ``seek``."""
        try:
            async with asyncio.timeout(OP_TIMEOUT):
                stored: int | None = await conn.client.query_offset(queue, REFERENCE)
        except rexc.OffsetNotFound:
            stored = None
        if stored is not None:
            record_event(
                self.recorder, process, SEEK, node=conn.node, queue=queue, value=None,
                detail={"stream_seq": stored + 1, "stored_offset": stored, "single_active": REFERENCE},
            )  # fmt: skip
        return stored

    def _delivered(
        self, process: str, node: str, queue: str, offset: int, data: bytes, *, redelivered: bool
    ) -> str:
        msg_id = entry_id(data)
        detail: dict[str, Any] = {"stream_seq": offset}
        if body_digest(data) != body_digest(message_body(msg_id, self.seed, self.w.message_size)):
            detail.update(body=data[:200].decode(errors="backslashreplace"), length=len(data))
        self.recorder.invoke(process, "consume", node=node, queue=queue).ok(
            msg_id, redelivered=redelivered, digest=body_digest(data), detail=detail
        )
        return msg_id

    async def _ack(self, conn: _Conn, process: str, queue: str, got: list[tuple[int, bytes]]) -> None:
        """Store the last offset under the shared reference, then ask for it back."""
        last = got[-1][0]
        ops = [
            (
                self.recorder.invoke(process, "ack", node=conn.node, queue=queue, value=entry_id(d)),
                entry_id(d),
            )
            for _o, d in got
        ]
        try:
            await conn.client.store_offset(queue, REFERENCE, last)
            async with asyncio.timeout(OP_TIMEOUT):
                stored = await conn.client.query_offset(queue, REFERENCE)
        except Exception as exc:  # noqa: BLE001 - the node may or may not have stored it
            for op, _i in ops:
                op.info(reason(exc))
            return
        for op, msg_id in ops:
            if stored >= last:
                op.ok(detail={"stored_offset": stored})
                self.acked.add(msg_id)
            else:
                op.info(f"stored offset {stored} is before {last}")

    # -- ordered readers ------------------------------------------------------------------

    async def read(self, process: str, queue: str, stop: asyncio.Event) -> None:
        """Read the stream from its first entry in order; after a failure, ``seek`` to the entry
        after the last one read through the next node; after ``stop``, on to the stream's end."""
        nxt: int | None = None
        end = StreamEnd(stop, self.w.drain_idle)
        nodes = self.rotation(process)
        while not end.done.is_set():
            try:
                conn = await self.connect(next(nodes))
            except BROKER_ERRORS:
                await asyncio.sleep(RECONNECT_DELAY)
                continue
            try:
                if nxt is not None:
                    record_event(
                        self.recorder, process, "seek", node=conn.node, queue=queue, value=None,
                        detail={"stream_seq": nxt},
                    )  # fmt: skip
                nxt = await self._read_on(conn, process, queue, nxt, end)
            finally:
                await conn.close()

    async def _read_on(
        self, conn: _Conn, process: str, queue: str, nxt: int | None, end: StreamEnd
    ) -> int | None:
        sub = _Subscription(conn, nxt)
        try:
            await sub.open(queue)
        except (*BROKER_ERRORS, rexc.StreamDoesNotExist, rexc.StreamNotAvailable):
            await asyncio.sleep(RECONNECT_DELAY)
            return nxt
        loop = asyncio.get_running_loop()
        end.idle_since = None  # an idle spell counts on one connection only
        last_entry = loop.time()
        while conn.alive:
            got = await sub.batch(1.0)
            if got:
                last_entry = loop.time()
            elif not end.stop.is_set() and loop.time() - last_entry >= ROTATE_AFTER:
                return nxt  # nothing while producers run: this node may be cut off, try the next
            for offset, data in got:
                record_event(
                    self.recorder, process, "read", node=conn.node, queue=queue, value=entry_id(data),
                    detail={"stream_seq": offset}, digest=body_digest(data),
                )  # fmt: skip
                nxt = offset + 1
            if end.read(bool(got)):
                return nxt
        return nxt

    # -- drain ----------------------------------------------------------------------------

    def drain_reader(self, process: str, queue: str) -> _Drain:
        return _Drain(self, process, queue)


class _Publisher:
    """One publisher on one connection (to the stream's leader): publish, await each confirm."""

    def __init__(self, driver: StreamDriver, conn: _Conn, process: str, queue: str) -> None:
        self.d, self.conn, self.process, self.queue = driver, conn, process, queue
        self.waiting: dict[int, asyncio.Future[int | None]] = {}
        self.publishing_id = itertools.count(1)

    def _on_confirm(self, frame: schema.PublishConfirm) -> None:
        for pid in frame.publishing_ids:
            fut = self.waiting.pop(pid, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _on_error(self, frame: schema.PublishError) -> None:
        for err in frame.errors:
            fut = self.waiting.pop(err.publishing_id, None)
            if fut is not None and not fut.done():
                fut.set_result(err.response_code)

    async def run(self, stop: asyncio.Event, limiter: RateLimiter, seq: itertools.count[int]) -> None:
        client = self.conn.client
        client.add_handler(schema.PublishConfirm, self._on_confirm, name="confirm")
        client.add_handler(schema.PublishError, self._on_error, name="error")
        try:
            async with asyncio.timeout(OP_TIMEOUT):
                await client.declare_publisher(self.queue, None, PUBLISHER_ID)
        except Exception:  # noqa: BLE001 - no publisher here: the next node
            return
        window = asyncio.Semaphore(self.d.w.in_flight)
        pending: set[asyncio.Task[str]] = set()
        trouble = asyncio.Event()
        while not stop.is_set() and not trouble.is_set() and self.conn.alive:
            await limiter.wait()
            if not await acquired(window, 1.0):
                continue
            msg_id = f"{self.process}:{next(seq)}"
            inv = self.d.recorder.invoke(
                self.process, "publish", node=self.conn.node, queue=self.queue, value=msg_id
            )
            task = asyncio.create_task(self._one(inv, msg_id))
            pending.add(task)
            task.add_done_callback(pending.discard)
            task.add_done_callback(lambda _t: window.release())
            task.add_done_callback(
                lambda t: trouble.set() if not t.cancelled() and t.result() != "ok" else None
            )
        if pending:
            await asyncio.wait(list(pending), timeout=self.d.w.confirm_timeout + 1)

    async def _one(self, inv: Invocation, msg_id: str) -> str:
        pid = next(self.publishing_id)
        fut: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self.waiting[pid] = fut
        body = message_body(msg_id, self.d.seed, self.d.w.message_size)
        try:
            await self.conn.client.publish([schema.Message(pid, None, body)], PUBLISHER_ID)
            async with asyncio.timeout(self.d.w.confirm_timeout):
                code = await fut
        except asyncio.CancelledError:
            if not inv.done:
                inv.info("cancelled before the publish confirm arrived")
            raise
        except Exception as exc:  # noqa: BLE001 - a timeout, a lost connection: unknown
            self.waiting.pop(pid, None)
            inv.info(reason(exc) if str(exc) else "no publish confirm within confirm_timeout")
            return "info"
        if code is not None:
            inv.fail(f"publish error, response code {code}", detail={"code": code})
            return "fail"
        inv.ok(detail={"publishing_id": pid})
        return "ok"


@dataclass
class NodeView:
    consumed: int = 0
    entries: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    empty_at_ns: int | None = None
    error: str | None = None
    ids: list[str] = field(default_factory=list, repr=False)


class _Drain:
    """One stream's drain, one node per visit: the node's whole copy, from its first entry."""

    def __init__(self, driver: StreamDriver, process: str, queue: str) -> None:
        self.d, self.process, self.queue = driver, process, queue
        self.node_views = {n: NodeView() for n in driver.nodes}
        self.consumed = 0
        self.recorded: set[str] = set()

    def views(self) -> dict[str, dict[str, Any]]:
        return {
            n: {k: v for k, v in asdict(view).items() if k != "ids"} for n, view in self.node_views.items()
        }

    async def extra(self) -> dict[str, Any]:
        replicas = {
            n: {"messages": v.entries, "first_seq": v.first_seq, "last_seq": v.last_seq}
            for n, v in self.node_views.items()
            if v.empty_at_ns is not None
        }
        return {"replicas": replicas, OFFSETS: SPARSE}

    async def visit(self, node: str, left: Callable[[], float]) -> bool | NoCopy:
        view = self.node_views[node]
        try:
            conn = await self.d.connect(node)
        except BROKER_ERRORS as exc:
            view.error = f"connect: {reason(exc)}"
            return False
        try:
            async with asyncio.timeout(max(0.1, left())):
                return await self._read_all(conn, view)
        except TimeoutError:
            view.error = (
                f"drain_timeout ({self.d.w.drain_timeout:g}s) ran out on this node"
                if left() <= 0
                else f"no answer within {OP_TIMEOUT:g}s"
            )
        except (*BROKER_ERRORS, rexc.StreamDoesNotExist, rexc.StreamNotAvailable) as exc:
            view.error = reason(exc)
        finally:
            await conn.close()
        return await self._no_replica(node, view, left) or False

    async def _no_replica(self, node: str, view: NodeView, left: Callable[[], float]) -> NoCopy | None:
        """A node that serves no read of the stream (refused, or no answer to the subscribe)
        holds no copy to drain when the broker names no replica of it there (``queue_replicas``):
        a replica removed with the node's departure from the cluster is not added back when it
        joins again. The other nodes are asked first (the node that joined again did not answer
        the stream coordinator's queries), then the node itself. A replica the broker still names
        (down, or not started again) is waited for; so is every node when the broker cannot tell."""
        if self.d.queue_replicas is None:
            return None
        failed: list[str] = []
        replicas: set[str] | None = None
        try:
            async with asyncio.timeout(max(0.1, left())):
                for asked in [*(n for n in self.d.nodes if n != node), node]:
                    try:
                        replicas = await self.d.queue_replicas(asked, self.queue)
                        break
                    except ClusterError as exc:
                        failed.append(reason(exc))
        except TimeoutError:
            failed.append("the drain's time ran out")
        if replicas is None or node in replicas:
            if failed and replicas is None:
                view.error = f"{view.error} (its replicas unknown: {'; '.join(failed)})"
            return None
        said, view.error = view.error, None
        names = ", ".join(sorted(replicas))
        return NoCopy(f"{said}; the broker names no replica of the stream here (its replicas: {names})")

    async def _read_all(self, conn: _Conn, view: NodeView) -> bool:
        sub = _Subscription(conn, None)
        await sub.open(self.queue)
        entries: list[tuple[int, str]] = []
        loop = asyncio.get_running_loop()
        idle_from = loop.time()
        while loop.time() - idle_from < self.d.w.drain_idle:
            failure = conn.reader_failure()
            if failure is None and not conn.alive:
                view.error = "connection lost while draining"
                return False
            got = await sub.batch(0.5)
            if failure is not None and not got:
                # The node sent what the client rejects: once what came before it is read, the
                # copy reads no further however often it is visited, so what was read is its
                # copy, and the error says why it ends.
                return self._read(
                    view, entries, f"read stopped: the client rejected what the node sent ({failure})"
                )
            if got:
                idle_from = loop.time()
            for offset, data in got:
                msg_id = entry_id(data)
                entries.append((offset, msg_id))
                if msg_id in self.d.acked or msg_id in self.recorded:
                    continue
                self.d._delivered(self.process, conn.node, self.queue, offset, data, redelivered=False)
                self.d.recorder.invoke(
                    self.process, "ack", node=conn.node, queue=self.queue, value=msg_id
                ).ok(detail={"stream": "the drain's read"})
                self.recorded.add(msg_id)
                view.consumed += 1
                self.consumed += 1
        return self._read(view, entries, None)

    def _read(self, view: NodeView, entries: list[tuple[int, str]], error: str | None) -> bool:
        """The node's copy as read (offset, id), to its end or to where ``error`` stopped the read."""
        view.entries = len(entries)
        view.first_seq = entries[0][0] if entries else None
        view.last_seq = entries[-1][0] if entries else None
        view.error = error
        view.empty_at_ns = self.d.recorder.now_ns()
        return True


def sac_properties(group: str) -> dict[str, str]:
    """The subscription properties that make a consumer one of ``group``'s single active consumers
    (the stream protocol's ``single-active-consumer`` and ``name``)."""
    return {"single-active-consumer": "true", "name": group}


def resume_spec(stored: int | None) -> OffsetSpecification:
    """The answer to an activation: after the stored offset, or the first entry when none is stored."""
    if stored is None:
        return OffsetSpecification(OffsetType.FIRST, 0)
    return OffsetSpecification(OffsetType.OFFSET, stored + 1)


def refuse_unsupported(w: WorkloadSection) -> None:
    """What a stream has no way to do, refused by field (never silently ignored)."""
    if w.delay is not None:
        raise ScenarioError("workload.delay: a RabbitMQ stream has no delayed publish; remove workload.delay")
    for name in ("ttl_ms", "expiration_ms", "dead_letter", "transactions"):
        if getattr(w, name, None) not in (None, False, 0):
            raise ScenarioError(
                f"workload.{name}: a RabbitMQ stream has no such feature; remove workload.{name}"
            )
    c = w.consumer
    for name in ("requeue", "recover_every", "close_every", "crash_every"):
        if getattr(c, name, 0):
            raise ScenarioError(
                f"workload.consumer.{name}: a stream consumer gives nothing back (entries stay in the "
                f"stream; it resumes from its stored offset); remove workload.consumer.{name}"
            )


@hookimpl
def brokerchaos_register_clients(register: Any) -> None:
    register.add_client("rabbitmq-stream", StreamDriver)
