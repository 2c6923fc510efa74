"""Consuming over AMQP 0-9-1: what a delivery, an ack and a delivery given back mean in the history.

The rules are the schema's (``harness.spec.history``): a ``consume`` record is a
delivery, not a consumption; an ``ack`` is ``ok`` only once the broker certainly
processed it. AMQP processes a channel's frames in order, so an ack is certain
once a later synchronous round trip on the same channel has completed: a session
sends ``basic.qos`` with its own prefetch as that barrier (batched), and a clean
``channel.close`` is one too. A channel or connection that fails first leaves its
acks ``info``. Every delivery still unacked when a channel ends is an ``abandon``
with its cause; the broker must deliver it again.

Consumer behaviours (scenario ``workload.consumer``) give deliveries back on
purpose -- nack/reject with requeue, ``basic.recover``, closing the channel,
cutting the connection as a killed process would -- so the checkers see
redelivery exercised, not just assumed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiormq

from harness.spec import Invocation, Recorder, body_digest, is_dead_letter_queue, message_body
from harness.spec.client import Behaviour, reason, wait_or_stop
from plugins.amqp091.link import BROKER_ERRORS, OP_TIMEOUT, Link

BARRIER_EVERY = 0.025  # seconds between barriers while acks wait for one
BARRIER_BATCH = 64  # this many acks waiting start a barrier at once
HOLD_WAIT = 1.0  # seconds a behaviour waits for deliveries to hold before it acts
CLOSE_TIMEOUT = 5.0  # a consumer's channel close at the end of the workload; then the connection is cut
RECONNECT_DELAY = 0.5


def death(headers: Any) -> dict[str, Any]:
    """A dead-lettered delivery's newest ``x-death`` entry as the history records it: why it died and
    in which queue (``harness.spec.history``); None each when the message carries none."""
    deaths = (headers or {}).get("x-death") if isinstance(headers, dict) else None
    first = deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict) else {}
    out = {}
    for key in ("reason", "queue"):
        v = first.get(key)
        out[key] = v.decode(errors="replace") if isinstance(v, bytes) else v if isinstance(v, str) else None
    return out


@dataclass
class Delivery:
    tag: int
    msg_id: str


class Session:
    """One consuming channel on one link: its deliveries, acks and what it gave back."""

    def __init__(
        self,
        link: Link,
        recorder: Recorder,
        process: str,
        queue: str,
        *,
        seed: int,
        message_size: int,
        prefetch: int,
        behaviour: Behaviour | None = None,
    ) -> None:
        self.link = link
        self.node = link.node
        self.recorder = recorder
        self.process = process
        self.queue = queue
        self.seed = seed
        self.message_size = message_size
        self.prefetch = prefetch
        self.behaviour = behaviour or Behaviour.none()
        self.loop = asyncio.get_running_loop()
        self.ch: Any = None
        self.consumer_tag: str | None = None
        self.held: dict[int, Delivery] = {}  # delivered, neither acked nor given back
        self.unconfirmed: list[Invocation] = []  # acks and nacks written, waiting for a barrier
        self.acked = 0  # acks completed ok
        self.last_delivery = self.loop.time()
        self.holding = False  # a behaviour is gathering deliveries: acks wait
        self.ending: str | None = None  # the abandon cause once the channel is being given up
        self._late: list[Invocation] = []  # abandons waiting for the end's outcome
        self._ended: tuple[bool, bool, str] | None = None  # (abandons ok, acks ok, why not)
        self._failed: str | None = None
        self._writing = 0  # acks and nacks being written
        self._written = asyncio.Event()  # set while none is
        self._written.set()
        self._arrived = asyncio.Event()
        self._wake = asyncio.Event()
        self._barrier_lock = asyncio.Lock()
        self._barriers: asyncio.Task[None] | None = None

    # -- opening and consuming ----------------------------------------------------------------

    async def open(self) -> None:
        self.ch = await self.link.channel(confirms=False)
        async with asyncio.timeout(OP_TIMEOUT):
            await self.ch.basic_qos(prefetch_count=self.prefetch)
        await self.consume()
        self._barriers = asyncio.create_task(self._barrier_loop())

    async def consume(self) -> None:
        async with asyncio.timeout(OP_TIMEOUT):
            ok = await self.ch.basic_consume(self.queue, self._on_message, no_ack=False)
        self.consumer_tag = ok.consumer_tag

    async def cancel(self) -> None:
        """Stop the deliveries. Once ``basic.cancel-ok`` is in, every delivery sent before it has
        been read (one channel's frames arrive in order) and its callback registered it."""
        tag, self.consumer_tag = self.consumer_tag, None
        if tag is not None:
            async with asyncio.timeout(OP_TIMEOUT):
                await self.ch.basic_cancel(tag)

    def cancelled_by_broker(self) -> bool:
        """The broker sent ``basic.cancel`` (queue deleted, failover): nothing more will come."""
        return self.consumer_tag is not None and self.consumer_tag not in self.ch.consumers

    @property
    def ended(self) -> bool:
        return self._ended is not None

    def broken(self) -> str | None:
        """Why this channel can no longer be used, or None."""
        if self.link.closed:
            return self.link.failure()
        if self.ch is not None and self.ch.is_closed:
            fut = self.ch.closing
            exc = fut.exception() if fut.done() and not fut.cancelled() else None
            return reason(exc) if exc is not None else "channel closed"
        return self._failed

    async def _on_message(self, message: aiormq.abc.DeliveredMessage) -> None:
        # Runs up to its first await before any later frame of the channel is handled, so
        # a delivery is registered before a cancel-ok or recover-ok that followed it.
        body = bytes(message.body)
        msg_id = message.header.properties.message_id or body.split(b"|", 1)[0].decode(errors="replace")
        digest = body_digest(body)
        detail: dict[str, Any] | None = None
        if digest != body_digest(message_body(msg_id, self.seed, self.message_size)):
            detail = {"body": body[:200].decode(errors="backslashreplace"), "length": len(body)}
        if is_dead_letter_queue(self.queue):
            detail = {**(detail or {}), "dead_letter": death(message.header.properties.headers)}
        frame: Any = message.delivery  # a basic.deliver on a consumer
        self.recorder.invoke(self.process, "consume", node=self.node, queue=self.queue).ok(
            msg_id, redelivered=bool(frame.redelivered), digest=digest, detail=detail
        )
        d = Delivery(int(frame.delivery_tag), msg_id)
        self.last_delivery = self.loop.time()
        if self.ending is not None:
            self._give_back_late(d)
            return
        self.held[d.tag] = d
        self._arrived.set()
        if not self.holding:
            await self._settle(d)

    async def _settle(self, d: Delivery) -> None:
        if self.behaviour.slow_ack:
            await asyncio.sleep(self.behaviour.slow_ack)
        if self.held.get(d.tag) is not d or self.holding or self.ending is not None:
            return  # given back meanwhile, or kept for a behaviour about to act
        del self.held[d.tag]
        b = self.behaviour
        if b.requeue and b.rng.random() < b.requeue:
            await self._write(d, "abandon", reject=b.rng.random() < 0.5)
        else:
            await self._write(d, "ack")

    async def _write(self, d: Delivery, f: str, *, reject: bool = False) -> None:
        detail = {"cause": "requeue"} if f == "abandon" else None
        op = self.recorder.invoke(
            self.process, f, node=self.node, queue=self.queue, value=d.msg_id, detail=detail
        )
        self._writing += 1
        self._written.clear()
        try:
            if f == "ack":
                async with asyncio.timeout(OP_TIMEOUT):
                    await self.ch.basic_ack(d.tag)
            elif reject:
                async with asyncio.timeout(OP_TIMEOUT):
                    await self.ch.basic_reject(d.tag, requeue=True)
            else:
                async with asyncio.timeout(OP_TIMEOUT):
                    await self.ch.basic_nack(d.tag, requeue=True)
        except asyncio.CancelledError:
            op.info("cancelled while the frame was written")
            raise
        except Exception as exc:  # noqa: BLE001 - whatever stopped the write, the broker may have it
            op.info(reason(exc))
            return
        finally:
            self._writing -= 1
            if not self._writing:
                self._written.set()
        if self._ended is not None:  # the channel ended while the frame was written
            self._complete([op])
            return
        self.unconfirmed.append(op)
        if len(self.unconfirmed) >= BARRIER_BATCH:
            self._wake.set()

    # -- barriers ----------------------------------------------------------------------------

    async def barrier(self) -> bool:
        """Complete every ack and nack written so far as ``ok`` after a ``basic.qos`` round trip.

        False if the round trip failed: those operations stay open for whatever ends the
        channel, which completes them ``info``.
        """
        async with self._barrier_lock:
            if self._ended is not None or self._failed is not None:
                return False
            if not self.unconfirmed:
                return True
            batch, self.unconfirmed = self.unconfirmed, []
            try:
                async with asyncio.timeout(OP_TIMEOUT):
                    await self.ch.basic_qos(prefetch_count=self.prefetch)
            except BaseException as exc:
                self.unconfirmed[:0] = batch
                if isinstance(exc, asyncio.CancelledError):
                    raise
                self._failed = f"barrier: {reason(exc)}"
                return False
            for op in batch:  # the round trip completed: certain even if the channel ended since
                if not op.done:
                    op.ok()
                    self.acked += op.f == "ack"
            return True

    async def confirm_written(self, timeout: float) -> bool:
        """Wait for acks being written, then confirm them all with one barrier (within ``timeout``)."""
        try:
            async with asyncio.timeout(timeout / 2):
                await self._written.wait()
            async with asyncio.timeout(timeout / 2):
                return await self.barrier()
        except TimeoutError:
            return False

    async def _barrier_loop(self) -> None:
        while self._ended is None:
            try:
                async with asyncio.timeout(BARRIER_EVERY):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if self.unconfirmed and not await self.barrier():
                return

    # -- holding deliveries and giving them back -----------------------------------------------

    async def hold(self, target: int, wait: float, stop: asyncio.Event) -> int:
        """Stop acking and wait until ``target`` deliveries are held (at most ``wait`` seconds)."""
        self.holding = True
        deadline = self.loop.time() + wait
        while len(self.held) < target and not stop.is_set() and self.broken() is None:
            left = deadline - self.loop.time()
            if left <= 0:
                break
            self._arrived.clear()
            try:
                async with asyncio.timeout(min(left, 0.1)):
                    await self._arrived.wait()
            except TimeoutError:
                pass
        return len(self.held)

    async def recover(self) -> None:
        """``basic.recover(requeue=true)`` of everything held. The consumer is cancelled first, so
        no delivery is in flight that the recover would take back unseen; then it resumes."""
        await self.cancel()
        ops = [self._abandon(d, "recover") for d in self._take_held()]
        try:
            async with asyncio.timeout(OP_TIMEOUT):
                await self.ch.basic_recover(requeue=True)
        except BaseException as exc:
            for op in ops:
                op.info(reason(exc))
            raise
        for op in ops:
            op.ok()
        self.holding = False
        await self.consume()

    async def close(self, cause: str = "close", timeout: float = CLOSE_TIMEOUT) -> bool:
        """Close the channel, giving back what it holds; True if the broker answered the close.

        A close the broker leaves unanswered within ``timeout`` (a stuck connection: it may
        still hold these deliveries) ends with the connection cut, which frees them.
        """
        if self._ended is not None:
            return False
        deadline = self.loop.time() + timeout
        await self.confirm_written(timeout / 2)  # acks written so far become ok whatever the close does
        self._begin_end(cause)
        why = self.broken()
        if why is not None:  # nothing to close: the broker gives these back when it notices
            self._finish(False, False, why)
            return False
        clean = False
        try:
            async with asyncio.timeout(max(0.1, deadline - self.loop.time())):
                await self.ch.close()
            clean = _closed_cleanly(self.ch)
        except asyncio.CancelledError:
            self.link.abort()
            self._finish(True, False, "cancelled while closing; connection cut")
            raise
        except Exception:  # noqa: BLE001 - judged below by the state of the link
            pass
        if clean:
            self._finish(True, True, "")
        elif self.link.closed:
            self._finish(False, False, self.link.failure())
        else:
            self.link.abort()
            self._finish(True, False, f"channel close not confirmed within {timeout:g}s; connection cut")
        return clean

    async def crash(self) -> None:
        """Cut the connection as if the consumer's process had been killed while holding deliveries.

        Acks already written are confirmed first: the cut is meant to leave the broker with
        held deliveries to give back, not with acks whose fate nobody can know.
        """
        await self.confirm_written(OP_TIMEOUT)
        self._begin_end("crash")
        self.link.abort()
        self._finish(True, False, "connection cut by the consumer before a barrier")

    def lost(self, why: str) -> None:
        """The channel or connection failed: what it held comes back when the broker notices."""
        if self._ended is None:
            self._begin_end("close")
            self._finish(False, False, why)

    def _take_held(self) -> list[Delivery]:
        held = sorted(self.held.values(), key=lambda d: d.tag)
        self.held.clear()
        return held

    def _abandon(self, d: Delivery, cause: str) -> Invocation:
        return self.recorder.invoke(
            self.process, "abandon", node=self.node, queue=self.queue, value=d.msg_id, detail={"cause": cause}
        )

    def _begin_end(self, cause: str) -> None:
        """From here on nothing is acked; every delivery held, or still arriving, is given back."""
        self.ending = cause
        self._late.extend(self._abandon(d, cause) for d in self._take_held())

    def _give_back_late(self, d: Delivery) -> None:
        assert self.ending is not None
        op = self._abandon(d, self.ending)
        if self._ended is None:
            self._late.append(op)
        else:
            self._complete([op])

    def _finish(self, abandons_ok: bool, acks_ok: bool, why: str) -> None:
        self._ended = (abandons_ok, acks_ok, why or "channel ended")
        ops = self._late + self.unconfirmed
        self._late, self.unconfirmed = [], []
        self._complete(ops)
        if self._barriers is not None:
            self._barriers.cancel()

    def _complete(self, ops: list[Invocation]) -> None:
        assert self._ended is not None
        abandons_ok, acks_ok, why = self._ended
        for op in ops:
            if op.done:
                continue
            if op.f == "ack" and acks_ok:
                op.ok()
                self.acked += 1
            elif op.f == "abandon" and abandons_ok:
                op.ok()
            else:
                op.info(why)


def _closed_cleanly(ch: Any) -> bool:
    """aiormq ends a channel whose ``close-ok`` arrived with ``ChannelClosed(None, None)``;
    any other ending (a broker error, a dead connection, a cancelled close) is not clean."""
    fut = ch.closing
    if not fut.done() or fut.cancelled():
        return False
    exc = fut.exception()
    return type(exc) is aiormq.exceptions.ChannelClosed and exc.args[:1] == (None,)


async def run_consumer(
    open_link: Callable[[str], Awaitable[Link]],
    nodes: Iterator[str],
    recorder: Recorder,
    process: str,
    queue: str,
    stop: asyncio.Event,
    *,
    seed: int,
    message_size: int,
    prefetch: int,
    behaviour: Behaviour,
) -> None:
    """Consume until ``stop``; after a failure move to the next node. At ``stop`` the channel and
    connection are closed within a bound, or the connection is cut (a consumer stuck on a
    silent connection must not keep deliveries from the drain)."""
    while not stop.is_set():
        node = next(nodes)
        try:
            link: Link = await open_link(node)
        except BROKER_ERRORS:
            await wait_or_stop(stop, RECONNECT_DELAY)
            continue
        session: Session | None = None
        try:
            while not stop.is_set() and not link.closed:
                session = Session(
                    link,
                    recorder,
                    process,
                    queue,
                    seed=seed,
                    message_size=message_size,
                    prefetch=prefetch,
                    behaviour=behaviour,
                )
                try:
                    await session.open()
                except BROKER_ERRORS as exc:
                    session.lost(reason(exc))
                    break
                outcome = await _drive(session, stop, behaviour)
                if outcome == "stop":
                    await session.close("close", CLOSE_TIMEOUT)
                if outcome != "closed":
                    break
                # the channel was closed on purpose: open another on this connection
        finally:
            if session is not None and not session.ended:  # cancelled half-way through
                link.abort()
                session.lost("consumer cancelled; connection cut")
            await link.close()
        if not stop.is_set():
            await wait_or_stop(stop, RECONNECT_DELAY)


async def _drive(session: Session, stop: asyncio.Event, behaviour: Behaviour) -> str:
    """Keep one channel consuming, acting out the behaviours; returns how it ended:
    ``stop``, ``lost``, ``closed`` (reopen a channel) or ``crashed`` (reconnect)."""
    loop = asyncio.get_running_loop()
    target = session.prefetch or 32
    while True:
        action, at = behaviour.next()
        while True:
            if stop.is_set():
                return "stop"
            why = session.broken()
            if why is not None:
                session.lost(why)
                return "lost"
            if session.cancelled_by_broker():
                try:
                    await session.consume()
                except BROKER_ERRORS as exc:
                    session.lost(reason(exc))
                    return "lost"
            left = at - loop.time()
            if left <= 0:
                break
            await wait_or_stop(stop, min(0.25, left))
        assert action is not None
        held = await session.hold(target, HOLD_WAIT, stop)
        behaviour.done(action, loop.time())
        if stop.is_set():
            return "stop"
        if not held:
            session.holding = False
            continue
        try:
            if action == "recover":
                await session.recover()
                continue
            if action == "close":
                await session.close("close")
                return "closed"
            await session.crash()
            return "crashed"
        except BROKER_ERRORS as exc:
            session.lost(reason(exc))
            return "lost"
