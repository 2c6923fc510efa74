"""A channel's AMQP transaction (``tx.select`` / ``tx.commit`` / ``tx.rollback``).

Observable semantics are RabbitMQ's (``rabbit_channel``): publishes are routed
when they arrive but reach their queues only at ``tx.commit``; acks, rejects and
nacks are checked when they arrive (an unknown delivery tag still closes the
channel) and applied only at ``tx.commit``; ``tx.commit-ok`` goes out once every
publish is in its queue as safely as a publisher confirm would say (on disk per
the flush policy, on every in-sync mirror of a mirrored queue); a publish that a
queue refuses fails the commit with 406 as RabbitMQ's "partial tx completion".
``tx.rollback`` drops the publishes and gives the acked deliveries back to the
channel as unacked (they are neither requeued nor acked, as in RabbitMQ). A
channel that closes with a transaction open rolls it back.

Storage is RocketMQ's (``seeds/004``, ``store/record.py``): a persistent
publish to a durable queue is written at once as a prepared ("half") record
that no consume queue points at; the commit writes, per queue, one commit
record holding all of the transaction's messages for that queue and one holding
its acks there. So the unit that survives a crash or a power loss whole or not
at all is the transaction's share of one queue, which is what the AMQP spec
asks servers to make atomic ("at least where all publish or ack requests affect
a single queue") and what RabbitMQ documents; a transaction spanning queues is
atomic per queue.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from broker_impl.backing_queue import StoreError
from broker_impl.codec import PRECONDITION_FAILED, ChannelError
from broker_impl.message import Message

if TYPE_CHECKING:
    from broker_impl.backing import Store
    from broker_impl.channel import Delivery
    from broker_impl.flow import Actor
    from broker_impl.queue import Consumer, Queue
    from broker_impl.vhost import VHost

log = logging.getLogger("broker_impl.tx")


class TxChannel(Protocol):
    """What a commit uses of its channel (``broker_impl.channel.Channel``): the vhost its queues are
    found in, the return of an unroutable mandatory publish, itself as the sender its queues give
    credit to, and its count of deliveries that await an ack."""

    unacked_acking: int

    @property
    def vhost(self) -> VHost: ...

    @property
    def sender(self) -> Actor: ...

    def return_unroutable(self, m: Message) -> None: ...


@dataclass(slots=True)
class _Publish:
    message: Message
    queues: list[Queue]
    mandatory: bool


@dataclass(slots=True)
class _Settle:
    """An ack (``requeue`` None), reject or nack, with the deliveries it took from the channel."""

    deliveries: list[tuple[int, Delivery]]
    requeue: bool | None


@dataclass
class Transaction:
    """What one channel has done since its last commit or rollback."""

    id: int = field(default_factory=lambda: secrets.randbits(63))
    publishes: list[_Publish] = field(default_factory=list)
    settles: list[_Settle] = field(default_factory=list)
    prepared: int = 0  # half records written for it

    def publish(self, store: Store | None, message: Message, queues: list[Queue], mandatory: bool) -> None:
        """Routed now, enqueued at the commit; a persistent message's prepared record written to
        ``store`` (the broker's, None without one) at once."""
        self.publishes.append(_Publish(message, queues, mandatory))
        if store is None or not message.persistent:
            return
        try:
            for q in queues:
                if q.durable:
                    store.prepare(q.name, self.id, message.to_bytes())
                    self.prepared += 1
        except StoreError as exc:
            # the prepared record is the transaction's state on disk, not what makes it visible: a store that
            # refuses it refuses the commit record too, and that fails the commit
            log.warning("transaction %d: prepared record not written: %s", self.id, exc)

    def settle(self, deliveries: list[tuple[int, Delivery]], requeue: bool | None) -> None:
        self.settles.append(_Settle(deliveries, requeue))

    def held(self) -> list[tuple[int, Delivery]]:
        """The deliveries its acks and rejects took from the channel (they go back on rollback or close)."""
        return [d for s in self.settles for d in s.deliveries]

    def rollback(self, store: Store | None) -> None:
        if self.prepared and store is not None:
            try:
                store.rollback(self.id)
            except StoreError as exc:  # recovery rolls back what has no commit record anyway
                log.warning("transaction %d: rollback record not written: %s", self.id, exc)

    async def commit(self, channel: TxChannel) -> None:
        """Apply everything; return once it is as safe as confirms would say. ChannelError if a queue refused."""
        loop = asyncio.get_running_loop()
        per_queue: dict[Queue, list[Message]] = {}
        for p in self.publishes:
            if not p.queues and p.mandatory:
                channel.return_unroutable(p.message)
            for q in p.queues:
                per_queue.setdefault(_current(q, channel.vhost), []).append(p.message)
        waits: list[asyncio.Future[bool]] = []
        for q, messages in per_queue.items():
            fut: asyncio.Future[bool] = loop.create_future()
            waits.append(fut)
            q.enqueue_batch(messages, channel.sender, _resolver(fut))
        for s in self.settles:
            for (q, consumer), seqs in _by_queue(s.deliveries).items():
                if s.requeue is None:
                    await q.ack_batch(seqs, consumer)
                elif s.requeue:
                    q.requeue(seqs, consumer)
                else:
                    await q.reject_messages(
                        [
                            (d.seq, d.message)
                            for _, d in s.deliveries
                            if d.queue is q and d.consumer is consumer
                        ],
                        consumer,
                    )
        channel.unacked_acking -= len(self.held())
        results = await asyncio.gather(*waits)
        if not all(results):
            raise ChannelError(PRECONDITION_FAILED, "partial tx completion")


def _current(q: Queue, vhost: VHost) -> Queue:
    """The queue object that now holds ``q``'s name, if another replaced it since the publish was routed.

    A promotion, a demotion or a partition's heal replaces the object under a name (a proxy by the
    promoted master, a master by a proxy) and deletes the old one, and a deleted proxy takes a publish
    as a deleted queue does (confirmed, dropped). A transaction routes its publishes when they arrive
    and enqueues them at the commit, so in between the queue's object may change: in
    ``scenarios/reference-tx.yaml`` (seed 24) the first publish of a transaction on n2 was routed to
    the proxy of n1's queue 14 ms before n2 promoted its mirror, the other four to the new master, and
    the commit confirmed all five with the first one gone. The name is what was routed to.
    """
    if not q.deleted:
        return q
    now = vhost.queues.get(q.name)
    return now if now is not None and not now.deleted else q


def _resolver(fut: asyncio.Future[bool]):
    def done(ok: bool) -> None:
        if not fut.done():
            fut.set_result(ok)

    return done


def _by_queue(deliveries: list[tuple[int, Delivery]]) -> dict[tuple[Queue, Consumer | None], list[int]]:
    out: dict[tuple[Queue, Consumer | None], list[int]] = {}
    for _tag, d in deliveries:
        out.setdefault((d.queue, d.consumer), []).append(d.seq)
    return out
