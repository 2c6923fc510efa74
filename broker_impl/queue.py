"""The queue object: consumers, round-robin delivery, prefetch, dead-lettering, TTL.

Storage is the backing queue's business; this class decides who gets what.
It is also one stage of credit flow: channels ``send`` it publishes through
``enqueue`` and it grants credit back as it processes them, and it is the
sender on its own link to the store (only for persistent messages on a durable
queue, as RabbitMQ's msg_store link).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker_impl.backing_queue import BackingQueue, Fetched, StoreError
from broker_impl.codec import PRECONDITION_FAILED, ChannelError
from broker_impl.flow import DEFAULT_LINK, DEFAULT_STORE_LINK, Actor, CreditSpec
from broker_impl.message import Message

log = logging.getLogger("broker_impl.queue")


class QueueHome(Protocol):
    """What a queue needs from the vhost it lives in (``broker_impl.vhost.VHost``)."""

    name: str

    def delete_queue_soon(self, q: Queue) -> None: ...

    def dead_letter(self, message: Message, queue: str, reason: str, dlx: str, dlrk: str | None) -> None: ...


class ConsumerChannel(Protocol):
    """What a queue needs from the channel a consumer lives on."""

    def can_deliver(self, consumer: Consumer) -> bool: ...

    def deliver(self, consumer: Consumer, queue: Queue, fetched: Fetched) -> None: ...

    def consumer_cancelled(self, consumer: Consumer) -> None: ...


@dataclass(eq=False, slots=True)
class Consumer:
    tag: str
    channel: Any  # broker_impl.channel.Channel (ConsumerChannel)
    queue: Queue
    no_ack: bool
    exclusive: bool = False
    prefetch: int = 0  # 0 = unlimited (per consumer: qos global=false)
    unacked: int = 0
    arguments: dict[str, Any] = field(default_factory=dict)

    def has_capacity(self) -> bool:
        return self.no_ack or self.prefetch == 0 or self.unacked < self.prefetch


class StoreLink(Actor):
    """The store as the receiving end of one queue's persistent writes."""


ConfirmCallback = Callable[[bool], None]
#: How often a held publisher confirm asks again whether it may go (a channel's, a forwarded publish's).
CONFIRM_RECHECK_S = 0.05


