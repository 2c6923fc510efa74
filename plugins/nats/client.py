"""The NATS JetStream workload driver (client plugin ``nats``), on ``nats-py``.

One stream per workload queue (subject = stream name = queue name, file storage,
the broker's ``replicas``), kept by limits (a consumed message stays in the
stream, so every replica's state can be compared after the drain), and one
durable pull consumer with explicit acks that every consumer process shares.

What the history records (``harness.spec.history``), in JetStream terms:

- ``publish``: a JetStream publish; ``ok`` = the stream leader's ack (``detail``:
  the stream sequence it gave), ``fail`` = an error reply or no responders (no
  server took it), ``info`` = a timeout or a lost connection.
- ``consume``: a message a fetch returned (``detail``: stream sequence, consumer
  sequence, delivery count; ``redelivered`` = delivered before).
- ``ack``: ``+ACK`` sent as a request; ``ok`` only once the consumer leader
  answered it (the double ack), ``info`` otherwise.
- ``abandon``: ``-NAK`` sent as a request, ``ok`` once answered. A consumer that
  "crashes" closes its connection holding deliveries: JetStream redelivers
  those after ``ack_wait`` whatever happened to the connection, so the abandon
  is ``ok``.
- ``drain``: through every node, until the consumer (as the node's JetStream API
  reports it) has nothing pending and nothing waiting for an ack after an idle
  fetch; the completion's value also holds each server's own view of the stream
  (``$SYS.REQ.SERVER.PING.JSZ``: messages, first and last sequence, leader), for
  the replica comparison of ``spark_reports.engines.stream``.

Every client connects through its node's client proxy with reconnection off:
after a failure it records what was open as ``info`` and moves to the next node.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig

from harness import ScenarioError, hookimpl
from harness.spec import (
    Endpoint,
    Invocation,
    RateLimiter,
    Recorder,
    body_digest,
    message_body,
)
from harness.spec.client import (
    Behaviour,
    ConnectingDriver,
    DriverDrain,
    NoCopy,
    StreamEnd,
    acquired,
    close_quietly,
    reason,
    record_event,
)
from plugins.nats.membership import server_node

CONSUMER = "brokerchaos"  # the durable pull consumer every consumer process shares
ID_HEADER = "Brokerchaos-Id"
CONNECT_TIMEOUT = 5.0
OP_TIMEOUT = 5.0  # an ack, a nak, a stream or consumer request
FETCH_WAIT = 1.0  # how long one pull waits for messages
ROTATE_AFTER = 5.0  # a consumer that got nothing for this long tries the next node (it may sit on a minority)
RECONNECT_DELAY = 0.5
REPLICA_WAIT = 3.0
STREAM_NOT_FOUND = 10059  # JetStream API error codes
CONSUMER_NOT_FOUND = 10014  # how long the drain gathers the servers' answers to a JSZ request

#: What a broker round trip raises when the broker, the network or the connection fails.
BROKER_ERRORS = (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError, ConnectionError)


def _flag_unknown(trouble: asyncio.Event, task: asyncio.Task[str]) -> None:
    """A publish that ended unknown (a timeout, a lost connection) sends its producer elsewhere."""
    if not task.cancelled() and task.result() == "info":
        trouble.set()


async def _quiet(*_args: Any) -> None:
    """nats-py's callbacks: failures are seen where they happen and recorded there."""


@dataclass
class _Conn:
    node: str
    nc: Client
    js: JetStreamContext

    async def close(self) -> None:
        await close_quietly(self.nc.close(), 2.0)


def delivery_detail(msg: Msg) -> dict[str, int]:
    """The sequence numbers of a delivered message, for the history's ``detail``."""
    md = msg.metadata
    return {
        "stream_seq": int(md.sequence.stream),
        "consumer_seq": int(md.sequence.consumer),
        "delivered": int(md.num_delivered),
    }


def message_id(msg: Msg) -> str:
    """The id the producer put in the header, or the body's own (``id|check|payload``)."""
    headers = msg.headers or {}
    return headers.get(ID_HEADER) or bytes(msg.data).split(b"|", 1)[0].decode(errors="replace")


