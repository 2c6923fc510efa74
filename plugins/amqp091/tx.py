"""Transactional producers and consumers over AMQP 0-9-1 (``workload.transactions``).

What they write to the history follows ``harness.spec.history``:

- a producer publishes ``publish_batch`` messages inside ``tx.select`` (each a
  ``publish`` invoke) and ends the batch with ``tx.commit`` (a ``commit`` op) or,
  with probability ``rollback``, ``tx.rollback`` (a ``rollback`` op); ``detail``
  lists the ids (``{"publish": [...]}``). The publishes complete with the
  transaction: ``ok`` on commit-ok, ``fail`` when it certainly did not commit
  (rolled back, or the channel died before tx.commit was sent: the broker rolls
  back an open transaction when its channel closes), ``info`` when the commit's
  answer never came.
- a consumer acks ``ack_batch`` deliveries per transaction (``ack`` invokes, then
  a ``commit`` or ``rollback`` op with ``{"ack": [...]}``); commit-ok completes the
  acks ``ok``; a rollback completes them ``fail`` and the deliveries are unacked
  again on the channel (RabbitMQ's rollback), so they are acked in the next
  transaction. Deliveries unacked when a channel ends are ``abandon`` ops.

A transaction's ids are all for one queue: the unit AMQP asks servers to make atomic.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiormq
from pamqp import commands as spec

from harness.spec import Invocation, RateLimiter, Recorder, TransactionsSection, body_digest, message_body
from harness.spec.client import reason, wait_or_stop
from plugins.amqp091.link import BROKER_ERRORS, OP_TIMEOUT, Link

IDLE_COMMIT = 0.2  # seconds without a new delivery before a consumer commits a short batch
RECONNECT_DELAY = 0.5


@dataclass
class _TxProcess:
    """What a transactional producer and consumer are both handed: how to reach a node and which
    one next, where to record, and the transaction settings."""

    open_link: Callable[[str], Awaitable[Link]]
    nodes: Iterator[str]
    recorder: Recorder
    process: str
    queue: str
    tx: TransactionsSection
    seed: int
    message_size: int
    commit_timeout: float

    def __post_init__(self) -> None:
        self._txn = itertools.count(1)

    async def end_transaction(
        self,
        node: str,
        ch: Any,
        tx_id: str,
        detail: dict[str, list[str]],
        ops: list[Invocation],
        rollback: bool,
    ) -> bool:
        """tx.commit or tx.rollback, completing the transaction's own ``ops`` with its outcome.

        Returns whether the channel can go on.
        """
        f = "rollback" if rollback else "commit"
        op = self.recorder.invoke(self.process, f, node=node, queue=self.queue, value=tx_id, detail=detail)
        try:
            # the harness bounds the round trip itself (aiormq's timeouts do not cover every wait)
            async with asyncio.timeout(self.commit_timeout):
                await (ch.tx_rollback() if rollback else ch.tx_commit())
        except asyncio.CancelledError:
            op.info("cancelled before the answer")
            _complete(ops, rollback, "cancelled before the answer")
            raise
        except BROKER_ERRORS as exc:
            op.info(reason(exc))
            _complete(ops, rollback, reason(exc))
            return False
        op.ok()
        _complete(ops, rollback, None)
        return True


@dataclass
class TxProducer(_TxProcess):
    """One producer process publishing in transactions; reconnects to the next node after a failure."""

    rate: float
    persistent: bool
    expiration_ms: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.limiter = RateLimiter(self.rate)
        self.delivery_mode = 2 if self.persistent else 1
        self.expiration = (
            None if self.expiration_ms is None else str(self.expiration_ms)
        )  # workload.expiration_ms
        self.rng = random.Random(f"{self.seed}:{self.process}:tx")
        self._seq = itertools.count(1)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            node = next(self.nodes)
            link: Link | None = None
            try:
                link = await self.open_link(node)
                ch = await link.channel(confirms=False)
                async with asyncio.timeout(OP_TIMEOUT):
                    await ch.tx_select()
            except BROKER_ERRORS:
                if link is not None:
                    await link.close()
                await wait_or_stop(stop, RECONNECT_DELAY)
                continue
            try:
                while not stop.is_set() and not ch.is_closed:
                    if not await self._one(node, ch):
                        break
            finally:
                await link.close()
            if not stop.is_set():
                await wait_or_stop(stop, RECONNECT_DELAY)

    async def _one(self, node: str, ch: Any) -> bool:
        """Publish one batch and end its transaction; False once the channel is unusable."""
        ids: list[str] = []
        pubs: list[Invocation] = []
        broken: str | None = None
        for _ in range(self.tx.publish_batch):
            await self.limiter.wait()
            msg_id = f"{self.process}:{next(self._seq)}"
            pubs.append(
                self.recorder.invoke(self.process, "publish", node=node, queue=self.queue, value=msg_id)
            )
            ids.append(msg_id)
            props = spec.Basic.Properties(
                delivery_mode=self.delivery_mode, message_id=msg_id, expiration=self.expiration
            )
            try:
                async with asyncio.timeout(OP_TIMEOUT):
                    await ch.basic_publish(
                        message_body(msg_id, self.seed, self.message_size),
                        routing_key=self.queue,
                        properties=props,
                    )
            except BROKER_ERRORS as exc:
                broken = reason(exc)
                break
        tx_id = f"{self.process}:tx{next(self._txn)}"
        detail = {"publish": ids}
        if broken is not None:
            # tx.commit was never sent: the broker rolls the transaction back with its channel
            op = self.recorder.invoke(
                self.process, "rollback", node=node, queue=self.queue, value=tx_id, detail=detail
            )
            op.ok(detail={"cause": f"channel lost before tx.commit: {broken}"})
            for p in pubs:
                p.fail(f"transaction never committed: {broken}")
            return False
        return await self.end_transaction(node, ch, tx_id, detail, pubs, self.rng.random() < self.tx.rollback)


def _complete(ops: list[Invocation], rollback: bool, failure: str | None) -> None:
    for o in ops:
        if (
            rollback
        ):  # a rollback whose answer never came still rolled back: the channel goes, its transaction too
            o.fail("rolled back" if failure is None else f"rolled back: {failure}")
        elif failure is None:
            o.ok()
        else:
            o.info(f"commit unknown: {failure}")


@dataclass
class TxConsumer(_TxProcess):
    """One consumer process acking in transactions of ``ack_batch`` deliveries."""

    prefetch: int

    def __post_init__(self) -> None:
        super().__post_init__()
        # a batch must fit in what the broker lets us hold (0: no limit)
        self.prefetch = self.prefetch and max(self.prefetch, self.tx.ack_batch)
        self.rng = random.Random(f"{self.seed}:{self.process}:txack")

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            node = next(self.nodes)
            try:
                link = await self.open_link(node)
            except BROKER_ERRORS:
                await wait_or_stop(stop, RECONNECT_DELAY)
                continue
            held: list[tuple[int, str]] = []
            clean = False
            try:
                clean = await self._session(link, node, held, stop)
            except BROKER_ERRORS:
                clean = False
            finally:
                clean = await link.close() and clean
                cause = "close" if clean else "crash"
                for _tag, msg_id in held:
                    ab = self.recorder.invoke(
                        self.process,
                        "abandon",
                        node=node,
                        queue=self.queue,
                        value=msg_id,
                        detail={"cause": cause},
                    )
                    (ab.ok() if clean else ab.info(link.failure()))
            if not stop.is_set():
                await wait_or_stop(stop, RECONNECT_DELAY)

    async def _session(self, link: Link, node: str, held: list[tuple[int, str]], stop: asyncio.Event) -> bool:
        ch = await link.channel(confirms=False)
        async with asyncio.timeout(OP_TIMEOUT):
            await ch.basic_qos(prefetch_count=self.prefetch)
        async with asyncio.timeout(OP_TIMEOUT):
            await ch.tx_select()
        arrived = asyncio.Event()
        loop = asyncio.get_running_loop()
        last = [loop.time()]

        async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            body = bytes(message.body)
            msg_id = message.header.properties.message_id or body.split(b"|", 1)[0].decode(errors="replace")
            digest = body_digest(body)
            detail = None
            if digest != body_digest(message_body(msg_id, self.seed, self.message_size)):
                detail = {"body": body[:200].decode(errors="backslashreplace"), "length": len(body)}
            frame: Any = message.delivery
            self.recorder.invoke(self.process, "consume", node=node, queue=self.queue).ok(
                msg_id, redelivered=bool(frame.redelivered), digest=digest, detail=detail
            )
            held.append((int(frame.delivery_tag), msg_id))
            last[0] = loop.time()
            arrived.set()

        async with asyncio.timeout(OP_TIMEOUT):
            await ch.basic_consume(self.queue, on_message, no_ack=False)
        batch = self.tx.ack_batch
        while not ch.is_closed:
            if stop.is_set():
                if held and not await self._ack(node, ch, held, len(held), rollback=False):
                    return False
                async with asyncio.timeout(OP_TIMEOUT):
                    await ch.close()
                return True
            if len(held) >= batch or (held and loop.time() - last[0] >= IDLE_COMMIT):
                if not await self._ack(
                    node, ch, held, min(batch, len(held)), rollback=self.rng.random() < self.tx.rollback
                ):
                    return False
                continue
            arrived.clear()
            try:
                async with asyncio.timeout(IDLE_COMMIT):
                    await arrived.wait()
            except TimeoutError:
                pass
        return False

    async def _ack(self, node: str, ch: Any, held: list[tuple[int, str]], n: int, *, rollback: bool) -> bool:
        """Ack the ``n`` oldest held deliveries in one transaction; on rollback they stay held (unacked)."""
        batch = held[:n]
        ops = [
            self.recorder.invoke(self.process, "ack", node=node, queue=self.queue, value=msg_id)
            for _tag, msg_id in batch
        ]
        try:
            # every older delivery is acked or in this batch: one multiple ack covers exactly the batch
            async with asyncio.timeout(OP_TIMEOUT):
                await ch.basic_ack(batch[-1][0], multiple=True)
        except BROKER_ERRORS as exc:
            for o in ops:
                o.fail(f"transaction never committed: {reason(exc)}")
            return False
        tx_id = f"{self.process}:tx{next(self._txn)}"
        detail = {"ack": [msg_id for _tag, msg_id in batch]}
        going = await self.end_transaction(node, ch, tx_id, detail, ops, rollback)
        if not rollback:
            del held[:n]  # acked, or their ack unknown: not given back either way
        return going
