"""The backing queue of a durable queue: persistent messages live in the commit log.

Transient messages on a durable queue stay in memory (paged like any other) and
are lost on restart, as in RabbitMQ. Persistent ones are appended to the commit
log; their consume-queue index is their identity on disk, acks and deliveries
are recorded against it, and a restart rebuilds the queue from the consume
queue minus the acked indexes.

Seqs must interleave both kinds in publish order and survive a restart for
persistent messages, so they are derived from the index: the persistent message
with index n has seq ``(n + 1) << 32``; the k-th transient message published
after it has ``((n + 1) << 32) + k``.
"""

from __future__ import annotations

from broker_impl.backing.memory import DEFAULT_RAM_BUDGET, Entry, MemoryBackingQueue
from broker_impl.message import Message
from broker_impl.store import Store

_SHIFT = 32


class PersistentBackingQueue(MemoryBackingQueue):
    """Attach one per durable queue and store; recovered contents are loaded on construction."""

    def __init__(self, name: str, store: Store, *, ram_budget_bytes: int = DEFAULT_RAM_BUDGET) -> None:
        super().__init__(name, True, ram_budget_bytes=ram_budget_bytes, spill_dir=store.spill_dir(name))
        self._store = store
        self._qlog = store.open_queue(name)
        self._transients = 0
        delivered = self._qlog.progress.delivered
        for index, offset, size in self._qlog.unacked():
            seq = (index + 1) << _SHIFT
            entry = Entry(seq, 0, None, index < delivered, index=index, log_offset=offset, log_size=size)
            self._entries[seq] = entry
            self._fresh.append(entry)

    async def publish_batch(self, messages: list[Message], *, hold: bool = True) -> list[int]:
        """A committed transaction's messages: one commit record, fetchable once it is safe.

        The persistent ones go to the log as ONE record (``Store.append_batch``), so
        a crash keeps all or none of them; their entries take their places in the
        order now but stay unfetchable (``_staged``) until the record is as safe as
        the flush policy promises, so no consumer sees a message whose commit a
        power loss can still undo (unless ``hold`` is off: a mirror's replay).
        """
        self._check_open()
        stored = [m for m in messages if m.persistent]
        if stored:
            offset, size, first = self._store.append_batch(self.name, [m.to_bytes() for m in stored])
        else:
            offset, size, first = -1, 0, self._qlog.cq.next_index
        entries, k = [], 0
        for m in messages:
            if m.persistent:
                self._transients = 0
                entry = Entry(
                    (first + k + 1) << _SHIFT, m.size, m, index=first + k, log_offset=offset, log_size=size
                )
                k += 1
            else:
                self._transients += 1
                entry = Entry(((first + k) << _SHIFT) + self._transients, m.size, m)
            self._register(entry)
            entries.append(entry)
        self._staged += len(entries)
        if not hold:
            self._place_ready(entries)
        try:
            if stored:
                await self._store.wait_durable(offset + size)
        finally:
            if hold:
                self._place_ready(entries)
        return [e.seq for e in entries]

    async def ack_batch(self, seqs: list[int]) -> None:
        """A committed transaction's acks: one record; the ack log takes them once it is flushed."""
        indexes = [e.index for e in self._take_unacked(seqs) if e.index >= 0]
        if indexes:
            await self._store.wait_durable(self._store.ack_batch(self.name, indexes))

    def recovered(self) -> int:
        """How many messages came back from disk (ready at attach time)."""
        return len(self._fresh)

    def recovered_messages(self) -> list[tuple[int, int, Message]]:
        """Every message still here that came back from disk, read from the log with its store time."""
        out = []
        for entry in list(self._entries.values()):
            if entry.index < 0 or entry.message is not None or entry.log_size <= 0:
                continue  # published since the start (or already paged in by a delivery)
            got = self._store.read_message(entry.log_offset, entry.log_size, entry.index)
            if got is not None:
                out.append((entry.seq, got[1], Message.from_bytes(got[0])))
        return out

    def _new_seq(self, message: Message) -> int:
        base = self._qlog.cq.next_index << _SHIFT
        if message.persistent:
            self._transients = 0
            return base + (1 << _SHIFT)
        self._transients += 1
        return base + self._transients

    def _write(self, entry: Entry, message: Message) -> None:
        if not message.persistent:
            return
        offset, size, index = self._store.append(self.name, message.to_bytes())
        entry.index, entry.log_offset, entry.log_size = index, offset, size

    async def _wait_safe(self, entry: Entry) -> None:
        if entry.index >= 0:
            await self._store.wait_durable(entry.log_offset + entry.log_size)

    def _read_log(self, entry: Entry) -> Message | None:
        got = self._store.read_message(entry.log_offset, entry.log_size, entry.index)
        return None if got is None else Message.from_bytes(got[0])

    def _on_fetch(self, entry: Entry) -> None:
        if entry.index >= 0:
            self._store.mark_delivered(self.name, entry.index)

    async def _forget(self, entries: list[Entry]) -> None:
        self._store.ack(self.name, [e.index for e in entries if e.index >= 0])

    async def delete(self) -> None:
        await super().delete()
        self._store.delete_queue(self.name)
