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

    def recovered(self) -> int:
        """How many messages came back from disk (ready at attach time)."""
        return len(self._fresh)

    def recovered_messages(self) -> list[tuple[int, int, Message]]:
        """Every message still here that came back from disk, read from the log with its store time."""
        out = []
        for entry in list(self._entries.values()):
            if entry.index < 0 or entry.message is not None or entry.log_size <= 0:
                continue  # published since the start (or already paged in by a delivery)
            rec = self._store.read(entry.log_offset, entry.log_size)
            if rec is not None:
                out.append((entry.seq, rec.store_ms, Message.from_bytes(rec.payload)))
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
        rec = self._store.read(entry.log_offset, entry.log_size)
        return None if rec is None else Message.from_bytes(rec.payload)

    def _on_fetch(self, entry: Entry) -> None:
        if entry.index >= 0:
            self._store.mark_delivered(self.name, entry.index)

    async def _forget(self, entries: list[Entry]) -> None:
        self._store.ack(self.name, [e.index for e in entries if e.index >= 0])

    async def delete(self) -> None:
        await super().delete()
        self._store.delete_queue(self.name)
