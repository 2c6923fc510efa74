"""The AMQP 0-9-1 workload driver, shared by every broker plugin whose protocol is ``amqp091``.

Built on aiormq (one event loop drives every producer and consumer). Each
client connects through its node's client proxy; after a failure it records the
operation as ``info`` and reconnects to the next node in turn. Producers live
here; consuming is ``plugins.amqp091.consumer``, the final drain
``plugins.amqp091.drain``.
"""

from __future__ import annotations

import asyncio
import itertools
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiormq
from pamqp import commands as spec

from harness import hookimpl
from harness.spec import (
    DEAD_LETTER_EXCHANGE,
    DELAYED_EXCHANGE,
    Delays,
    Endpoint,
    RateLimiter,
    Recorder,
    dead_letter_queue,
    message_body,
)
from harness.spec.client import DriverBase, acquired, reason, through_first_answering, wait_or_stop
from plugins.amqp091.consumer import RECONNECT_DELAY, run_consumer
from plugins.amqp091.drain import Drain
from plugins.amqp091.link import BROKER_ERRORS, OP_TIMEOUT, Link
from plugins.amqp091.tx import TxConsumer, TxProducer


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


def confirm_outcome(confirm: object) -> tuple[str, str | None]:
    """A publish's completion from what ``basic_publish`` gave back: a ``basic.ack`` is ``ok``; a
    ``basic.nack`` (returned, or raised inside aiormq's ``DeliveryError``) is ``fail``: the
    broker says it did not take the message; so is a ``basic.return`` of a mandatory publish
    (raised inside aiormq's ``PublishError``): no queue took it, though the ``basic.ack`` that
    follows it says the broker is done with it; anything else is ``info``."""
    if isinstance(confirm, aiormq.exceptions.DeliveryError):
        confirm = confirm.frame
    if isinstance(confirm, spec.Basic.Ack):
        return "ok", None
    if isinstance(confirm, spec.Basic.Nack | spec.Basic.Reject):
        return "fail", "nacked by the broker"
    if isinstance(confirm, spec.Basic.Return):
        return "fail", f"returned by the broker: {confirm.reply_code} {confirm.reply_text} (no queue took it)"
    return "info", f"unexpected confirm {confirm!r}"