class NatsDriver(ConnectingDriver[_Conn]):
    broker_errors = BROKER_ERRORS
    reconnect_delay = RECONNECT_DELAY

    def __init__(self, endpoints: Mapping[str, Endpoint], recorder: Recorder, **options: Any) -> None:
        super().__init__(endpoints, recorder, **options)  # its settings come as queue_arguments
        workload = self.w
        if workload.delay is not None:  # no silent ignoring: JetStream has no per-message delay to test
            raise ScenarioError(
                "workload.delay: NATS JetStream has no delayed-message exchange; "
                "remove workload.delay from this scenario"
            )
        for field in ("ttl_ms", "expiration_ms", "dead_letter"):
            if getattr(workload, field) not in (None, False):  # a stream's max_age is not a queue TTL
                raise ScenarioError(
                    f"workload.{field}: NATS JetStream has no per-queue TTL with dead-lettering to test; "
                    f"remove workload.{field} from this scenario"
                )
        args = self.queue_arguments
        self.replicas = int(args.get("replicas") or min(3, len(self.nodes)))
        self.consumer_replicas = args.get("consumer_replicas")
        self.ack_wait = float(args.get("ack_wait") or 10)
        self.system_user = (args.get("system_user"), args.get("system_password"))

    # -- connections ----------------------------------------------------------------------

    async def connect(self, node: str, *, system: bool = False) -> _Conn:
        ep = self.endpoints[node]
        user, password = self.system_user if system else (self.username, self.password)
        async with asyncio.timeout(CONNECT_TIMEOUT + 1):
            nc = await nats.connect(
                servers=[f"nats://{ep.host}:{ep.port}"],
                user=user,
                password=password,
                allow_reconnect=False,
                connect_timeout=CONNECT_TIMEOUT,
                max_reconnect_attempts=0,
                ping_interval=2,
                max_outstanding_pings=2,
                error_cb=_quiet,
                disconnected_cb=_quiet,
                closed_cb=_quiet,
                name=f"brokerchaos-{node}",
            )
        return _Conn(node, nc, nc.jetstream(timeout=OP_TIMEOUT))

    async def setup(self, queues: Sequence[str]) -> None:
        """Create each queue's stream and the shared durable pull consumer (first node that answers)."""

        async def create(conn: _Conn) -> None:
            for q in queues:
                await conn.js.add_stream(
                    StreamConfig(
                        name=q,
                        subjects=[q],
                        storage=StorageType.FILE,
                        num_replicas=self.replicas,
                        retention=RetentionPolicy.LIMITS,
                    )
                )
                await self.create_consumer(conn, q)

        await self.on_first_answering(create, what="no node created the streams", rounds=3)

    async def create_consumer(self, conn: _Conn, queue: str) -> None:
        """The durable pull consumer every consumer process shares (explicit acks, from the start)."""
        await conn.js.add_consumer(
            queue,
            ConsumerConfig(
                durable_name=CONSUMER,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=self.ack_wait,
                max_deliver=-1,
                max_ack_pending=-1,
                num_replicas=self.consumer_replicas,
            ),
        )

    # -- producers ------------------------------------------------------------------------

    async def produce(self, process: str, queue: str, stop: asyncio.Event) -> None:
        rate = self.w.rate / max(1, self.w.producers) if self.w.rate else 0
        limiter = RateLimiter(rate)
        seq = itertools.count(1)
        window = asyncio.Semaphore(self.w.in_flight)
        pending: set[asyncio.Task[str]] = set()
        async with contextlib.aclosing(self.connections(process, stop)) as conns:
            async for conn in conns:
                trouble = asyncio.Event()  # a publish on this connection ended unknown: move on
                while not stop.is_set() and not trouble.is_set() and not conn.nc.is_closed:
                    await limiter.wait()
                    if not await acquired(window, 1.0):
                        continue
                    if stop.is_set() or trouble.is_set():
                        window.release()
                        break
                    msg_id = f"{process}:{next(seq)}"
                    inv = self.recorder.invoke(process, "publish", node=conn.node, queue=queue, value=msg_id)
                    task = asyncio.create_task(self._publish_one(conn, inv, queue, msg_id))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    task.add_done_callback(lambda _t: window.release())
                    task.add_done_callback(functools.partial(_flag_unknown, trouble))
                if pending:
                    await asyncio.wait(list(pending), timeout=self.w.confirm_timeout + 1)
        if pending:
            await asyncio.wait(list(pending), timeout=self.w.confirm_timeout + 1)

    async def _publish_one(self, conn: _Conn, inv: Invocation, queue: str, msg_id: str) -> str:
        body = message_body(msg_id, self.seed, self.w.message_size)
        try:
            async with asyncio.timeout(self.w.confirm_timeout + 0.5):
                ack = await conn.js.publish(
                    queue, body, timeout=self.w.confirm_timeout, stream=queue, headers={ID_HEADER: msg_id}
                )
        except asyncio.CancelledError:
            if not inv.done:
                inv.info("cancelled before the publish ack arrived")
            raise
        except nats.js.errors.APIError as exc:  # an error reply: the stream did not store it
            inv.fail(reason(exc), detail={"code": exc.code, "err_code": exc.err_code})
            return "fail"
        except (
            nats.js.errors.NoStreamResponseError
        ) as exc:  # no server subscribes the subject: nobody stored it
            inv.fail(reason(exc))
            return "fail"
        except BROKER_ERRORS as exc:
            inv.info(reason(exc))
            return "info"
        except Exception as exc:  # noqa: BLE001 - anything unexpected is indeterminate
            inv.info(reason(exc))
            return "info"
        inv.ok(detail={"stream_seq": int(ack.seq), "stream": ack.stream})
        return "ok"

    # -- consumers ------------------------------------------------------------------------

    async def consume(self, process: str, queue: str, stop: asyncio.Event) -> None:
        behaviour = self.behaviour(process, asyncio.get_running_loop().time())
        async with contextlib.aclosing(self.connections(process, stop)) as conns:
            async for conn in conns:
                await _Session(self, conn, process, queue, behaviour).run(stop)

    # -- ordered readers ------------------------------------------------------------------

    async def read(self, process: str, queue: str, stop: asyncio.Event) -> None:
        """An ordered stream reader (``workload.readers``): the stream from its first entry, in
        order, through an ephemeral pull consumer that acks nothing (``AckPolicy.NONE``), so it
        takes nothing from anyone. Each entry is a ``read`` op (id, digest, stream sequence). A
        failed connection or consumer is replaced through the next node, from the entry after the
        last one read, recorded first as a ``seek`` to that sequence. After ``stop`` it reads on
        until a fetch finds nothing for ``drain_idle`` seconds, so it reaches the stream's end."""
        nxt, started = 1, False
        end = StreamEnd(stop, self.w.drain_idle)
        async with contextlib.aclosing(self.connections(process, end.done)) as conns:
            async for conn in conns:
                if started:
                    record_event(
                        self.recorder,
                        process,
                        "seek",
                        node=conn.node,
                        queue=queue,
                        value=None,
                        detail={"stream_seq": nxt},
                    )
                started = True
                try:
                    sub = await conn.js.pull_subscribe(
                        queue,
                        stream=queue,
                        config=ConsumerConfig(
                            ack_policy=AckPolicy.NONE,
                            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                            opt_start_seq=nxt,
                            inactive_threshold=30.0,
                        ),
                    )
                except BROKER_ERRORS:
                    continue
                while not end.done.is_set():
                    try:
                        msgs = await sub.fetch(100, timeout=FETCH_WAIT)
                    except TimeoutError:
                        msgs = []
                    except BROKER_ERRORS:
                        break
                    for msg in msgs:
                        seq = int(msg.metadata.sequence.stream)
                        digest = body_digest(bytes(msg.data))
                        record_event(
                            self.recorder,
                            process,
                            "read",
                            node=conn.node,
                            queue=queue,
                            value=message_id(msg),
                            detail={"stream_seq": seq},
                            digest=digest,
                        )
                        nxt = max(nxt, seq + 1)
                    end.read(bool(msgs))
                    if stop.is_set() and conn.nc.is_closed:
                        break

    # -- drain ----------------------------------------------------------------------------

    def drain_reader(self, process: str, queue: str) -> _Drain:
        """What is left in ``queue``'s stream, read through one node per visit (after every fault
        healed); the harness runs the rounds (``harness.spec.client.DrainReader``)."""
        return _Drain(self, process, queue, NodeView)

    async def replica_views(self, queue: str) -> dict[str, Any]:
        """Each server's own state of ``queue``'s stream (None: the server holds no replica), from
        the system account's ``JSZ`` request, which every server answers for itself."""
        if not self.system_user[0]:
            return {}
        for node in self.nodes:
            try:
                conn = await self.connect(node, system=True)
            except BROKER_ERRORS:
                continue
            try:
                return await _gather_jsz(conn.nc, queue, len(self.nodes))
            except BROKER_ERRORS:
                continue
            finally:
                await conn.close()
        return {}


