"""The store: one commit log for every durable queue, a consume queue and ack progress per queue.

Layout under the data directory::

    commitlog/<20-digit start offset>     segments (record layout in record.py)
    consumequeue/<queue dir>/meta         real queue name, incarnation
    consumequeue/<queue dir>/<20 digits>  20-byte entries (consumequeue.py)
    consumequeue/<queue dir>/progress     acked indexes, delivered watermark (progress.py)
    checkpoint                            log offset up to which log + consume queues are flushed
    abort                                 present while running: at start it means a crash
    spill/                                paging scratch space for non-persistent bodies

All file writes happen on the event loop (page cache); every fsync runs in a
small thread pool so a slow disk never stalls the loop. ``flush = "sync"`` is
group commit: publishers wait on a future, one flusher task fsyncs up to the
highest requested offset and wakes them all.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import struct
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_impl.backing_queue import StoreError
from broker_impl.store import durable
from broker_impl.store.commitlog import CommitLog, Cut
from broker_impl.store.config import StoreConfig
from broker_impl.store.consumequeue import ConsumeQueue
from broker_impl.store.progress import Progress
from broker_impl.store.record import (
    BLANK_SIZE,
    FLAG_DELETE,
    FLAG_TX_ACK,
    FLAG_TX_COMMIT,
    FLAG_TX_PREPARED,
    FLAG_TX_ROLLBACK,
    Bad,
    Blank,
    Record,
    decode,
    pack_batch,
    pack_indexes,
    unpack_batch,
    unpack_indexes,
)

log = logging.getLogger("broker_impl.store")

ABORT = "abort"
SPILL = "spill"
CHECKPOINT = "checkpoint"
_CKPT = struct.Struct(">QQI")  # log offset, wall-clock ms, crc32
_MSG_HDR = struct.Struct(">QBHI")  # Message.to_bytes header: id, flags, exchange len, routing key len


@dataclass(slots=True)
class RecoveryReport:
    """What start-up found: how the last run ended and what was cut from the log tail."""

    clean: bool
    scanned_from: int
    log_end: int
    cuts: list[Cut] = field(default_factory=list)
    redispatched: int = 0
    consume_queue_entries_dropped: int = 0


@dataclass(slots=True)
class QueueLog:
    """The store's side of one durable queue."""

    name: str
    cq: ConsumeQueue
    progress: Progress

    def unacked(self) -> list[tuple[int, int, int]]:
        """(index, log offset, size) of every persistent message not yet acked, in order."""
        p = self.progress
        return [(i, off, size) for i, off, size, _ in self.cq.entries(p.watermark) if i not in p.acked]