class AmqpDriver(DriverBase):
    #: Seconds between heartbeats the driver asks for: a silent broker is noticed within two.
    heartbeat = 5

    def __init__(self, endpoints: Mapping[str, Endpoint], recorder: Recorder, **options: Any) -> None:
        super().__init__(endpoints, recorder, **options)  # AMQP's settings are the queue_arguments
        self._consumer_links: dict[str, set[Link]] = {}

    # -- connections ----------------------------------------------------------------------

    def url(self, node: str) -> str:
        ep = self.endpoints[node]
        vhost = urllib.parse.quote(self.vhost, safe="")
        return (
            f"amqp://{urllib.parse.quote(self.username)}:{urllib.parse.quote(self.password)}"
            f"@{ep.host}:{ep.port}/{vhost}?heartbeat={self.heartbeat}"
        )

    async def _connect(self, node: str) -> Link:
        return await Link.open(node, self.url(node))

    def _consumer_connect(self, queue: str) -> Callable[[str], Awaitable[Link]]:
        """``_connect`` for a consumer of ``queue``: its links are counted by ``_clients``."""

        async def connect(node: str) -> Link:
            link = await self._connect(node)
            self._consumer_links.setdefault(queue, set()).add(link)
            return link

        return connect

    def _clients(self, queue: str) -> int:
        """The workload's consumer connections still open on ``queue`` (which may hold deliveries)."""
        links = self._consumer_links.get(queue, set())
        links.difference_update([link for link in links if link.closed])
        return len(links)

    async def setup(self, queues: Sequence[str]) -> None:
        """Declare the durable queues on the first node that answers."""

        async def declare(link: Link) -> None:
            ch = await link.channel(confirms=False)
            if self.w.dead_letter:
                await self._declare_dead_letter(ch, queues)
            for q in queues:
                async with asyncio.timeout(OP_TIMEOUT):
                    await ch.queue_declare(q, durable=True, arguments=self._workload_queue_arguments())
            if self.w.delay is not None:
                await self._declare_delayed(ch, queues)

        await through_first_answering(
            self.nodes,
            self._connect,
            Link.close,
            declare,
            errors=BROKER_ERRORS,
            what="no node accepted a connection to declare the queues",
        )

    def _workload_queue_arguments(self) -> dict[str, Any]:
        """The broker plugin's arguments, and ``workload.ttl_ms`` / ``workload.dead_letter``'s."""
        args = dict(self.queue_arguments)
        if self.w.ttl_ms is not None:
            args["x-message-ttl"] = self.w.ttl_ms
        if self.w.dead_letter:
            args["x-dead-letter-exchange"] = DEAD_LETTER_EXCHANGE
        return args

    async def _declare_dead_letter(self, ch: Any, queues: Sequence[str]) -> None:
        """``workload.dead_letter``: a direct exchange; each queue's dead-letter queue bound by the
        queue's name (a message dead-letters with the routing key it was published with, the
        queue's name). Declared before the queues that name the exchange."""
        async with asyncio.timeout(OP_TIMEOUT):
            await ch.exchange_declare(DEAD_LETTER_EXCHANGE, exchange_type="direct", durable=True)
        for q in queues:
            dlq = dead_letter_queue(q)
            async with asyncio.timeout(OP_TIMEOUT):
                await ch.queue_declare(dlq, durable=True, arguments=self.queue_arguments)
            async with asyncio.timeout(OP_TIMEOUT):
                await ch.queue_bind(dlq, DEAD_LETTER_EXCHANGE, routing_key=q)

    async def _declare_delayed(self, ch: Any, queues: Sequence[str]) -> None:
        """``workload.delay``: a delayed-message exchange routing like ``direct``, each queue bound by its name."""
        async with asyncio.timeout(OP_TIMEOUT):
            await ch.exchange_declare(
                DELAYED_EXCHANGE,
                exchange_type="x-delayed-message",
                durable=True,
                arguments={"x-delayed-type": "direct"},
            )
        for q in queues:
            async with asyncio.timeout(OP_TIMEOUT):
                await ch.queue_bind(q, DELAYED_EXCHANGE, routing_key=q)

    # -- producers ------------------------------------------------------------------------

    async def produce(self, process: str, queue: str, stop: asyncio.Event) -> None:
        rate = self.w.rate / max(1, self.w.producers) if self.w.rate else 0
        tx = self.w.transactions
        if tx is not None and tx.publish_batch:
            await TxProducer(
                self._connect,
                self.rotation(process),
                self.recorder,
                process,
                queue,
                tx,
                rate=rate,
                seed=self.seed,
                message_size=self.w.message_size,
                persistent=self.w.persistent,
                commit_timeout=self.w.confirm_timeout,
                expiration_ms=self.w.expiration_ms,
            ).run(stop)
            return
        limiter = RateLimiter(rate)
        seq = itertools.count(1)
        window = asyncio.Semaphore(self.w.in_flight)
        props = spec.Basic.Properties(delivery_mode=2 if self.w.persistent else 1)
        nodes = self.rotation(process)
        pending: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        delays = Delays(self.w.delay, self.seed, process)
        while not stop.is_set():
            node = next(nodes)
            link = None
            try:
                link = await self._connect(node)
                ch = await link.channel(confirms=True)
            except BROKER_ERRORS:
                if link is not None:
                    await link.close()
                await self._backoff(stop)
                continue
            progress = _Progress(loop)
            try:
                while not stop.is_set() and not ch.is_closed and not progress.stalled(self.w.confirm_timeout):
                    await limiter.wait()
                    if not await acquired(window, 1.0):
                        continue  # every slot waits on a confirm: look at stop and stall again
                    if stop.is_set() or ch.is_closed:
                        window.release()
                        break
                    msg_id = f"{process}:{next(seq)}"
                    delay = delays.next()
                    inv = self.recorder.invoke(
                        process,
                        "publish",
                        node=node,
                        queue=queue,
                        value=msg_id,
                        detail=None if delay is None else {"delay_ms": delay},
                    )
                    progress.sent()
                    task = asyncio.create_task(
                        self._publish_one(ch, inv, queue, msg_id, props, progress, delay)
                    )
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    task.add_done_callback(lambda _t: window.release())
                if pending:
                    await asyncio.wait(list(pending), timeout=self.w.confirm_timeout + 1)
            finally:
                await link.close()
            if not stop.is_set():
                await self._backoff(stop)
        if pending:
            await asyncio.wait(list(pending), timeout=self.w.confirm_timeout + 1)

    async def _publish_one(
        self,
        ch: Any,
        inv: Any,
        queue: str,
        msg_id: str,
        props: spec.Basic.Properties,
        progress: _Progress,
        delay: int | None = None,
    ) -> None:
        body = message_body(msg_id, self.seed, self.w.message_size)
        p = spec.Basic.Properties(delivery_mode=props.delivery_mode, message_id=msg_id)
        if self.w.expiration_ms is not None:
            p.expiration = str(self.w.expiration_ms)
        exchange = ""
        if delay is not None:
            p.headers, exchange = {"x-delay": delay}, DELAYED_EXCHANGE
        try:
            # aiormq's own timeout does not cover every wait (seen hanging past it while a
            # quorum queue had no leader), so the harness bounds the whole call itself.
            # Mandatory: a broker confirms a publish no queue took (RabbitMQ's "confirms" guide:
            # the basic.return comes before the basic.ack), e.g. on a node reset out of its
            # cluster, which has no queue; without the return that ack reads as kept. Not for a
            # delayed publish: the delayed exchange returns every one (delayed-message-exchange#7).
            async with asyncio.timeout(self.w.confirm_timeout):
                confirm = await ch.basic_publish(
                    body,
                    exchange=exchange,
                    routing_key=queue,
                    properties=p,
                    mandatory=delay is None,
                    timeout=self.w.confirm_timeout,
                )
        except asyncio.CancelledError:
            progress.answered(False)
            if not inv.done:
                inv.info("cancelled before the confirm arrived")
            raise
        except TimeoutError:
            progress.answered(False)
            inv.info(f"no confirm within {self.w.confirm_timeout:g}s")
            return
        except aiormq.exceptions.DeliveryError as exc:
            confirm = exc  # aiormq raises a broker's basic.nack instead of returning it
        except BaseException as exc:  # noqa: BLE001 - anything unexpected is indeterminate
            progress.answered(False)
            inv.info(reason(exc))
            return
        outcome, error = confirm_outcome(confirm)
        progress.answered(outcome != "info")
        if outcome == "ok":
            inv.ok()
        elif outcome == "fail":
            inv.fail(error or "nacked")
        else:
            inv.info(error or "unknown")

    # -- consumers ------------------------------------------------------------------------

    async def consume(self, process: str, queue: str, stop: asyncio.Event) -> None:
        tx = self.w.transactions
        if tx is not None and tx.ack_batch:
            await TxConsumer(
                self._consumer_connect(queue),
                self.rotation(process),
                self.recorder,
                process,
                queue,
                tx,
                seed=self.seed,
                message_size=self.w.message_size,
                prefetch=self.w.prefetch,
                commit_timeout=self.w.confirm_timeout,
            ).run(stop)
            return
        behaviour = self.behaviour(process, asyncio.get_running_loop().time())
        await run_consumer(
            self._consumer_connect(queue),
            self.rotation(process),
            self.recorder,
            process,
            queue,
            stop,
            seed=self.seed,
            message_size=self.w.message_size,
            prefetch=self.w.prefetch,
            behaviour=behaviour,
        )

    # -- drain ----------------------------------------------------------------------------

    def drain_reader(self, process: str, queue: str) -> Drain:
        """``queue``'s final drain, one node per visit (after every fault healed); the harness
        runs the rounds (``harness.spec.client.DrainReader``)."""
        return Drain(
            nodes=list(self.nodes),
            open_link=self._connect,
            recorder=self.recorder,
            process=process,
            queue=queue,
            depth=self.queue_depth,
            seed=self.seed,
            message_size=self.w.message_size,
            prefetch=self.w.prefetch,
            idle=self.w.drain_idle,
            timeout=self.w.drain_timeout,
            clients=lambda: self._clients(queue),
            holders=self.queue_holders,
        )

    # -- helpers --------------------------------------------------------------------------

    async def _backoff(self, stop: asyncio.Event) -> None:
        await wait_or_stop(stop, RECONNECT_DELAY)


@hookimpl
def brokerchaos_register_clients(register: Any) -> None:
    register.add_client("amqp091", AmqpDriver)
