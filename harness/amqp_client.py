"""The AMQP 0-9-1 workload driver, shared by every broker plugin whose protocol is ``amqp091``.

Built on aiormq (one event loop drives every producer and consumer). Each
client connects through its node's client proxy; after a failure it records the
operation as ``info`` and reconnects to the next node in turn.
"""

from __future__ import annotations

import asyncio
import itertools
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import aiormq
from pamqp import commands as spec

from harness import hookimpl
from harness.history import Recorder
from harness.scenario import WorkloadSection
from harness.workload import Endpoint, RateLimiter

CONNECT_TIMEOUT = 5.0
OP_TIMEOUT = 10.0  # any other broker round trip (channel open, qos, consume, declare)
RECONNECT_DELAY = 0.5


class _Progress:
    """Whether confirms still arrive on a connection. A broker can keep a connection
    open (heartbeats flowing) while it never confirms again -- e.g. a paused minority
    node or a queue without a leader: the producer then moves to another node."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.in_flight = 0
        self.last = loop.time()

    def sent(self) -> None:
        if self.in_flight == 0:
            self.last = self.loop.time()
        self.in_flight += 1

    def answered(self, confirmed: bool) -> None:
        self.in_flight -= 1
        if confirmed:
            self.last = self.loop.time()

    def stalled(self, after: float) -> bool:
        return self.in_flight > 0 and self.loop.time() - self.last > after


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    detail = text[0][:160] if text else ""
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


class AmqpDriver:
    def __init__(self, endpoints: Mapping[str, Endpoint], recorder: Recorder, *, workload: WorkloadSection,
                 username: str = "guest", password: str = "guest", vhost: str = "/",
                 queue_arguments: Mapping[str, Any] | None = None, first_node: Mapping[str, str] | None = None,
                 heartbeat: int = 5) -> None:
        self.endpoints = dict(endpoints)
        self.nodes = list(self.endpoints)
        self.recorder = recorder
        self.w = workload
        self.username = username
        self.password = password
        self.vhost = vhost
        self.queue_arguments = dict(queue_arguments or {})
        self.first_node = dict(first_node or {})
        self.heartbeat = heartbeat
        self.rate = RateLimiter(0)
        self._body_pad = b"x" * workload.message_size

    # -- connections ----------------------------------------------------------------------

    def url(self, node: str) -> str:
        ep = self.endpoints[node]
        vhost = urllib.parse.quote(self.vhost, safe="")
        return (f"amqp://{urllib.parse.quote(self.username)}:{urllib.parse.quote(self.password)}"
                f"@{ep.host}:{ep.port}/{vhost}?heartbeat={self.heartbeat}")

    def _rotation(self, process: str) -> itertools.cycle[str]:
        first = self.first_node.get(process, self.nodes[0])
        i = self.nodes.index(first) if first in self.nodes else 0
        return itertools.cycle(self.nodes[i:] + self.nodes[:i])

    async def _connect(self, node: str) -> aiormq.abc.AbstractConnection:
        return await asyncio.wait_for(aiormq.connect(self.url(node)), CONNECT_TIMEOUT)

    async def _channel(self, conn: Any, *, confirms: bool) -> Any:
        return await asyncio.wait_for(conn.channel(publisher_confirms=confirms), OP_TIMEOUT)

    async def setup(self, queues: Sequence[str]) -> None:
        """Declare the durable queues on the first node that answers."""
        last: BaseException | None = None
        for node in self.nodes:
            try:
                conn = await self._connect(node)
            except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
                last = exc
                continue
            try:
                ch = await self._channel(conn, confirms=False)
                for q in queues:
                    await asyncio.wait_for(ch.queue_declare(q, durable=True, arguments=self.queue_arguments),
                                           OP_TIMEOUT)
                return
            except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
                last = exc
            finally:
                await self._close(conn)
        raise ConnectionError(f"no node accepted a connection to declare the queues: {_reason(last) if last else '?'}")

    # -- producers ------------------------------------------------------------------------

    async def produce(self, process: str, queue: str, stop: asyncio.Event) -> None:
        rate = self.w.rate / max(1, self.w.producers) if self.w.rate else 0
        limiter = RateLimiter(rate)
        seq = itertools.count(1)
        window = asyncio.Semaphore(self.w.in_flight)
        props = spec.Basic.Properties(delivery_mode=2 if self.w.persistent else 1)
        nodes = self._rotation(process)
        pending: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            node = next(nodes)
            conn = None
            try:
                conn = await self._connect(node)
                ch = await self._channel(conn, confirms=True)
            except (TimeoutError, OSError, aiormq.exceptions.AMQPError):
                if conn is not None:
                    await self._close(conn)
                await self._backoff(stop)
                continue
            progress = _Progress(loop)
            try:
                while not stop.is_set() and not ch.is_closed and not progress.stalled(self.w.confirm_timeout):
                    await limiter.wait()
                    try:
                        await asyncio.wait_for(window.acquire(), 1.0)
                    except TimeoutError:
                        continue  # every slot waits on a confirm: look at stop and stall again
                    if stop.is_set() or ch.is_closed:
                        window.release()
                        break
                    msg_id = f"{process}:{next(seq)}"
                    inv = self.recorder.invoke(process, "publish", node=node, queue=queue, value=msg_id)
                    progress.sent()
                    task = asyncio.create_task(self._publish_one(ch, inv, queue, msg_id, props, progress))
                    pending.add(task)
                    task.add_done_callback(lambda t: (pending.discard(t), window.release()))
                if pending:
                    await asyncio.wait(list(pending), timeout=self.w.confirm_timeout + 1)
            finally:
                await self._close(conn)
            if not stop.is_set():
                await self._backoff(stop)
        if pending:
            await asyncio.wait(list(pending), timeout=self.w.confirm_timeout + 1)

    async def _publish_one(self, ch: Any, inv: Any, queue: str, msg_id: str, props: spec.Basic.Properties,
                           progress: _Progress) -> None:
        body = (msg_id + "|").encode() + self._body_pad[: max(0, self.w.message_size - len(msg_id) - 1)]
        p = spec.Basic.Properties(delivery_mode=props.delivery_mode, message_id=msg_id)
        try:
            # aiormq's own timeout does not cover every wait (seen hanging past it while a
            # quorum queue had no leader), so the harness bounds the whole call itself.
            confirm = await asyncio.wait_for(
                ch.basic_publish(body, routing_key=queue, properties=p, timeout=self.w.confirm_timeout),
                self.w.confirm_timeout)
        except asyncio.CancelledError:
            progress.answered(False)
            if not inv.done:
                inv.info("cancelled before the confirm arrived")
            raise
        except TimeoutError:
            progress.answered(False)
            inv.info(f"no confirm within {self.w.confirm_timeout:g}s")
            return
        except BaseException as exc:  # noqa: BLE001 - anything unexpected is indeterminate
            progress.answered(False)
            inv.info(_reason(exc))
            return
        answered = isinstance(confirm, spec.Basic.Ack | spec.Basic.Nack | spec.Basic.Reject)
        progress.answered(answered)
        if isinstance(confirm, spec.Basic.Ack):
            inv.ok()
        elif answered:
            inv.fail("nacked by the broker")
        else:
            inv.info(f"unexpected confirm {confirm!r}")

    # -- consumers ------------------------------------------------------------------------

    async def consume(self, process: str, queue: str, stop: asyncio.Event) -> None:
        nodes = self._rotation(process)
        while not stop.is_set():
            node = next(nodes)
            try:
                conn = await self._connect(node)
            except (TimeoutError, OSError, aiormq.exceptions.AMQPError):
                await self._backoff(stop)
                continue
            try:
                await self._consume_on(conn, process, node, queue, stop, idle=None)
            except (TimeoutError, OSError, aiormq.exceptions.AMQPError):
                pass
            finally:
                await self._close(conn)
            if not stop.is_set():
                await self._backoff(stop)

    async def _consume_on(self, conn: Any, process: str, node: str, queue: str, stop: asyncio.Event | None,
                          idle: float | None) -> int:
        """Consume on one connection until ``stop``, the connection dies, or ``idle`` seconds pass quietly."""
        ch = await self._channel(conn, confirms=False)
        await asyncio.wait_for(ch.basic_qos(prefetch_count=self.w.prefetch), OP_TIMEOUT)
        count = 0
        last = asyncio.get_running_loop().time()

        async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            nonlocal count, last
            props = message.header.properties
            msg_id = props.message_id or bytes(message.body).split(b"|", 1)[0].decode(errors="replace")
            redelivered = bool(message.delivery.redelivered)
            inv = self.recorder.invoke(process, "consume", node=node, queue=queue)
            inv.ok(msg_id, redelivered=redelivered)
            count += 1
            last = asyncio.get_running_loop().time()
            ack = self.recorder.invoke(process, "ack", node=node, queue=queue, value=msg_id)
            try:
                await asyncio.wait_for(ch.basic_ack(message.delivery.delivery_tag), OP_TIMEOUT)
                ack.ok()
            except BaseException as exc:  # noqa: BLE001
                ack.info(_reason(exc))

        await asyncio.wait_for(ch.basic_consume(queue, on_message, no_ack=False), OP_TIMEOUT)
        closing = conn.closing
        while True:
            waiters = [closing] + ([asyncio.ensure_future(stop.wait())] if stop is not None else [])
            done, rest = await asyncio.wait(waiters, timeout=0.25, return_when=asyncio.FIRST_COMPLETED)
            for w in rest:
                if w is not closing:
                    w.cancel()
            if closing.done() or ch.is_closed:
                return count
            if stop is not None and stop.is_set():
                return count
            if idle is not None and asyncio.get_running_loop().time() - last > idle:
                declared = await asyncio.wait_for(ch.queue_declare(queue, passive=True), OP_TIMEOUT)
                if declared.message_count == 0:
                    return count
                last = asyncio.get_running_loop().time()

    # -- drain ----------------------------------------------------------------------------

    async def drain(self, process: str, queue: str) -> int:
        """Consume everything left in ``queue`` (after every fault healed), trying each node."""
        inv = self.recorder.invoke(process, "drain", queue=queue, value={})
        deadline = asyncio.get_running_loop().time() + self.w.drain_timeout
        total = 0
        errors: list[str] = []
        nodes = self._rotation(process)
        for node in itertools.islice(nodes, 10_000):
            if asyncio.get_running_loop().time() > deadline:
                break
            try:
                conn = await self._connect(node)
            except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
                errors.append(f"{node}: {_reason(exc)}")
                await asyncio.sleep(RECONNECT_DELAY)
                continue
            try:
                remaining = max(1.0, deadline - asyncio.get_running_loop().time())
                total += await asyncio.wait_for(
                    self._consume_on(conn, process, node, queue, None, idle=self.w.drain_idle), remaining)
                inv.ok({"consumed": total, "node": node})
                return total
            except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
                errors.append(f"{node}: {_reason(exc)}")
            finally:
                await self._close(conn)
            await asyncio.sleep(RECONNECT_DELAY)
        inv.info(f"drain did not finish in {self.w.drain_timeout:.0f}s: " + "; ".join(errors[-3:]),
                 {"consumed": total})
        return total

    # -- helpers --------------------------------------------------------------------------

    async def _backoff(self, stop: asyncio.Event) -> None:
        try:
            await asyncio.wait_for(stop.wait(), RECONNECT_DELAY)
        except TimeoutError:
            pass

    @staticmethod
    async def _close(conn: Any) -> None:
        try:
            await asyncio.wait_for(conn.close(), 2.0)
        except BaseException:  # noqa: BLE001 - the connection may already be gone
            pass


def make_driver(endpoints: Mapping[str, Endpoint], recorder: Recorder, **options: Any) -> AmqpDriver:
    return AmqpDriver(endpoints, recorder, **options)


@hookimpl
def brokerchaos_register_clients(register: Any) -> None:
    register.add_client("amqp091", make_driver)