class Queue(Actor):
    """One AMQP queue, bound to one backing queue for its whole life."""

    def __init__(
        self,
        vhost: QueueHome,
        name: str,
        bq: BackingQueue,
        *,
        durable: bool = False,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        flow_enabled: bool = True,
        link_spec: CreditSpec = DEFAULT_LINK,
        store_spec: CreditSpec = DEFAULT_STORE_LINK,
    ) -> None:
        super().__init__(flow_enabled, f"queue {name}")
        self.vhost = vhost
        self.name = name
        self.bq = bq
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.link_spec = link_spec
        self.store_spec = store_spec
        self.consumers: deque[Consumer] = deque()
        self.had_consumer = False
        self.deleted = False
        self.discarded = False  # deleted as a copy replaced by a master elsewhere (``discard``)
        self._inbox: deque[tuple[int, Message | list[Message], Actor | None, ConfirmCallback | None]] = (
            deque()
        )
        self._ticket = 0  # publishes accepted so far
        self._outstanding: set[int] = set()  # tickets accepted but not yet in the backing queue
        self._progress = asyncio.Event()
        self._wake = asyncio.Event()
        self._kick_scheduled = False
        self._store = StoreLink(flow_enabled, f"store link {name}")
        self._writes: set[asyncio.Task[None]] = set()
        self._deadlines: dict[int, float] = {}
        self._peeked: set[int] = set()
        self._expiry_handle: asyncio.TimerHandle | None = None
        self._pending_autoacks: list[int] = []
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"queue:{name}")
        self.arg_ttl_ms = _int_arg(self.arguments, "x-message-ttl")
        self.arg_max_length = _int_arg(self.arguments, "x-max-length")
        self.arg_expires_ms = _int_arg(self.arguments, "x-expires")
        self._unused_handle: asyncio.TimerHandle | None = None
        self.dlx: str | None = self.arguments.get("x-dead-letter-exchange")
        self.dlrk: str | None = self.arguments.get("x-dead-letter-routing-key")
        self.policy: dict[str, Any] | None = None
        self.policy_name: str | None = None

    # -- effective settings: queue arguments win over the policy (RabbitMQ: the lower value for limits) --
    @property
    def ttl_ms(self) -> int | None:
        return _min_opt(self.arg_ttl_ms, _policy_int(self.policy, "message-ttl"))

    @property
    def max_length(self) -> int | None:
        return _min_opt(self.arg_max_length, _policy_int(self.policy, "max-length"))

    @property
    def expires_ms(self) -> int | None:
        return _min_opt(self.arg_expires_ms, _policy_int(self.policy, "expires"))

    # -- x-expires: a queue unused for that long is deleted ----------------------------------
    def touch(self) -> None:
        """The queue was used (declared again, a basic.get, its last consumer gone): restart its expiry clock.

        RabbitMQ's "unused": no consumers, no basic.get, no re-declaration for
        ``x-expires`` milliseconds (or the ``expires`` policy key); then the queue is
        deleted, contents and all. A consumer stops the clock.
        """
        if self._unused_handle is not None:
            self._unused_handle.cancel()
            self._unused_handle = None
        ms = self.expires_ms
        if ms is None or self.deleted or self.consumers:
            return
        self._unused_handle = asyncio.get_running_loop().call_later(ms / 1000.0, self._unused_expired)

    def _unused_expired(self) -> None:
        self._unused_handle = None
        if not self.deleted and not self.consumers:
            log.info("queue %r: unused for %d ms (x-expires); deleting it", self.name, self.expires_ms or 0)
            self.vhost.delete_queue_soon(self)

    # -- publishing -------------------------------------------------------------
    def enqueue(self, message: Message, sender: Actor | None, on_done: ConfirmCallback | None) -> None:
        """Accept a routed message; ``on_done(ok)`` fires once it is as safe as promised."""
        self._accept(message, sender, on_done)

    def enqueue_batch(
        self, messages: list[Message], sender: Actor | None, on_done: ConfirmCallback | None
    ) -> None:
        """A committed transaction's publishes to this queue: one unit (``BackingQueue.publish_batch``)."""
        self._accept(messages, sender, on_done)

    def _accept(
        self, unit: Message | list[Message], sender: Actor | None, on_done: ConfirmCallback | None
    ) -> None:
        if self.deleted:
            if on_done:
                on_done(True)
            return
        if sender is not None:
            sender.flow_send(self, self.link_spec)
        self._ticket += 1
        self._outstanding.add(self._ticket)
        self._inbox.append((self._ticket, unit, sender, on_done))
        self._wake.set()

    async def settled(self) -> None:
        """Wait until every publish accepted before this call is in the backing queue.

        An Erlang channel's cast to a queue is processed before its later call, so a
        client that publishes and then gets, purges or declares on the same channel
        sees its own messages; this barrier gives the same guarantee.
        """
        upto = self._ticket
        while self._outstanding and min(self._outstanding) <= upto and not self.deleted:
            self._progress.clear()
            await self._progress.wait()

    @property
    def inbox_len(self) -> int:
        return len(self._inbox)

    @property
    def writes_in_flight(self) -> int:
        return len(self._writes)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            handled = 0
            while self._inbox:
                ticket, message, sender, on_done = self._inbox.popleft()
                if sender is not None:
                    self.flow_ack(sender, self.link_spec)
                self._start_write(ticket, message, on_done)
                handled += 1
                if handled % 256 == 0:
                    await asyncio.sleep(0)  # let deliveries, readers and other queues run

    def _start_write(
        self, ticket: int, message: Message | list[Message], on_done: ConfirmCallback | None
    ) -> None:
        batch = message if isinstance(message, list) else [message]
        to_store = self.bq.durable and any(m.persistent for m in batch)
        if to_store:
            self.flow_send(self._store, self.store_spec)
        task = asyncio.get_running_loop().create_task(self._write(ticket, message, on_done, to_store))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(
        self, ticket: int, message: Message | list[Message], on_done: ConfirmCallback | None, to_store: bool
    ) -> None:
        ok = True
        try:
            if isinstance(message, list):
                placed = list(zip(await self.bq.publish_batch(message), message, strict=True))
            else:
                placed = [(await self.bq.publish(message), message)]
        except StoreError as exc:
            log.error("queue %r: store refused a message: %s", self.name, exc)
            ok = False
        except Exception:  # a broken backing queue must not take the broker down
            log.exception("queue %r: publish failed", self.name)
            ok = False
        else:
            for seq, m in placed:
                ttl = self._ttl_for(m)
                if ttl is not None:
                    self._deadlines[seq] = time.monotonic() + ttl / 1000.0
                    self._schedule_expiry(ttl / 1000.0)
            if self.max_length is not None:
                await self._enforce_max_length()
        finally:
            if to_store:
                self._store.flow_ack(self, self.store_spec)
            self._outstanding.discard(ticket)
            self._progress.set()
        if on_done:
            on_done(ok and not self.discarded)
        self.kick()

    def restore_deadlines(self, *, promoted: bool = False) -> None:
        """Messages recovered from disk expire when they would have without the restart.

        A deadline lives in memory; without this a recovered message of a TTL
        queue (or with a per-message expiration) would never expire. Its stored
        wall-clock time plus the TTL gives the deadline back. ``promoted``: a
        mirror's copy just became the master; its messages count from when the
        copy got them (``BackingQueue.held_since``), which is when the old master
        published them, give or take the group's latency (or the sync that brought
        them), as RabbitMQ's mirrors keep each message's expiry from the master's.
        """
        now_ms = time.time() * 1000
        soonest = None
        held = self.bq.held_since() if promoted else self.bq.recovered_messages()
        for seq, stored_ms, message in held:
            ttl = self._ttl_for(message)
            if ttl is None or seq in self._deadlines:
                continue
            left = (stored_ms + ttl - now_ms) / 1000.0
            self._deadlines[seq] = time.monotonic() + left
            soonest = left if soonest is None else min(soonest, left)
        if soonest is not None:
            self._schedule_expiry(max(soonest, 0.0))

    def _ttl_for(self, message: Message) -> int | None:
        ttl = self.ttl_ms
        exp = message.properties.expiration
        if exp:
            try:
                e = int(exp)
            except ValueError:
                e = None
            if e is not None and e >= 0:
                ttl = e if ttl is None else min(ttl, e)
        return ttl

    async def _enforce_max_length(self) -> None:
        limit = self.max_length
        assert limit is not None
        while self.bq.len() > limit:
            f = self.bq.fetch()
            if f is None:
                return
            self._deadlines.pop(f.seq, None)
            await self._dead_letter([f], "maxlen")

    # -- delivery -----------------------------------------------------------------
    def kick(self) -> None:
        """Something changed that may allow deliveries; run them once, soon."""
        if self._kick_scheduled or self.deleted:
            return
        self._kick_scheduled = True
        asyncio.get_running_loop().call_soon(self._deliver_ready)

    def _deliver_ready(self) -> None:
        self._kick_scheduled = False
        if self.deleted:
            return
        n = len(self.consumers)
        idle = 0
        while self.consumers and self.bq.len() and idle < n:
            consumer = self.consumers[0]
            self.consumers.rotate(-1)
            if not consumer.has_capacity() or not consumer.channel.can_deliver(consumer):
                idle += 1
                continue
            fetched = self._fetch_live()
            if fetched is None:
                break
            idle = 0
            if not consumer.no_ack:
                consumer.unacked += 1
            consumer.channel.deliver(consumer, self, fetched)
            if consumer.no_ack:
                self._autoack(fetched.seq)
        self._maybe_flush_autoacks()

    def _fetch_live(self) -> Fetched | None:
        """Fetch, dropping (and dead-lettering) expired heads on the way."""
        while True:
            f = self.bq.fetch()
            if f is None:
                return None
            deadline = self._deadlines.pop(f.seq, None)
            if deadline is not None and deadline <= time.monotonic():
                self._peeked.discard(f.seq)
                self._spawn(self._dead_letter([f], "expired"))
                continue
            if f.seq in self._peeked:
                # only looked at by the expiry timer, never delivered: not a redelivery
                self._peeked.discard(f.seq)
                f = Fetched(f.seq, f.message, False)
            return f

    def _autoack(self, seq: int) -> None:
        self._pending_autoacks.append(seq)

    def _maybe_flush_autoacks(self) -> None:
        if self._pending_autoacks:
            seqs, self._pending_autoacks = self._pending_autoacks, []
            self._spawn(self.bq.ack(seqs))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    # -- TTL ------------------------------------------------------------------------
    def _schedule_expiry(self, delay: float) -> None:
        if self._expiry_handle is not None:
            return
        self._expiry_handle = asyncio.get_running_loop().call_later(delay + 0.001, self._expiry_fired)

    def _expiry_fired(self) -> None:
        self._expiry_handle = None
        self._expire_head()
        if self._deadlines and not self.deleted:
            nxt = min(self._deadlines.values()) - time.monotonic()
            self._schedule_expiry(max(nxt, 0.0))

    def _expire_head(self) -> None:
        """RabbitMQ expires only at the head: drop leading ready messages whose time is up."""
        if not self._deadlines:
            return
        now = time.monotonic()
        expired: list[Fetched] = []
        while self.bq.len():
            f = self.bq.fetch()
            if f is None:
                break
            d = self._deadlines.get(f.seq)
            if d is not None and d <= now:
                del self._deadlines[f.seq]
                expired.append(f)
                continue
            # Not expired: put it straight back. The contract has no peek, so remember
            # that this requeue was ours and must not count as a redelivery.
            if not f.redelivered:
                self._peeked.add(f.seq)
            self.bq.requeue([f.seq])
            break
        if expired:
            self._spawn(self._dead_letter(expired, "expired"))

    # -- dead-lettering ---------------------------------------------------------------
    def dead_letter_target(self) -> tuple[str | None, str | None]:
        dlx, dlrk = self.dlx, self.dlrk
        if self.policy:
            dlx = dlx if dlx is not None else self.policy.get("dead-letter-exchange")
            dlrk = dlrk if dlrk is not None else self.policy.get("dead-letter-routing-key")
        return dlx, dlrk

    async def _dead_letter(self, fetched: list[Fetched], reason: str) -> None:
        dlx, dlrk = self.dead_letter_target()
        if dlx is not None:
            for f in fetched:
                self.vhost.dead_letter(f.message, self.name, reason, dlx, dlrk)
        await self.bq.drop([f.seq for f in fetched])

    # -- consumer-facing operations ------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.had_consumer = True
        if self._unused_handle is not None:
            self._unused_handle.cancel()
            self._unused_handle = None
        self.kick()

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if self.auto_delete and self.had_consumer and not self.consumers:
            self.vhost.delete_queue_soon(self)
        elif not self.consumers:
            self.touch()

    def get(self, no_ack: bool) -> Fetched | None:
        self.touch()
        f = self._fetch_live()
        if f is not None and no_ack:
            self._autoack(f.seq)
            self._maybe_flush_autoacks()
        return f

    async def ack(self, seqs: list[int], consumer: Consumer | None) -> None:
        if consumer is not None:
            consumer.unacked = max(0, consumer.unacked - len(seqs))
        if self.deleted:
            return
        await self.bq.ack(seqs)
        self.kick()

    async def ack_batch(self, seqs: list[int], consumer: Consumer | None) -> None:
        """A committed transaction's acks on this queue: one unit (``BackingQueue.ack_batch``).

        A copy discarded because another master replaced it cannot take them: the
        replacement still holds the messages, so the commit must fail, not say ok.
        """
        if consumer is not None:
            consumer.unacked = max(0, consumer.unacked - len(seqs))
        if self.discarded:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"partial tx completion: queue '{self.name}' was replaced by "
                "a master elsewhere; its deliveries will be delivered again",
            )
        if self.deleted:
            return
        try:
            await self.bq.ack_batch(seqs)
        except StoreError as exc:  # the acks are in memory but not as safe as commit-ok would say
            raise ChannelError(PRECONDITION_FAILED, f"partial tx completion: {exc}") from None
        self.kick()

    def requeue(self, seqs: list[int], consumer: Consumer | None) -> None:
        if consumer is not None:
            consumer.unacked = max(0, consumer.unacked - len(seqs))
        if self.deleted:
            return
        self.bq.requeue(seqs)
        self.kick()

    async def reject_messages(self, items: list[tuple[int, Message]], consumer: Consumer | None) -> None:
        """Reject/nack without requeue: dead-letter if configured, then drop."""
        if consumer is not None:
            consumer.unacked = max(0, consumer.unacked - len(items))
        if self.deleted:
            return
        dlx, dlrk = self.dead_letter_target()
        if dlx is not None:
            for _seq, m in items:
                self.vhost.dead_letter(m, self.name, "rejected", dlx, dlrk)
        await self.bq.drop([s for s, _ in items])
        self.kick()

    async def purge(self) -> int:
        self._deadlines.clear()
        return await self.bq.purge()

    def message_count(self) -> int:
        return self.bq.len()

    def consumer_count(self) -> int:
        return len(self.consumers)

    # -- lifecycle --------------------------------------------------------------------------
    async def drain_writes(self) -> None:
        """Wait for accepted publishes to reach the backing queue (clean shutdown)."""
        while self._inbox or self._writes:
            if self._writes:
                await asyncio.gather(*list(self._writes), return_exceptions=True)
            else:
                await asyncio.sleep(0.001)

    async def discard(self) -> int:
        """Delete this copy because a master elsewhere replaced it; publishes not yet confirmed are refused.

        A queue.delete confirms what was routed to the queue, as RabbitMQ does (the
        publisher asked for the queue to go). A copy thrown away under its
        publishers is different: what it held is gone, so a publish still waiting
        for its confirm gets a nack, which the publisher can act on, not an ack.
        """
        self.discarded = True
        return await self.delete()

    async def delete(self) -> int:
        """Cancel consumers, drop contents; returns the message count at deletion."""
        if self.deleted:
            return 0
        count = self.bq.len()
        self.deleted = True
        self._task.cancel()
        for consumer in list(self.consumers):
            consumer.channel.consumer_cancelled(consumer)
        self.consumers.clear()
        for _t, _m, _s, on_done in self._inbox:
            if on_done:
                on_done(not self.discarded)
        self._inbox.clear()
        self._outstanding.clear()
        self._progress.set()
        if self._expiry_handle:
            self._expiry_handle.cancel()
        if self._unused_handle:
            self._unused_handle.cancel()
        self.flow_terminate()
        self._store.flow_terminate()
        await asyncio.gather(*list(self._writes), return_exceptions=True)
        await self.bq.delete()
        return count

    async def close(self) -> None:
        """Broker shutdown: keep persistent contents for recovery."""
        await self.drain_writes()
        self._task.cancel()
        self.deleted = True
        if self._expiry_handle:
            self._expiry_handle.cancel()
        if self._unused_handle:
            self._unused_handle.cancel()
        await self.bq.close()

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "vhost": self.vhost.name,
            "durable": self.durable,
            "exclusive": self.exclusive_owner is not None,
            "auto_delete": self.auto_delete,
            "arguments": self.arguments,
            "messages_ready": self.bq.len(),
            "messages_unacknowledged": self.bq.depth() - self.bq.len(),
            "consumers": len(self.consumers),
            "policy": self.policy_name,
            "effective_policy_definition": self.policy or {},
            "state": self.flow_state(),
        }


def _int_arg(args: dict[str, Any], key: str) -> int | None:
    v = args.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"invalid arg '{key}' for queue: {v!r}")
    return v


def _policy_int(policy: dict[str, Any] | None, key: str) -> int | None:
    v = (policy or {}).get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _min_opt(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
