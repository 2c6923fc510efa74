"""The STOMP 1.2 workload driver (client plugin ``stomp``), on ``stomp.py`` through ``ThreadBridge``.

``stomp.py`` is thread-based: its calls block and its callbacks (a receipt, a message, an error,
a lost connection) run on its receiver thread. ``harness.spec.ThreadBridge`` runs the calls off the
event loop and hands every callback to it, so the driver is an ordinary asyncio driver.

What the history records (``harness.spec.history``), in STOMP terms:

- ``publish``: ``SEND`` of a persistent message with a ``receipt`` header; ``ok`` on its
  ``RECEIPT`` (ActiveMQ answers a persistent send with a receipt once it is stored), ``fail`` on
  an ``ERROR`` frame naming the receipt (refused), ``info`` on a timeout or a lost connection.
- ``consume``: a ``MESSAGE`` (``redelivered`` from its ``redelivered`` header).
- ``ack``: ``ACK`` of that message (``client-individual``) with a receipt: ``ok`` on the receipt,
  ``info`` otherwise.
- ``abandon``: deliveries left unacked when a consumer closes its connection on purpose
  (``close``, ``crash``): ``ok``, the client cut the connection and the broker redelivers them.
- ``drain``: one node per visit (``drain_reader``): read and ack until idle, close, then ask the
  broker plugin's depth (a ``depth`` op; ActiveMQ's is a ``HeldTotal``). A node that refuses the
  connection (a shared-storage slave, which opens no connector) holds no copy (``NoCopy``).

A broker's own dead-letter queue (``ActiveMQ.DLQ``, for every queue) is drained like a queue;
each message read there is recorded under the dead-letter name of the queue it died in
(``dead_letter_queue(q)``, from its ``original-destination`` header) with
``detail.dead_letter = {"reason": ..., "queue": "ActiveMQ.DLQ"}``: the checkers count it
``dead_lettered``, not ``lost``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import stomp
import stomp.exception

from harness import ScenarioError, hookimpl
from harness.spec import (
    Endpoint,
    Invocation,
    NoCopy,
    QueueDepth,
    RateLimiter,
    Recorder,
    ThreadBridge,
    WorkloadSection,
    body_digest,
    dead_letter_queue,
    depth_empty,
    depth_value,
    message_body,
)
from harness.spec.client import Behaviour, DriverDrain, node_rotation, reason, slow_consumers, wait_or_stop
from harness.spec.history import DEPTH

DLQ = "ActiveMQ.DLQ"  # ActiveMQ's dead-letter queue for every queue (its default policy)
CONNECT_TIMEOUT = 5.0
OP_TIMEOUT = 5.0
RECONNECT_DELAY = 0.5
POLL = 0.5  # how long a consumer waits for a delivery before it looks at ``stop``

BROKER_ERRORS = (OSError, ConnectionError, TimeoutError, stomp.exception.StompException)


class Refused(Exception):
    """An ``ERROR`` frame that names the request: the broker refused it."""


class Link:
    """One STOMP connection through one node's client proxy, its callbacks bridged to the loop
    (a bridge of its own: a lost connection fails the replies awaited on it, no other's)."""

    _ids = itertools.count(1)

    def __init__(self, endpoint: Endpoint, username: str, password: str) -> None:
        self.bridge = bridge = ThreadBridge()
        self.node = endpoint.node
        self.username, self.password = username, password
        self.conn = stomp.Connection12(
            [(endpoint.host, endpoint.port)],
            heartbeats=(0, 0),
            reconnect_attempts_max=1,
            timeout=CONNECT_TIMEOUT,
            auto_decode=False,
            try_loopback_connect=False,
        )
        self.deliveries = bridge.queue()
        self.lost: str | None = None
        self.conn.set_listener("bridge", _Listener(self))

    async def open(self) -> Link:
        await self.bridge.call(
            self.conn.connect, self.username, self.password, wait=True, timeout=CONNECT_TIMEOUT + 1
        )
        if not self.conn.is_connected():
            raise ConnectionError(f"{self.node}: no CONNECTED frame")
        return self

    async def request(self, fn: Callable[..., Any], *args: Any, **headers: Any) -> Any:
        """``fn`` (send, ack, subscribe) with a receipt; returns once the receipt arrived.
        ``Refused`` on an ``ERROR`` naming it; ``TimeoutError``/``ConnectionError`` otherwise."""
        rid = f"r{next(self._ids)}"
        fut = self.bridge.expect(rid)
        try:
            await self.bridge.call(fn, *args, receipt=rid, timeout=OP_TIMEOUT, **headers)
            async with asyncio.timeout(OP_TIMEOUT):
                return await fut
        finally:
            self.bridge.forget(rid)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.bridge.call(self.conn.disconnect, timeout=3)


class _Listener(stomp.ConnectionListener):
    """stomp.py's callbacks, on its receiver thread: each handed to the event loop."""

    def __init__(self, link: Link) -> None:
        self.link = link

    def on_receipt(self, frame: Any) -> None:
        self.link.bridge.resolve(frame.headers.get("receipt-id", ""), frame.headers)

    def on_error(self, frame: Any) -> None:
        why = frame.headers.get("message", "ERROR frame")
        if "receipt-id" in frame.headers:
            self.link.bridge.fail(frame.headers["receipt-id"], Refused(why))
        else:  # an ERROR that names nothing: ActiveMQ closes the connection after it
            self.link.lost = why
            self.link.bridge.fail_all(ConnectionError(why))

    def on_message(self, frame: Any) -> None:
        self.link.deliveries.put(frame)

    def on_disconnected(self) -> None:
        self.link.lost = self.link.lost or "connection lost"
        self.link.bridge.fail_all(ConnectionError(self.link.lost))
        self.link.deliveries.put(None)


def frame_message(frame: Any) -> tuple[str, bytes]:
    """The message id and body of a ``MESSAGE`` (the id leads the body: ``message_body``)."""
    body = frame.body if isinstance(frame.body, bytes) else str(frame.body).encode()
    return body.split(b"|", 1)[0].decode(errors="replace"), body


class StompDriver:
    #: What STOMP on ActiveMQ cannot drive, refused before the cluster starts (``workload_check``).
    @staticmethod
    def check_workload(w: WorkloadSection) -> None:
        refuse_unsupported(w)

    def __init__(
        self,
        endpoints: Mapping[str, Endpoint],
        recorder: Recorder,
        *,
        workload: WorkloadSection,
        username: str = "admin",
        password: str = "admin",
        first_node: Mapping[str, str] | None = None,
        seed: int = 0,
        queue_depth: QueueDepth | None = None,
        **_: Any,
    ) -> None:
        refuse_unsupported(workload)
        self.endpoints = dict(endpoints)
        self.nodes = list(self.endpoints)
        self.recorder = recorder
        self.w = workload
        self.username, self.password = username, password
        self.first_node = dict(first_node or {})
        self.seed = seed
        self.queue_depth = queue_depth
        self._slow = slow_consumers(workload.consumer, workload.consumers, seed)
        self.open_links: dict[str, int] = {}  # queue -> the workload's connections open on it

    async def link(self, node: str) -> Link:
        return await Link(self.endpoints[node], self.username, self.password).open()

    async def links(self, process: str, queue: str, stop: asyncio.Event) -> Any:
        """One connection at a time, to the process's node first and then the next, until ``stop``."""
        rotation = node_rotation(self.nodes, self.first_node.get(process))
        while not stop.is_set():
            node = next(rotation)
            try:
                link = await self.link(node)
            except BROKER_ERRORS:
                await wait_or_stop(stop, RECONNECT_DELAY)
                continue
            self.open_links[queue] = self.open_links.get(queue, 0) + 1
            try:
                yield link
            finally:
                self.open_links[queue] -= 1
                await link.close()

    async def setup(self, queues: Sequence[str]) -> None:
        """Nothing to declare: ActiveMQ creates a queue on its first use."""

    async def produce(self, process: str, queue: str, stop: asyncio.Event) -> None:
        limiter = RateLimiter(self.w.rate / max(1, self.w.producers) if self.w.rate else 0)
        seq = itertools.count(1)
        async with contextlib.aclosing(self.links(process, queue, stop)) as links:
            async for link in links:
                while not stop.is_set():
                    await limiter.wait()
                    msg_id = f"{process}:{next(seq)}"
                    inv = self.recorder.invoke(process, "publish", node=link.node, queue=queue, value=msg_id)
                    if not await self.publish(link, inv, queue, msg_id):
                        break
                await wait_or_stop(stop, RECONNECT_DELAY)

    async def publish(self, link: Link, inv: Invocation, queue: str, msg_id: str) -> bool:
        """One persistent ``SEND`` awaited to its receipt; False sends the producer elsewhere."""
        body = message_body(msg_id, self.seed, self.w.message_size)
        try:
            await link.request(link.conn.send, f"/queue/{queue}", body, headers={"persistent": "true"})
        except asyncio.CancelledError:
            inv.info("cancelled before the receipt arrived")
            raise
        except Refused as exc:
            inv.fail(reason(exc))
            return False
        except Exception as exc:  # noqa: BLE001 - a timeout, a lost connection: unknown
            inv.info(reason(exc))
            return False
        inv.ok()
        return True

    async def consume(self, process: str, queue: str, stop: asyncio.Event) -> None:
        behaviour = Behaviour(
            self.w.consumer,
            self.seed,
            process,
            slow=process in self._slow,
            now=asyncio.get_running_loop().time(),
        )
        async with contextlib.aclosing(self.links(process, queue, stop)) as links:
            async for link in links:
                await Session(self, link, process, queue, behaviour).run(stop)
                await wait_or_stop(stop, RECONNECT_DELAY)

    def drain_reader(self, process: str, queue: str) -> Drain:
        return Drain(self, process, queue, NodeView)


def refuse_unsupported(w: WorkloadSection) -> None:
    """What STOMP on ActiveMQ cannot do here, refused by name rather than ignored."""
    for field, what in (("delay", "delayed publishes"), ("transactions", "transactions"), ("ttl_ms", "TTL")):
        if getattr(w, field, None):
            raise ScenarioError(
                f"workload.{field}: the STOMP client has no {what}; remove it from this scenario"
            )
    if w.dead_letter:
        raise ScenarioError(
            "workload.dead_letter: ActiveMQ dead-letters into ActiveMQ.DLQ on its own, which the drain "
            "reads; remove workload.dead_letter"
        )
    if w.consumer.requeue or w.consumer.recover_every:
        raise ScenarioError(
            "workload.consumer: requeue and recover_every are not offered over STOMP (a NACK dead-letters "
            "on ActiveMQ); use close_every or crash_every"
        )


class Session:
    """One consumer on one connection: subscribe, record each delivery, ack it with a receipt."""

    def __init__(
        self, driver: StompDriver, link: Link, process: str, queue: str, behaviour: Behaviour
    ) -> None:
        self.d, self.link, self.process, self.queue = driver, link, process, queue
        self.behaviour = behaviour
        self.loop = asyncio.get_running_loop()
        self.acked = 0
        self.dead_letter = queue == DLQ
        self.record_queue = queue  # the queue the last delivery is recorded under

    async def subscribe(self) -> None:
        prefetch = max(1, self.d.w.prefetch or 100)
        headers = {"activemq.prefetchSize": str(prefetch)}
        await self.link.request(
            self.link.conn.subscribe, f"/queue/{self.queue}", "0", ack="client-individual", headers=headers
        )

    async def run(self, stop: asyncio.Event | None, idle: float = POLL) -> str:
        """Until ``stop`` (or, with ``stop`` None, until nothing came for ``idle`` seconds):
        ``stop``, ``idle``, ``closed`` (a behaviour) or ``lost``."""
        try:
            await self.subscribe()
        except Exception:  # noqa: BLE001 - refused, timed out or cut: this connection is done
            return "lost"
        held: list[tuple[str, str]] = []
        while stop is None or not stop.is_set():
            try:
                frame = await self.link.deliveries.get(idle)
            except TimeoutError:
                if stop is None:
                    return "idle"
                continue
            if frame is None:
                return "lost"
            msg_id, ack_id = self.deliver(frame)
            action, at = self.behaviour.next()
            if action is not None and self.loop.time() >= at:
                self.behaviour.done(action, self.loop.time())
                return await self.abandon([*held, (msg_id, ack_id)], action)
            if not await self.ack(msg_id, ack_id):
                return "lost"
        return "stop"

    def deliver(self, frame: Any) -> tuple[str, str]:
        msg_id, body = frame_message(frame)
        queue, detail = self.queue, dict[str, Any]()
        if self.dead_letter:  # ActiveMQ.DLQ: recorded under the dead-letter name of its own queue
            origin = str(frame.headers.get("original-destination", "")).removeprefix("/queue/")
            queue = dead_letter_queue(origin or self.queue)
            cause = frame.headers.get("dlqDeliveryFailureCause")
            detail = {"dead_letter": {"reason": cause, "queue": DLQ}}
        digest = body_digest(body)
        if digest != body_digest(message_body(msg_id, self.d.seed, self.d.w.message_size)):
            detail |= {"body": body[:200].decode(errors="backslashreplace"), "length": len(body)}
        self.d.recorder.invoke(self.process, "consume", node=self.link.node, queue=queue).ok(
            msg_id,
            redelivered=frame.headers.get("redelivered") == "true",
            digest=digest,
            detail=detail or None,
        )
        self.record_queue = queue
        return msg_id, str(frame.headers.get("ack", ""))

    async def ack(self, msg_id: str, ack_id: str) -> bool:
        if self.behaviour.slow_ack:
            await asyncio.sleep(self.behaviour.slow_ack)
        op = self.d.recorder.invoke(
            self.process, "ack", node=self.link.node, queue=self.record_queue, value=msg_id
        )
        try:
            await self.link.request(self.link.conn.ack, ack_id)
        except asyncio.CancelledError:
            op.info("cancelled before the receipt arrived")
            raise
        except Exception as exc:  # noqa: BLE001 - the broker may or may not have the ack
            op.info(reason(exc))
            return False
        op.ok()
        self.acked += 1
        return True

    async def abandon(self, held: list[tuple[str, str]], action: str) -> str:
        """Close the connection with deliveries unacked: the broker must deliver them again."""
        await self.link.close()
        for msg_id, _ack in held:
            self.d.recorder.invoke(
                self.process,
                "abandon",
                node=self.link.node,
                queue=self.record_queue,
                value=msg_id,
                detail={"cause": "crash" if action == "crash" else "close"},
            ).ok()
        return "closed"


@dataclass
class NodeView:
    consumed: int = 0
    held: int | None = None  # the depth's total (ready and unacked together)
    empty_at_ns: int | None = None
    error: str | None = None


class Drain(DriverDrain["StompDriver", NodeView]):
    """One queue's drain, one node per visit (``DrainReader``)."""

    async def visit(self, node: str, left: Callable[[], float]) -> bool | NoCopy:
        """Read and ack through ``node`` until idle, close, then ask the node's depth. A refused
        connection is a node with no copy: a slave opens no connector."""
        view = self.node_views[node]
        try:
            link = await self.d.link(node)
        except BROKER_ERRORS as exc:
            if "refused" in str(exc).lower() or isinstance(exc, stomp.exception.ConnectFailedException):
                return NoCopy(f"connection refused: {reason(exc)} (a slave opens no connector)")
            view.error = f"connect: {reason(exc)}"
            return False

        async def connected() -> Link:
            return link

        async def until_idle(link: Link, session: Session) -> bool:
            outcome = await session.run(None, idle=min(self.d.w.drain_idle, max(0.1, left())))
            if outcome != "idle":
                view.error = f"visit ended: {outcome}"
            return outcome == "idle"

        read = await self.visit_with(
            view,
            left,
            connect=connected,
            session=lambda link: Session(self.d, link, self.process, self.queue, Behaviour.none()),
            read=until_idle,
            close=lambda link: link.close(),
            errors=BROKER_ERRORS,
            drain_timeout=self.d.w.drain_timeout,
        )
        return await self.look(node, view) if read is True else read

    async def look(self, node: str, view: NodeView) -> bool:
        """The ``depth`` op: what the node holds once the drain's own connection is closed."""
        if self.d.queue_depth is None:
            view.error = None
            return True
        op = self.d.recorder.invoke(self.process, DEPTH, node=node, queue=self.queue)
        try:
            got = await self.d.queue_depth(node, self.queue)
        except Exception as exc:  # noqa: BLE001 - the node's error, tried again next round
            op.info(f"queue depth: {reason(exc)}")
            view.error = f"queue depth: {reason(exc)}"
            return False
        if got is None:
            op.info("the broker plugin cannot tell this node's depth")
            return True
        clients = sum(n for q, n in self.d.open_links.items() if q == self.queue)
        op.ok({**depth_value(got), "own_unacked": 0, "clients": clients})
        view.held = depth_value(got).get("held", None)
        if depth_empty(got):
            return self.emptied(view, self.d.recorder.now_ns())
        view.error = f"holds {view.held if view.held is not None else got} after the visit"
        return False


@hookimpl
def brokerchaos_register_clients(register: Any) -> None:
    register.add_client("stomp", StompDriver)
