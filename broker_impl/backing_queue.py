"""The backing-queue contract (RabbitMQ's ``rabbit_backing_queue`` behaviour, in asyncio).

A queue object (``broker_impl.queue``) owns routing, consumers, prefetch and
dead-lettering; the backing queue only keeps messages in order and knows what
is ready, what is delivered-but-unacked, and what is safe on disk. Mirroring
wraps a backing queue with another one (``broker_impl.cluster``), so every
mutation goes through this interface and nothing else.

Sequence ids (``seq``) are assigned by the backing queue, strictly increasing in
publish order, and survive a restart for persistent messages. Requeued messages
return to their original position (RabbitMQ >= 2.7 semantics) and are marked
redelivered.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from broker_impl.message import Message


@dataclass(slots=True)
class Fetched:
    """A message handed to the queue for delivery; it stays unacked until ack/requeue/drop."""

    seq: int
    message: Message
    redelivered: bool


class BackingQueue(abc.ABC):
    """One queue's storage. All methods run on the broker's event loop."""

    name: str
    durable: bool

    @abc.abstractmethod
    async def publish(self, message: Message) -> int:
        """Append a message; return its seq once it is as safe as the policy promises.

        For a persistent message on a durable queue that means: in the commit log
        and, with ``flush: sync``, fsync'ed (group commit); with ``flush: async``,
        written. The caller sends the publisher confirm only after this returns.
        Raises ``StoreError`` when the store cannot take it (the caller nacks).
        """

    async def publish_batch(self, messages: list[Message], *, hold: bool = True) -> list[int]:
        """A committed transaction's publishes to this queue, as one unit; return their seqs in order.

        After a crash or a failover either all of them are in the queue or none
        is, and (``hold``) none can be fetched before all are as safe as
        ``publish`` promises. A mirror passes ``hold=False``: it replays its
        master's fetches, which came after the master's own hold, so its copy must
        be fetchable at once. This default suits a queue that nothing survives.
        """
        return [await self.publish(m) for m in messages]

    async def ack_batch(self, seqs: list[int]) -> None:
        """A committed transaction's acks on this queue, as one unit (all or none survive a crash)."""
        await self.ack(seqs)

    @abc.abstractmethod
    async def publish_delivered(self, message: Message) -> int:
        """Store a message that goes straight to a consumer (it starts unacked)."""

    @abc.abstractmethod
    def fetch(self) -> Fetched | None:
        """Take the next ready message (lowest seq), moving it to unacked; None when empty."""

    @abc.abstractmethod
    async def ack(self, seqs: list[int]) -> None:
        """Forget delivered messages for good (persist the ack for durable queues)."""

    @abc.abstractmethod
    def requeue(self, seqs: list[int]) -> None:
        """Return delivered messages to ready, in their original order, marked redelivered."""

    @abc.abstractmethod
    async def drop(self, seqs: list[int]) -> None:
        """Discard delivered messages without redelivery (reject/nack without requeue)."""

    @abc.abstractmethod
    async def purge(self) -> int:
        """Remove every ready message; return how many."""

    @abc.abstractmethod
    def len(self) -> int:
        """Ready messages."""

    @abc.abstractmethod
    def depth(self) -> int:
        """Ready plus unacked: two queues are in sync when their depths agree."""

    @abc.abstractmethod
    def unacked(self) -> list[int]:
        """Seqs delivered and not yet acked, in order."""

    @abc.abstractmethod
    def ram_bytes(self) -> int:
        """Bytes of message bodies held in memory (for the memory alarm)."""

    @abc.abstractmethod
    async def delete(self) -> None:
        """Drop everything, on disk too; the queue is gone."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop cleanly, leaving persistent contents for recovery."""

    def recovered_messages(self) -> list[tuple[int, int, Message]]:
        """(seq, wall-clock ms it was stored, message) of what came back from disk: the queue restores TTLs."""
        return []

    def held_since(self) -> list[tuple[int, int, Message]]:
        """(seq, wall-clock ms it was placed here, message) of every ready message: a mirror's copy
        promoted to master gives its messages their TTLs back from it (a copy knows no other time).
        Empty for a backing queue that cannot tell."""
        return []


class StoreError(Exception):
    """The store refused or failed a write (disk full, flush timeout, closed)."""
