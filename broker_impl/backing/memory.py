"""The in-memory backing queue, paging bodies to a spill file beyond its RAM budget.

This is RabbitMQ's variable queue reduced to what the broker needs: the order of
messages and their index always stay in memory (RabbitMQ's q1..q4 plus delta
collapse into one ordered index), while message bodies beyond the budget live in a
spill file. New messages that do not fit go straight to disk (RabbitMQ's
q1 -> delta path); the head of the queue is read back when fetched. So
``ram_bytes()`` never exceeds the budget, however long the queue grows.

Non-durable queues use this class directly; ``PersistentBackingQueue`` reuses it
and keeps persistent messages in the commit log instead of the spill file.
"""

from __future__ import annotations

import heapq
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_impl.backing.spill import SpillFile
from broker_impl.backing_queue import BackingQueue, Fetched, StoreError
from broker_impl.message import Message

DEFAULT_RAM_BUDGET = 64 * 1024 * 1024


@dataclass(slots=True)
class Entry:
    """One message in the queue's index; its body may be in RAM, the spill file or the log."""

    seq: int
    size: int
    message: Message | None
    redelivered: bool = False
    spill_loc: int = -1
    spill_len: int = 0
    index: int = -1  # consume-queue index when the message is in the commit log
    log_offset: int = -1
    log_size: int = 0
    placed_ms: int = 0  # wall-clock ms it was placed in this queue (a promoted copy's TTL counts from it)


