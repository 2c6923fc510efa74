"""Consumer progress of one durable queue: which consume-queue indexes are acked, how far delivery got.

Acks arrive out of order (several consumers, prefetch, rejects), so progress is a
contiguous watermark (every index below it is acked) plus the set of acked indexes
above it. ``delivered`` is one past the highest index ever handed to a consumer:
because fetch always takes the lowest ready message, every index below it has been
delivered, which is what lets a restart mark exactly those messages redelivered.

On disk it is a small append-only log of CRC'd records, compacted into a snapshot
when it grows. A torn last record (crash mid-write) is ignored on load.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

from broker_impl.store import durable

_HEAD = struct.Struct(">IIB")  # length of body, crc32 of (type + body), type
ACKS, DELIVERED, SNAPSHOT, TRUNCATE = 1, 2, 3, 4
COMPACT_BYTES = 256 * 1024


class Progress:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.watermark = 0
        self.acked: set[int] = set()
        self.delivered = 0
        self._written_delivered = 0
        self._load()
        self._fd = durable.open_created(path, os.O_RDWR | os.O_APPEND)
        self._size = os.fstat(self._fd).st_size
        self._pending: list[bytes] | None = None
        self.dirty = False

    # -- state ----------------------------------------------------------------------

    def is_acked(self, index: int) -> bool:
        return index < self.watermark or index in self.acked

    def _apply_acks(self, indexes: Iterable[int]) -> None:
        for i in indexes:
            if i >= self.watermark:
                self.acked.add(i)
        while self.watermark in self.acked:
            self.acked.discard(self.watermark)
            self.watermark += 1

    def _apply_truncate(self, next_index: int) -> None:
        self.acked = {i for i in self.acked if i < next_index}
        self.watermark = min(self.watermark, next_index)
        self.delivered = min(self.delivered, next_index)

    # -- updates (written immediately to the page cache; fsync'ed by the store's checkpoint) --

    def ack(self, indexes: list[int]) -> None:
        if not indexes:
            return
        self._apply_acks(indexes)
        self._append(ACKS, struct.pack(f">{len(indexes)}Q", *indexes))

    def mark_delivered(self, index: int) -> None:
        if index + 1 > self.delivered:
            self.delivered = index + 1

    def write_delivered(self) -> None:
        """Persist ``delivered`` if it moved; called once per loop turn, not per fetch."""
        if self.delivered != self._written_delivered:
            self._written_delivered = self.delivered
            self._append(DELIVERED, struct.pack(">Q", self.delivered))

    def truncate(self, next_index: int) -> None:
        """The log lost indexes from ``next_index`` on: forget acks/deliveries of them (they will be reused)."""
        if (
            self.watermark > next_index
            or self.delivered > next_index
            or any(i >= next_index for i in self.acked)
        ):
            self._apply_truncate(next_index)
            self._written_delivered = self.delivered
            self._append(TRUNCATE, struct.pack(">Q", next_index))

    def _append(self, kind: int, body: bytes) -> None:
        crc = zlib.crc32(body, zlib.crc32(bytes((kind,))))
        data = _HEAD.pack(len(body), crc, kind) + body
        os.write(self._fd, data)
        self._size += len(data)
        if self._pending is not None:
            self._pending.append(data)
        self.dirty = True

    def wants_compaction(self) -> bool:
        return (
            self._pending is None
            and self._size > COMPACT_BYTES
            and self._size > 16 * 8 * (len(self.acked) + 1)
        )

    def compact_begin(self) -> bytes:
        """A snapshot of the current state; records appended from now on are kept for ``compact_finish``."""
        acked = sorted(self.acked)
        body = struct.pack(f">QQI{len(acked)}Q", self.watermark, self.delivered, len(acked), *acked)
        crc = zlib.crc32(body, zlib.crc32(bytes((SNAPSHOT,))))
        self._pending = []
        return _HEAD.pack(len(body), crc, SNAPSHOT) + body

    @property
    def compact_path(self) -> Path:
        return self.path.with_suffix(".tmp")

    def compact_finish(self) -> None:
        """The snapshot is fsync'ed in ``compact_path``: add what came since, and swap it in."""
        pending, self._pending = self._pending or [], None
        fd = os.open(self.compact_path, os.O_WRONLY | os.O_APPEND)
        try:
            for data in pending:
                os.write(fd, data)
        finally:
            os.close(fd)
        durable.replace(self.compact_path, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size
        self.dirty = True

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        self.write_delivered()
        os.close(self._fd)

    # -- load -------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        pos = 0
        while pos + _HEAD.size <= len(data):
            length, crc, kind = _HEAD.unpack_from(data, pos)
            body = data[pos + _HEAD.size : pos + _HEAD.size + length]
            if len(body) < length or zlib.crc32(body, zlib.crc32(bytes((kind,)))) != crc:
                break
            if kind == ACKS:
                self._apply_acks(struct.unpack(f">{length // 8}Q", body))
            elif kind == DELIVERED:
                (self.delivered,) = struct.unpack(">Q", body)
            elif kind == TRUNCATE:
                self._apply_truncate(struct.unpack(">Q", body)[0])
            elif kind == SNAPSHOT:
                self.watermark, self.delivered, n = struct.unpack_from(">QQI", body)
                self.acked = set(struct.unpack_from(f">{n}Q", body, 20))
            pos += _HEAD.size + length
        if pos < len(data):
            # A torn tail from a crash mid-write: drop it so new records append cleanly.
            os.truncate(self.path, pos)
        self._written_delivered = self.delivered