async def _gather_jsz(nc: Client, stream: str, servers: int) -> dict[str, Any]:
    inbox = nc.new_inbox()
    answers: dict[str, Any] = {}
    got_all = asyncio.Event()

    async def on_reply(msg: Msg) -> None:
        try:
            data = json.loads(msg.data)
        except ValueError:
            return
        server = (data.get("server") or {}).get("name")
        if not server:
            return
        name = server_node(server)  # by node: a node's server is renamed when it joins again
        answers[name] = None
        for account in (data.get("data") or {}).get("account_details") or ():
            for s in account.get("stream_detail") or ():
                if s.get("name") == stream:
                    state = s.get("state") or {}
                    cluster = s.get("cluster") or {}
                    answers[name] = {
                        k: state.get(k) for k in ("messages", "bytes", "first_seq", "last_seq", "num_deleted")
                    } | {
                        "leader": server_node(cluster["leader"]) if cluster.get("leader") else None,
                        "server": server,
                    }
        if len(answers) >= servers:
            got_all.set()

    sub = await nc.subscribe(inbox, cb=on_reply)
    try:
        await nc.publish(
            "$SYS.REQ.SERVER.PING.JSZ", json.dumps({"accounts": True, "streams": True}).encode(), reply=inbox
        )
        try:
            async with asyncio.timeout(REPLICA_WAIT):
                await got_all.wait()
        except TimeoutError:
            pass
    finally:
        await sub.unsubscribe()
    return answers