class MemoryBackingQueue(BackingQueue):
    """A backing queue whose contents do not survive a restart."""

    def __init__(
        self,
        name: str,
        durable: bool = False,
        *,
        ram_budget_bytes: int = DEFAULT_RAM_BUDGET,
        spill_dir: Path | None = None,
    ) -> None:
        self.name = name
        self.durable = durable
        self.ram_budget_bytes = ram_budget_bytes
        self._spill_dir = spill_dir
        self._spill: SpillFile | None = None
        self._own_tmp: Path | None = None
        self._next_seq = 1
        self._entries: dict[int, Entry] = {}
        # Ready messages: fresh ones in publish order, requeued ones in a heap.
        # Every requeued seq is lower than every fresh one (it was fetched from the
        # head), so fetch drains the heap first and order stays strictly by seq.
        self._fresh: deque[Entry] = deque()
        self._requeued: list[int] = []
        self._unacked: dict[int, Entry] = {}
        self._staged = 0  # a transaction's messages placed in the order but not yet fetchable
        self._ram = 0
        self._closed = False

    # -- contract ---------------------------------------------------------------

    async def publish(self, message: Message) -> int:
        return await self.start_publish(message)

    def start_publish(self, message: Message) -> Coroutine[Any, Any, int]:
        """``publish`` in two steps: the message takes its place in the order (and counts in
        ``depth``) before this returns; awaiting the result gives its seq once it is safe.

        So concurrent publishes (some waiting for an fsync, some not) stay in seq
        order, and a mirror replays a run of publishes in one turn of the event
        loop. If the wait fails the message stays queued, unconfirmed (RocketMQ's
        FLUSH_DISK_TIMEOUT): the publisher gets a nack and may send a duplicate.
        """
        entry = self._add(message)
        self._fresh.append(entry)
        return self._safe_seq(entry)

    async def _safe_seq(self, entry: Entry) -> int:
        await self._wait_safe(entry)
        return entry.seq

    async def publish_delivered(self, message: Message) -> int:
        entry = self._add(message)
        self._unacked[entry.seq] = entry
        self._on_fetch(entry)
        await self._wait_safe(entry)
        return entry.seq

    def fetch(self) -> Fetched | None:
        entry = self._pop_ready()
        while entry is not None:
            message = self._load(entry)
            if message is not None:
                self._unacked[entry.seq] = entry
                self._on_fetch(entry)
                return Fetched(entry.seq, message, entry.redelivered)
            # Unreadable (a corrupt record found at read time): never deliver it.
            self._release(entry)
            entry = self._pop_ready()
        return None

    async def ack(self, seqs: list[int]) -> None:
        await self._forget(self._take_unacked(seqs))

    def requeue(self, seqs: list[int]) -> None:
        for seq in seqs:
            entry = self._unacked.pop(seq, None)
            if entry is not None:
                entry.redelivered = True
                heapq.heappush(self._requeued, seq)

    async def drop(self, seqs: list[int]) -> None:
        await self._forget(self._take_unacked(seqs))

    async def purge(self) -> int:
        gone = [self._entries[s] for s in self._requeued]
        gone.extend(self._fresh)
        self._requeued.clear()
        self._fresh.clear()
        for entry in gone:
            self._release(entry)
        await self._forget(gone)
        return len(gone)

    def len(self) -> int:
        return len(self._fresh) + len(self._requeued) + self._staged

    def depth(self) -> int:
        return self.len() + len(self._unacked)

    def unacked(self) -> list[int]:
        return sorted(self._unacked)

    def ram_bytes(self) -> int:
        return self._ram

    def held_since(self) -> list[tuple[int, int, Message]]:
        """Every ready message with the wall-clock ms it was placed here (``BackingQueue.held_since``)."""
        out = []
        for entry in list(self._entries.values()):
            if entry.seq in self._unacked:
                continue
            message = entry.message if entry.message is not None else self._load(entry)
            if message is not None:
                out.append((entry.seq, entry.placed_ms, message))
        return out

    async def delete(self) -> None:
        self._drop_all()

    async def close(self) -> None:
        self._drop_all()

    # -- paging -----------------------------------------------------------------

    def set_ram_budget(self, budget_bytes: int) -> None:
        """Change the budget (e.g. under a memory alarm), paging out the newest ready bodies first."""
        self.ram_budget_bytes = budget_bytes
        if self._ram <= budget_bytes:
            return
        for entry in reversed(self._fresh):
            if self._ram <= budget_bytes:
                return
            if entry.message is not None:
                self._page_out(entry)
        for entry in list(self._unacked.values()) + [self._entries[s] for s in self._requeued]:
            if self._ram <= budget_bytes:
                return
            if entry.message is not None:
                self._page_out(entry)

    def spilled_bytes(self) -> int:
        return self._spill.bytes_on_disk if self._spill is not None else 0

    def _page_out(self, entry: Entry) -> None:
        message = entry.message
        assert message is not None
        if entry.log_offset < 0:
            entry.spill_loc, entry.spill_len = self._spill_file().write(message)
        entry.message = None
        self._ram -= entry.size

    def _spill_file(self) -> SpillFile:
        if self._spill is None:
            directory = self._spill_dir
            if directory is None:
                self._own_tmp = Path(tempfile.mkdtemp(prefix="bq-spill-"))
                directory = self._own_tmp
            self._spill = SpillFile(directory)
        return self._spill

    def _load(self, entry: Entry) -> Message | None:
        """The entry's message, read from disk when paged out (not cached: RAM stays in budget)."""
        if entry.message is not None:
            return entry.message
        if entry.spill_loc >= 0:
            assert self._spill is not None
            return self._spill.read(entry.spill_loc, entry.spill_len)
        return self._read_log(entry)

    # -- hooks for the persistent queue ----------------------------------------------

    def _write(self, entry: Entry, message: Message) -> None:
        """Write a new message where it must survive (nothing to do in memory)."""

    async def _wait_safe(self, entry: Entry) -> None:
        """Wait until the write is as safe as the policy promises (nothing to do in memory)."""

    async def _forget(self, entries: list[Entry]) -> None:
        """Persist that these messages are gone for good (nothing to do in memory)."""

    def _on_fetch(self, entry: Entry) -> None:
        """A message is being delivered."""

    def _read_log(self, entry: Entry) -> Message | None:
        raise StoreError(f"queue {self.name!r}: message {entry.seq} has no body")

    # -- internals --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"queue {self.name!r} is closed")

    def _new_seq(self, message: Message) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def _add(self, message: Message) -> Entry:
        self._check_open()
        entry = Entry(self._new_seq(message), message.size, message)
        self._write(entry, message)
        self._register(entry)
        return entry

    def _register(self, entry: Entry) -> None:
        entry.placed_ms = entry.placed_ms or int(time.time() * 1000)
        self._entries[entry.seq] = entry
        self._ram += entry.size
        if self._ram > self.ram_budget_bytes:
            self._page_out(entry)

    def _place_ready(self, entries: list[Entry]) -> None:
        """Make staged entries fetchable, each at its seq's place among the ready ones.

        Publishes that came after the stage was set may already be ready with
        higher seqs; a transaction's messages go in front of them, not behind.
        """
        self._staged -= len(entries)
        for entry in entries:
            if entry.seq not in self._entries:
                continue  # purged or the queue was deleted meanwhile
            i = len(self._fresh)
            while i > 0 and self._fresh[i - 1].seq > entry.seq:
                i -= 1
            self._fresh.insert(i, entry)

    def _pop_ready(self) -> Entry | None:
        if self._requeued:
            return self._entries[heapq.heappop(self._requeued)]
        if self._fresh:
            return self._fresh.popleft()
        return None

    def _take_unacked(self, seqs: Iterable[int]) -> list[Entry]:
        taken = []
        for seq in seqs:
            entry = self._unacked.pop(seq, None)
            if entry is not None:
                self._release(entry)
                taken.append(entry)
        return taken

    def _release(self, entry: Entry) -> None:
        del self._entries[entry.seq]
        if entry.message is not None:
            self._ram -= entry.size
            entry.message = None
        if entry.spill_loc >= 0 and self._spill is not None:
            self._spill.release(entry.spill_loc, entry.spill_len)
            entry.spill_loc = -1

    def _drop_all(self) -> None:
        self._closed = True
        self._entries.clear()
        self._fresh.clear()
        self._requeued.clear()
        self._unacked.clear()
        self._ram = 0
        if self._spill is not None:
            self._spill.close()
            self._spill = None
        if self._own_tmp is not None:
            shutil.rmtree(self._own_tmp, ignore_errors=True)
            self._own_tmp = None