class Store:
    """One node's store. Open it with ``open_store``; ``close`` it on clean shutdown."""

    def __init__(self, data_dir: Path, config: StoreConfig) -> None:
        self.data_dir = data_dir
        self.config = config
        self.queues: dict[str, QueueLog] = {}
        self._tombstones: dict[str, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="store-fsync")
        self._flush_lock = asyncio.Lock()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        # sync flush: when each waiter gives up (flush_timeout_ms), oldest first; one timer for all of them
        self._deadlines: deque[tuple[float, int, asyncio.Future[None]]] = deque()
        self._timeout_timer: asyncio.TimerHandle | None = None
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._delivered_dirty: set[str] = set()
        self._last_flush = time.monotonic()
        self._closed = False
        # Set by the first failed fsync: from then on the store refuses everything (see ``_fsync_failed``).
        self.failed: StoreError | None = None
        self.on_failure: Callable[[StoreError], None] | None = None  # the node's reaction: stop and restart
        # Master-slave replication (``broker_impl.replication``): told of every append, and, on a
        # SYNC master, a second wait after the local flush (RocketMQ's handleHA after handleDiskFlush).
        self.on_append: Callable[[], None] | None = None
        self.replica_wait: Callable[[int], Awaitable[None]] | None = None
        self.checkpoint = 0
        self.stats = {"log_fsyncs": 0, "appends": 0, "read_errors": 0, "segments_deleted": 0}
        self.recovery_report = RecoveryReport(True, 0, 0)
        # acks of committed transactions wait here until the log holding their record is flushed (``flush``)
        self._parked_acks: list[tuple[int, str, list[int]]] = []
        # the largest group commit so far, by power of two: each new one is logged (a run's record
        # of how far one fsync's batch grew, e.g. under a slow disk), not every commit
        self._batch_log2 = -1

    # -- opening and recovery -----------------------------------------------------------

    def _open(self) -> None:
        durable.make_dirs(self.data_dir)
        shutil.rmtree(self.data_dir / SPILL, ignore_errors=True)
        abort = self.data_dir / ABORT
        clean = not abort.exists()
        self.log = CommitLog(self.data_dir / "commitlog", self.config.segment_bytes)
        cq_root = self.data_dir / "consumequeue"
        durable.make_dirs(cq_root)
        for d in sorted(cq_root.iterdir()):
            meta = ConsumeQueue.read_meta(d)
            if meta is None:
                log.warning("removing consume queue %s: no readable meta", d.name)
                durable.remove_tree(d)
                continue
            name, since = meta
            self.queues[name] = self._queue_log(d, name, since)
        ckpt = self._read_checkpoint()
        # Clean or not, the scan starts at the segment holding the checkpoint: after a
        # clean shutdown that is the log end (only the last segment is read); after a
        # crash it re-dispatches whatever the consume queues may have missed.
        scan_from = ckpt if ckpt is not None else (self.log.starts[0] if self.log.starts else 0)
        records, cuts = self.log.recover(scan_from)
        report = RecoveryReport(clean, scan_from, self.log.wrote, cuts)
        prepared = committed = 0
        for rec in records:
            report.redispatched += self._dispatch(rec)
            prepared += bool(rec.sysflag & FLAG_TX_PREPARED)
            committed += bool(rec.sysflag & (FLAG_TX_COMMIT | FLAG_TX_ACK))
        for q in self.queues.values():
            dropped = q.cq.truncate_from_log_offset(self.log.wrote)
            report.consume_queue_entries_dropped += dropped
            q.progress.truncate(q.cq.next_index)
        self.checkpoint = min(ckpt or 0, self.log.wrote)
        self.recovery_report = report
        if not clean or cuts:
            log.warning(
                "store recovery (%s shutdown): scanned from %d to %d, %d records re-dispatched, cuts: %s",
                "clean" if clean else "abnormal",
                scan_from,
                self.log.wrote,
                report.redispatched,
                ", ".join(f"{c.bytes} bytes at {c.offset} ({c.reason})" for c in cuts) or "none",
            )
        if not clean and (prepared or committed):
            # what recovery did with transactions: prepared records are never applied (a
            # transaction whose commit record is missing is rolled back), commit records are
            log.warning(
                "store recovery: transactions in the scanned log: %d prepared record(s) not applied, "
                "%d commit record(s) applied",
                prepared,
                committed,
            )
        durable.write_file(abort, b"")

    def _queue_log(self, directory: Path, name: str, since: int) -> QueueLog:
        cq = ConsumeQueue(directory, name, self.config.cq_entries_per_file, since)
        return QueueLog(name, cq, Progress(directory / "progress"))

    def _read_checkpoint(self) -> int | None:
        try:
            data = (self.data_dir / CHECKPOINT).read_bytes()
        except OSError:  # none yet (a first start), or unreadable: the whole log is scanned
            return None
        if len(data) < _CKPT.size:
            log.warning(
                "checkpoint is corrupt (%d of %d bytes): scanning the whole commit log", len(data), _CKPT.size
            )
            return None
        offset, ms, crc = _CKPT.unpack(data[: _CKPT.size])
        if crc != zlib.crc32(data[:16]):
            log.warning("checkpoint is corrupt: scanning the whole commit log")
            return None
        return offset

    def _write_checkpoint(self, offset: int) -> None:
        head = struct.pack(">QQ", offset, int(time.time() * 1000))
        fd = durable.open_created(self.data_dir / CHECKPOINT, os.O_WRONLY)
        try:
            os.pwrite(fd, head + struct.pack(">I", zlib.crc32(head)), 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def _dispatch(self, rec: Record) -> int:
        """Apply one log record to the consume queues (recovery and rebuild); 1 if it was applied.

        A transaction's prepared and rollback records are never applied: what a
        transaction did becomes visible only through its commit records, so one
        that never committed (the client went away, the node crashed or lost
        power before the commit record reached the disk) is rolled back here.
        """
        if rec.sysflag & (FLAG_TX_PREPARED | FLAG_TX_ROLLBACK):
            return 0
        if rec.sysflag & FLAG_TX_ACK:
            acked = self.queues.get(rec.queue)
            if acked is None or rec.offset < acked.cq.since:
                return 0
            acked.progress.ack(unpack_indexes(rec.payload))
            return 1
        if rec.sysflag & FLAG_DELETE:
            q = self.queues.get(rec.queue)
            if q is not None and q.cq.since < rec.offset:
                self._drop_queue(rec.queue)
            self._tombstones[rec.queue] = max(self._tombstones.get(rec.queue, -1), rec.offset)
            return 1
        q = self.queues.get(rec.queue)
        if q is None:
            since = self._tombstones.get(rec.queue, -1)
            if rec.offset <= since:
                return 0
            q = self.queues[rec.queue] = self._queue_log(self._queue_dir(rec.queue), rec.queue, since)
        elif rec.offset < q.cq.since:
            return 0
        if rec.sysflag & FLAG_TX_COMMIT:
            for i, payload in enumerate(unpack_batch(rec.payload)):
                q.cq.put(rec.queue_offset + i, rec.offset, rec.size, tag_hash(payload))
            return 1
        q.cq.put(rec.queue_offset, rec.offset, rec.size, tag_hash(rec.payload))
        return 1

    def _queue_dir(self, name: str) -> Path:
        return self.data_dir / "consumequeue" / queue_dirname(name)

    def _start_tasks(self) -> None:
        loop = asyncio.get_running_loop()
        self._flush_lock = asyncio.Lock()
        self._wakeup = asyncio.Event()
        if self.config.flush == "sync":
            self._tasks.append(loop.create_task(self._group_commit()))
        else:
            self._tasks.append(loop.create_task(self._async_flusher()))
        self._tasks.append(loop.create_task(self._checkpointer()))
        self._tasks.append(loop.create_task(self._retention()))

    # -- queues -----------------------------------------------------------------------------

    def recovered_queues(self) -> set[str]:
        """Durable queues the store has a consume queue for (possibly fully acked)."""
        return set(self.queues)

    def open_queue(self, name: str) -> QueueLog:
        """The queue's log state, created empty if the store has none."""
        self._check_open()
        q = self.queues.get(name)
        if q is None:
            q = self._queue_log(self._queue_dir(name), name, self._tombstones.get(name, -1))
            self.queues[name] = q
        return q

    def spill_dir(self, queue: str) -> Path:
        return self.data_dir / SPILL / queue_dirname(queue)

    def delete_queue(self, name: str) -> None:
        """Forget a queue for good: a tombstone in the log keeps recovery from resurrecting it."""
        self._check_open()
        offset, _ = self.log.append(name, 0, b"", 0, _now_ms(), FLAG_DELETE)
        self._tombstones[name] = offset
        self._drop_queue(name)
        self._appended()

    def _drop_queue(self, name: str) -> None:
        q = self.queues.pop(name, None)
        self._delivered_dirty.discard(name)
        if q is not None:
            q.progress.close()
            q.cq.destroy()

    # -- append / read ---------------------------------------------------------------------

    def append(self, queue: str, payload: bytes, born_ms: int = 0) -> tuple[int, int, int]:
        """Write a message for ``queue``; return (log offset, record size, consume-queue index).

        The write is in the page cache when this returns; ``wait_durable`` makes it
        as safe as the flush policy promises.
        """
        self._check_open()
        q = self.queues.get(queue) or self.open_queue(queue)
        index = q.cq.next_index
        now = _now_ms()
        try:
            offset, size = self.log.append(queue, index, payload, born_ms or now, now)
        except OSError as e:
            raise StoreError(f"commit log write failed: {e}") from e
        q.cq.put(index, offset, size, tag_hash(payload))
        self.stats["appends"] += 1
        self._appended()
        return offset, size, index

    def _appended(self) -> None:
        if self.on_append is not None:
            self.on_append()

    @property
    def end(self) -> int:
        """The log's end offset: where the next record goes."""
        return self.log.wrote

    def first_offset(self) -> int:
        return self.log.first_offset()

    def append_replicated(self, offset: int, data: bytes) -> int:
        """Append another store's log bytes (whole records, as ``read_raw`` gives them) at ``offset``.

        The records keep their offsets, so the two logs stay byte for byte the same;
        each is checked (magic, CRC, its own offset) before it is written and is
        dispatched to its consume queue as a local append would be. Returns the new end.
        """
        self._check_open()
        if offset != self.log.wrote:
            if self.log.starts or self.log.wrote:
                raise StoreError(f"replicated bytes start at {offset} but this log ends at {self.log.wrote}")
            try:
                self.log.start_at(offset)
            except ValueError as e:
                raise StoreError(str(e)) from None
        pos = 0
        while pos < len(data):
            got = decode(data, pos, self.log.wrote, self.log.room())
            if isinstance(got, Bad):
                raise StoreError(
                    f"replicated bytes at offset {self.log.wrote} are not a record ({got.reason})"
                )
            try:
                if isinstance(got, Blank):
                    self.log.append_blank()
                    pos += BLANK_SIZE
                    continue
                self.log.append_raw(data[pos : pos + got.size])
            except OSError as e:
                raise StoreError(f"commit log write failed: {e}") from e
            self._dispatch(got)
            pos += got.size
        if data:
            self._appended()
        return self.log.wrote

    def read_raw(self, offset: int, limit: int = 256 * 1024) -> tuple[bytes, int]:
        """Whole log records from ``offset`` for a replica: (bytes, offset after them)."""
        self._check_open()
        return self.log.read_raw(offset, limit)

    # -- transactions ----------------------------------------------------------------------

    def prepare(self, queue: str, tx: int, payload: bytes) -> None:
        """A publish inside transaction ``tx``: its prepared ("half") record, in no consume queue."""
        self._tx_append(queue, tx, payload, FLAG_TX_PREPARED)

    def rollback(self, tx: int) -> None:
        """Transaction ``tx`` was rolled back: a record with no payload says so (RocketMQ's rollback record)."""
        self._tx_append("", tx, b"", FLAG_TX_ROLLBACK)

    def _tx_append(self, queue: str, tx: int, payload: bytes, flag: int) -> tuple[int, int]:
        self._check_open()
        now = _now_ms()
        try:
            return self.log.append(queue, tx & 0x7FFF_FFFF_FFFF_FFFF, payload, now, now, flag)
        except OSError as e:
            raise StoreError(f"commit log write failed: {e}") from e

    def append_batch(self, queue: str, payloads: list[bytes]) -> tuple[int, int, int]:
        """A committed transaction's messages for ``queue`` as ONE commit record: all or none survive a crash.

        Returns (log offset, record size, consume-queue index of the first message);
        message k has index first + k and the same offset and size.
        """
        self._check_open()
        q = self.queues.get(queue) or self.open_queue(queue)
        first = q.cq.next_index
        now = _now_ms()
        try:
            offset, size = self.log.append(queue, first, pack_batch(payloads), now, now, FLAG_TX_COMMIT)
        except OSError as e:
            raise StoreError(f"commit log write failed: {e}") from e
        for i, payload in enumerate(payloads):
            q.cq.put(first + i, offset, size, tag_hash(payload))
        self.stats["appends"] += 1
        return offset, size, first

    def ack_batch(self, queue: str, indexes: list[int]) -> int:
        """A committed transaction's acks on ``queue`` as one record; return the log offset it ends at.

        The ack log of the queue takes them only once that record is flushed
        (``flush`` applies them in the step that advances ``log.flushed``), so a
        checkpoint never carries acks whose commit record a power loss can still
        take away; until then recovery re-applies them from the record.
        """
        offset, size = self._tx_append(queue, 0, pack_indexes(indexes), FLAG_TX_ACK)
        self._parked_acks.append((offset + size, queue, indexes))
        return offset + size

    def _apply_parked_acks(self) -> None:
        flushed = self.log.flushed
        keep = []
        for end, queue, indexes in self._parked_acks:
            if end <= flushed:
                self.ack(queue, indexes)
            else:
                keep.append((end, queue, indexes))
        self._parked_acks = keep

    def read_message(self, offset: int, size: int, index: int) -> tuple[bytes, int] | None:
        """(payload, store ms) of the message with consume-queue ``index`` stored at ``offset``, or None."""
        rec = self.read(offset, size)
        if rec is None:
            return None
        if rec.sysflag & FLAG_TX_COMMIT:
            batch = unpack_batch(rec.payload)
            k = index - rec.queue_offset
            if not 0 <= k < len(batch):
                self.stats["read_errors"] += 1
                log.error("commit record at %d has no message %d: message skipped", offset, index)
                return None
            return batch[k], rec.store_ms
        return rec.payload, rec.store_ms

    async def wait_durable(self, end: int) -> None:
        """Return once the log is safe up to ``end`` under the flush policy (and, on a SYNC
        master, on its slave); StoreError on timeout."""
        if self.config.flush == "sync" and end > self.log.flushed:
            await self._wait_flushed(end)
        if self.replica_wait is not None:
            await self.replica_wait(end)

    async def _wait_flushed(self, end: int) -> None:
        self._check_open()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.append((end, fut))
        self._deadlines.append((loop.time() + self.config.flush_timeout_ms / 1000, end, fut))
        if self._timeout_timer is None:
            self._timeout_timer = loop.call_at(self._deadlines[0][0], self._expire_waiters)
        self._wakeup.set()
        await fut

    def _expire_waiters(self) -> None:
        """Fail the waits older than flush_timeout_ms (RocketMQ's FLUSH_DISK_TIMEOUT): one timer, not one each."""
        self._timeout_timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        expired = 0
        while self._deadlines and (self._deadlines[0][2].done() or self._deadlines[0][0] <= now):
            _, end, fut = self._deadlines.popleft()
            if not fut.done():
                expired += 1
                fut.set_exception(
                    StoreError(
                        f"flush timeout: offset {end} not on disk after {self.config.flush_timeout_ms} ms"
                    )
                )
        if expired:
            log.warning(
                "flush timeout: %d wait(s) for the commit log's fsync gave up after %d ms (flushed to %d)",
                expired,
                self.config.flush_timeout_ms,
                self.log.flushed,
            )
        if self._deadlines:
            self._timeout_timer = loop.call_at(self._deadlines[0][0], self._expire_waiters)

    def read(self, offset: int, size: int) -> Record | None:
        """The record at ``offset``, or None (logged) if it fails its checks: never serve garbage."""
        got = self.log.read(offset, size)
        if isinstance(got, Bad):
            self.stats["read_errors"] += 1
            log.error("commit log record at %d unreadable (%s): message skipped", offset, got.reason)
            return None
        return got

    # -- progress -----------------------------------------------------------------------------

    def ack(self, queue: str, indexes: list[int]) -> None:
        q = self.queues.get(queue)
        if q is not None and indexes:
            q.progress.ack(indexes)

    def mark_delivered(self, queue: str, index: int) -> None:
        q = self.queues.get(queue)
        if q is None:
            return
        q.progress.mark_delivered(index)
        if not self._delivered_dirty:
            asyncio.get_running_loop().call_soon(self._write_delivered)
        self._delivered_dirty.add(queue)

    def _write_delivered(self) -> None:
        for name in self._delivered_dirty:
            q = self.queues.get(name)
            if q is not None:
                q.progress.write_delivered()
        self._delivered_dirty.clear()

    # -- flushing -------------------------------------------------------------------------------

    async def flush(self) -> None:
        """fsync the commit log up to what is written now (off the event loop)."""
        self._check_open()
        async with self._flush_lock:
            self._check_open()
            target, fds = self.log.take_dirty()
            if target <= self.log.flushed:
                return
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._pool, _fsync_all, fds)
            except OSError as e:
                raise self._fsync_failed(
                    f"commit log fsync failed ({e}); offsets {self.log.flushed}..{target} may not be on disk"
                ) from e
            self.stats["log_fsyncs"] += 1
            self.log.flushed = max(self.log.flushed, target)
            self._last_flush = time.monotonic()
            if self._parked_acks:
                self._apply_parked_acks()

    async def _group_commit(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._waiters:
                continue
            try:
                await self.flush()
            except StoreError as e:
                waiters, self._waiters = self._waiters, []
                for _, fut in waiters:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            flushed = self.log.flushed
            keep = []
            woken = 0
            for end, fut in self._waiters:
                if end <= flushed:
                    if not fut.done():
                        fut.set_result(None)
                        woken += 1
                else:
                    keep.append((end, fut))
            self._waiters = keep
            if woken and woken.bit_length() - 1 > self._batch_log2:
                self._batch_log2 = woken.bit_length() - 1
                log.info("group commit: one fsync released %d waiter(s), the largest batch so far", woken)
            while self._deadlines and self._deadlines[0][2].done():
                self._deadlines.popleft()
            if keep:
                self._wakeup.set()

    async def _async_flusher(self) -> None:
        """RocketMQ's FlushRealTimeService: flush when enough pages are dirty, or fully now and then."""
        interval = self.config.flush_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            dirty = self.log.dirty_bytes()
            overdue = time.monotonic() - self._last_flush >= self.config.full_flush_interval_ms / 1000
            if dirty >= self.config.flush_min_pages * 4096 or (dirty and overdue):
                try:
                    await self.flush()
                except StoreError:
                    return  # fatal: ``_fsync_failed`` logged it and told the node

    async def _checkpointer(self) -> None:
        while True:
            await asyncio.sleep(self.config.checkpoint_interval_ms / 1000)
            try:
                await self.write_checkpoint()
            except StoreError:
                return  # fatal: ``_fsync_failed`` logged it and told the node

    async def write_checkpoint(self) -> None:
        """fsync consume queues and ack logs, then record how far the log is known durable."""
        loop = asyncio.get_running_loop()
        durable = self.log.flushed  # every record below has its consume-queue entry written
        self._write_delivered()
        fds = []
        for q in self.queues.values():
            fds.extend(q.cq.take_dirty())
            if q.progress.dirty:
                fds.append(q.progress.fileno())
                q.progress.dirty = False
        self._check_open()
        # Duplicates, taken on the loop: a queue dropped while the pool syncs (a mirror's copy
        # dropped at a heal) closes its own descriptors, never these (an fsync of a closed or
        # reused number failed with EBADF and stopped the node).
        fds = [os.dup(fd) for fd in fds]
        try:
            try:
                await loop.run_in_executor(self._pool, _fsync_all, fds)
            finally:
                for fd in fds:
                    os.close(fd)
            if durable != self.checkpoint:
                await loop.run_in_executor(self._pool, self._write_checkpoint, durable)
                self.checkpoint = durable
            for q in list(self.queues.values()):
                if q.progress.wants_compaction():
                    snap = q.progress.compact_begin()
                    await loop.run_in_executor(self._pool, _write_synced, q.progress.compact_path, snap)
                    if self.queues.get(q.name) is q:
                        q.progress.compact_finish()
        except OSError as e:
            raise self._fsync_failed(
                f"checkpoint failed ({e}): consume queues and acks may not be on disk"
            ) from e

    # -- retention -------------------------------------------------------------------------------

    async def _retention(self) -> None:
        while True:
            await asyncio.sleep(self.config.retention_interval_ms / 1000)
            self.apply_retention()

    def apply_retention(self) -> list[int]:
        """Delete log segments every durable queue has fully acked (and the checkpoint has passed)."""
        needed = self.log.wrote
        for q in self.queues.values():
            first = q.progress.watermark
            while first in q.progress.acked:
                first += 1
            q.cq.delete_below(first)
            entry = q.cq.get(first)
            if entry is not None:
                needed = min(needed, entry[0])
        limit = min(needed, self.checkpoint)
        deleted = []
        for start in list(self.log.starts[:-1]):
            if start + self.config.segment_bytes <= limit:
                self.log.delete_segment(start)
                deleted.append(start)
        self.stats["segments_deleted"] += len(deleted)
        if deleted:
            log.info("retention deleted %d commit-log segment(s) below offset %d", len(deleted), limit)
        return deleted

    # -- closing ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.failed is not None:
            raise self.failed
        if self._closed:
            raise StoreError("the store is closed")

    def _fsync_failed(self, what: str) -> StoreError:
        """A failed fsync is fatal for the data it covered: never retried, never covered by a later one.

        Linux reports a writeback error to one fsync and may mark the failed pages
        clean, so a later fsync "succeeds" without the bytes being on disk
        (PostgreSQL's "fsyncgate", 2018). As PostgreSQL now does (PANIC, then redo from
        its log), the store stops: every waiting and later confirm fails, ``close``
        leaves the abort marker, and the node restarts to recover from what the disk
        really holds.
        """
        if self.failed is None:
            self.failed = StoreError(f"{what}; the store refuses further work until the node restarts")
            log.critical("%s", self.failed)
            waiters, self._waiters = self._waiters, []
            for _, fut in waiters:
                if not fut.done():
                    fut.set_exception(self.failed)
            if self.on_failure is not None:
                self.on_failure(self.failed)
        return self.failed

    async def close(self) -> None:
        """Flush everything, write the checkpoint, remove the abort marker (a clean shutdown)."""
        if self._closed:
            return
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.failed is not None:
            self.abandon()  # no clean shutdown after a failed fsync: the abort marker makes recovery rescan
            return
        await self.flush()
        await self.write_checkpoint()
        self._closed = True
        if self._timeout_timer is not None:
            self._timeout_timer.cancel()
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(StoreError("the store closed"))
        for q in self.queues.values():
            q.progress.close()
            q.cq.close()
        self.log.close()
        self._pool.shutdown(wait=True)
        durable.remove(self.data_dir / ABORT)

    def abandon(self) -> None:
        """Drop file handles without flushing or checkpointing (tests: an in-process 'crash')."""
        for t in self._tasks:
            t.cancel()
        self._closed = True
        for q in self.queues.values():
            os.close(q.progress.fileno())
            q.cq.close()
        self.log.close()
        self._pool.shutdown(wait=False)


def tag_hash(payload: bytes) -> int:
    """RocketMQ filters on a tag hash; here it is the routing key's CRC32 (cheap to read from the payload)."""
    try:
        _, _, exl, rkl = _MSG_HDR.unpack_from(payload, 0)
    except struct.error:
        return 0
    start = _MSG_HDR.size + exl
    return zlib.crc32(payload[start : start + rkl])


def queue_dirname(queue: str) -> str:
    """A file-system-safe, collision-free directory name for a queue name."""
    raw = queue.encode()
    if (
        len(raw) <= 100
        and raw.isascii()
        and all(c.isalnum() or c in "-_." for c in queue)
        and queue not in (".", "..")
    ):
        return "q-" + queue
    if len(raw) <= 100:
        return "x-" + raw.hex()
    return "h-" + hashlib.sha256(raw).hexdigest()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _fsync_all(fds: list[int]) -> None:
    for fd in fds:
        os.fdatasync(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


async def open_store(data_dir: Path, config: dict[str, Any] | StoreConfig | None = None) -> Store:
    """Open (and recover) the store in ``data_dir``; ``config`` is the broker's ``[store]`` table.

    Give the store a directory of its own (e.g. ``<node data_dir>/store``).
    Raises ``StoreConfigError`` with one line naming a bad key.
    """
    cfg = config if isinstance(config, StoreConfig) else StoreConfig.from_table(config)
    store = Store(Path(data_dir), cfg)
    store._open()
    store._start_tasks()
    return store