class _Session:
    """One consumer on one connection: fetch, record, settle, act out the behaviours."""

    def __init__(
        self, driver: NatsDriver, conn: _Conn, process: str, queue: str, behaviour: Behaviour
    ) -> None:
        self.d = driver
        self.conn = conn
        self.node = conn.node
        self.process = process
        self.queue = queue
        self.behaviour = behaviour
        self.loop = asyncio.get_running_loop()
        self.acked = 0
        self.last_delivery = self.loop.time()

    async def run(
        self,
        stop: asyncio.Event | None,
        *,
        rotate_after: float | None = ROTATE_AFTER,
        until: Callable[[], bool] | None = None,
    ) -> str:
        """Fetch and settle until ``stop``, a failure, (with ``rotate_after``) nothing for that
        long, or (with ``until``) ``until()`` says to stop ("idle"): deliveries that keep coming
        without an ack that completes would otherwise keep a drain's visit here for good."""
        try:
            sub = await self.conn.js.pull_subscribe_bind(durable=CONSUMER, stream=self.queue)
        except BROKER_ERRORS:
            return "lost"
        batch = max(1, min(self.d.w.prefetch or 64, 256))
        while stop is None or not stop.is_set():
            if until is not None and until():
                return "idle"
            try:
                msgs = await sub.fetch(batch, timeout=FETCH_WAIT)
            except nats.errors.TimeoutError:
                if rotate_after is not None and self.loop.time() - self.last_delivery > rotate_after:
                    return "idle"
                if stop is None:
                    return "idle"
                continue
            except BROKER_ERRORS:
                return "lost"
            held = [self.deliver(m) for m in msgs]
            action, at = self.behaviour.next()
            if action is not None and self.loop.time() >= at and held:
                self.behaviour.done(action, self.loop.time())
                if action == "crash":
                    for (
                        _msg,
                        msg_id,
                    ) in held:  # JetStream redelivers them after ack_wait, whatever the connection does
                        self._abandon(msg_id, "crash").ok()
                    return "crashed"
                await asyncio.gather(*(self.give_back(m, msg_id, action) for m, msg_id in held))
                continue
            await asyncio.gather(*(self.settle(m, msg_id) for m, msg_id in held))
            if self.conn.nc.is_closed:
                return "lost"
        return "stop"

    def deliver(self, msg: Msg) -> tuple[Msg, str]:
        body = bytes(msg.data)
        msg_id = message_id(msg)
        digest = body_digest(body)
        detail: dict[str, Any]
        try:
            detail = dict(delivery_detail(msg))
        except Exception:  # noqa: BLE001 - a reply subject that is not a JetStream ack subject
            detail = {"reply": msg.reply}
        redelivered = detail.get("delivered", 1) > 1
        if digest != body_digest(message_body(msg_id, self.d.seed, self.d.w.message_size)):
            detail.update(body=body[:200].decode(errors="backslashreplace"), length=len(body))
        self.d.recorder.invoke(self.process, "consume", node=self.node, queue=self.queue).ok(
            msg_id, redelivered=redelivered, digest=digest, detail=detail
        )
        self.last_delivery = self.loop.time()
        return msg, msg_id

    async def settle(self, msg: Msg, msg_id: str) -> None:
        b = self.behaviour
        if b.slow_ack:
            await asyncio.sleep(b.slow_ack)
        if b.requeue and b.rng.random() < b.requeue:
            await self.give_back(msg, msg_id, "requeue")
            return
        op = self.d.recorder.invoke(self.process, "ack", node=self.node, queue=self.queue, value=msg_id)
        try:
            await msg.ack_sync(timeout=OP_TIMEOUT)
        except asyncio.CancelledError:
            op.info("cancelled before the ack was answered")
            raise
        except Exception as exc:  # noqa: BLE001 - the server may or may not have processed it
            op.info(reason(exc))
            return
        op.ok()
        self.acked += 1

    def _abandon(self, msg_id: str, cause: str) -> Invocation:
        return self.d.recorder.invoke(
            self.process, "abandon", node=self.node, queue=self.queue, value=msg_id, detail={"cause": cause}
        )

    async def give_back(self, msg: Msg, msg_id: str, cause: str) -> None:
        """``-NAK`` as a request: ``ok`` once the consumer leader answered."""
        op = self._abandon(
            msg_id, "requeue" if cause == "requeue" else ("recover" if cause == "recover" else "close")
        )
        try:
            await self.conn.nc.request(msg.reply, b"-NAK", timeout=OP_TIMEOUT)
        except asyncio.CancelledError:
            op.info("cancelled before the nak was answered")
            raise
        except Exception as exc:  # noqa: BLE001
            op.info(reason(exc))
            return
        op.ok()


@dataclass
class NodeView:
    consumed: int = 0
    ready: int | None = None  # the consumer's num_pending through this node's JetStream API
    unacked: int | None = None  # its num_ack_pending
    local: list[int] | None = None  # (pending, ack pending) in this server's own /jsz, if it holds a replica
    empty_at_ns: int | None = None
    error: str | None = None
    missing: str | None = None  # "stream" or "consumer": what the JetStream API said it does not have
    consumers_created: int = 0  # the drain made the durable consumer again (its state had been lost)


class _Drain(DriverDrain["NatsDriver", NodeView]):
    """One stream's drain through JetStream, one node per visit (``DrainReader``)."""

    async def extra(self) -> dict[str, Any]:
        """Each server's own view of the stream (``replicas``), for the replica comparison."""
        try:
            async with asyncio.timeout(REPLICA_WAIT + CONNECT_TIMEOUT + 2):
                replicas = await self.d.replica_views(self.queue)
        except TimeoutError:
            replicas = {}
        return {"replicas": replicas}

    async def visit(self, node: str, left: Callable[[], float]) -> bool | NoCopy:
        """Fetch through ``node`` until it has been idle for ``drain_idle`` and the consumer is empty."""
        view = self.node_views[node]
        return await self.visit_with(
            view,
            left,
            connect=lambda: self.d.connect(node),
            session=lambda conn: _Session(self.d, conn, self.process, self.queue, Behaviour.none()),
            read=lambda conn, session: self._until_empty(conn, session, view),
            close=lambda conn: conn.close(),
            errors=BROKER_ERRORS,
            drain_timeout=self.d.w.drain_timeout,
        )

    async def _until_empty(self, conn: _Conn, session: _Session, view: NodeView) -> bool | NoCopy:
        """Fetch and ack through ``conn`` until the consumer is empty. Every way round the loop
        (a fetch, a look, a consumer made again) answers to one patience rule: no new ack for
        that long ends the visit with an error saying what it last saw, so a node that makes no
        progress (a consumer that is gone again at every look, deliveries that never ack) costs
        one patience, not the whole drain_timeout, and the rounds go on to the other nodes."""
        patience = _Patience(self.loop, session, max(10.0, 4 * self.d.w.drain_idle, self.d.ack_wait + 5))
        while True:
            idle_from = self.loop.time()
            while self.loop.time() - idle_from < self.d.w.drain_idle and not patience.out():
                before = session.acked
                outcome = await session.run(None, rotate_after=None, until=patience.out)
                if outcome == "lost":
                    # nats-server 2.15 refuses to bind a consumer on a stream it no longer holds
                    # (2.9 let the fetch time out): the cluster may have lost the stream itself.
                    gone = await self._stream_gone(conn, view)
                    if gone is not None:
                        return gone
                    view.error = "connection lost while draining"
                    return False
                if session.acked > before:
                    idle_from = self.loop.time()
            try:
                info = await conn.js.consumer_info(self.queue, CONSUMER, timeout=OP_TIMEOUT)
            except nats.js.errors.NotFoundError as exc:
                if exc.err_code == STREAM_NOT_FOUND:
                    return self._no_stream(view)
                if exc.err_code != CONSUMER_NOT_FOUND:
                    raise
                if patience.out():
                    view.error = (
                        f"no new ack for {patience.limit:g}s: the consumer was gone at each look "
                        f"(made again {view.consumers_created} times)"
                    )
                    return False
                # The stream is there, its consumer is not (its state was lost): read the stream
                # again from the start through a new one, as the drain must read all that is left.
                await self.d.create_consumer(conn, self.queue)
                view.missing, view.consumers_created = "consumer", view.consumers_created + 1
                continue
            view.ready, view.unacked = int(info.num_pending or 0), int(info.num_ack_pending or 0)
            if self.d.queue_depth is not None:
                try:
                    local = await self.d.queue_depth(conn.node, self.queue)
                except Exception as exc:  # noqa: BLE001 - a plugin's exec failing is this node's error
                    view.error = f"queue depth: {reason(exc)}"
                    local = None
                view.local = list(local) if isinstance(local, tuple) else None
            if view.ready == 0 and view.unacked == 0:
                return self.emptied(view, self.d.recorder.now_ns())
            if patience.out():
                view.error = f"not empty without a new ack (pending {view.ready}, ack pending {view.unacked})"
                return False

    async def _stream_gone(self, conn: _Conn, view: NodeView) -> NoCopy | None:
        """``NoCopy`` if the cluster says it holds no such stream, else None."""
        try:
            async with asyncio.timeout(OP_TIMEOUT):
                await conn.js.stream_info(self.queue)
        except nats.js.errors.NotFoundError as exc:
            return self._no_stream(view) if exc.err_code == STREAM_NOT_FOUND else None
        except BROKER_ERRORS:
            return None
        return None

    def _no_stream(self, view: NodeView) -> NoCopy:
        """The cluster holds no such stream (a cut of every replica can take it whole): nothing
        to read, through this node or any. JetStream answers "stream not found" (10059) from its
        meta leader's assignments (a clustered server without the assignment stays silent and
        leaves the answer to the leader), so the answer is the cluster's, not this server's:
        ``NoCopy`` with ``gone``. A round in which every node answers so ends the drain with the
        stream gone: its confirmed, unconsumed messages lost, and no sign it came back."""
        view.ready, view.unacked, view.missing, view.error = 0, 0, "stream", None
        return NoCopy("the cluster holds no such stream (JetStream: stream not found)", gone=True)


class _Patience:
    """How long a drain visit may go without a new ack (``limit`` seconds) before it ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop, session: _Session, limit: float) -> None:
        self.loop, self.session, self.limit = loop, session, limit
        self.acked, self.since = session.acked, loop.time()

    def out(self) -> bool:
        """Whether ``limit`` seconds have gone by since the last new ack (or the start)."""
        if self.session.acked > self.acked:
            self.acked, self.since = self.session.acked, self.loop.time()
        return self.loop.time() - self.since > self.limit


@hookimpl
def brokerchaos_register_clients(register: Any) -> None:
    register.add_client("nats", NatsDriver)
