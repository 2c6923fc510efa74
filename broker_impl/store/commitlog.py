"""The commit log: fixed-size segment files named by their start offset (RocketMQ's MappedFileQueue).

Writes happen on the event loop with ``pwrite`` (page cache, microseconds); only
fsync leaves the loop (``flush`` runs in the store's executor). Every segment
written since its last fsync is remembered so a flush also covers a segment
that was rolled away from in the meantime.
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from broker_impl.store import durable, record
from broker_impl.store.record import Bad, Blank, Record

log = logging.getLogger("broker_impl.store")


@dataclass(slots=True, frozen=True)
class Cut:
    """What recovery removed from the log tail, and why."""

    offset: int
    bytes: int
    reason: str


def seg_name(start: int) -> str:
    return f"{start:020d}"


class CommitLog:
    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.dir = directory
        self.segment_bytes = segment_bytes
        durable.make_dirs(self.dir)
        self.starts: list[int] = sorted(int(p.name) for p in self.dir.iterdir() if p.name.isdigit())
        self._fds: dict[int, int] = {}
        self._dirty: set[int] = set()
        self.wrote = 0  # next append offset
        self.flushed = 0  # everything below is fsync'ed

    # -- files ------------------------------------------------------------------

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is None:
            fd = durable.open_created(self.dir / seg_name(start), os.O_RDWR)
            self._fds[start] = fd
        return fd

    def segment_of(self, offset: int) -> int | None:
        i = bisect.bisect_right(self.starts, offset) - 1
        return self.starts[i] if i >= 0 else None

    def first_offset(self) -> int:
        return self.starts[0] if self.starts else self.wrote

    # -- append / read ---------------------------------------------------------------

    def append(
        self, queue: str, queue_offset: int, payload: bytes, born_ms: int, store_ms: int, sysflag: int = 0
    ) -> tuple[int, int]:
        """Write one record; return (offset, size). Rolls with a BLANK when the segment is full."""
        size = record.encoded_size(queue, len(payload))
        if size + record.END_MIN_BLANK > self.segment_bytes:
            raise ValueError(f"record of {size} bytes does not fit a {self.segment_bytes}-byte segment")
        if size + record.END_MIN_BLANK > self.room():
            self.append_blank()
        offset = self.wrote
        self.append_raw(record.encode(queue, queue_offset, offset, payload, born_ms, store_ms, sysflag))
        return offset, size

    def room(self) -> int:
        """Bytes left in the segment the next append goes to (a whole segment when it starts a new one)."""
        start = self.starts[-1] if self.starts else None
        if start is None or self.wrote >= start + self.segment_bytes:
            return self.segment_bytes
        return start + self.segment_bytes - self.wrote

    def _writable_segment(self) -> int:
        start = self.starts[-1] if self.starts else None
        if start is None or self.wrote >= start + self.segment_bytes:
            self._new_segment(self.wrote)
            start = self.wrote
        return start

    def append_raw(self, data: bytes) -> None:
        """Write one encoded record at the log end (its PHYSICALOFFSET must be ``wrote``).

        ``append`` encodes and calls this; a replica writes the master's bytes as they
        are, so both logs hold the same record at the same offset.
        """
        start = self._writable_segment()
        os.pwrite(self._fd(start), data, self.wrote - start)
        self._dirty.add(start)
        self.wrote += len(data)

    def append_blank(self) -> None:
        """End the current segment with a BLANK; the next append starts a new one."""
        start = self._writable_segment()
        room = start + self.segment_bytes - self.wrote
        os.pwrite(self._fd(start), record.encode_blank(room), self.wrote - start)
        self._dirty.add(start)
        self.wrote = start + self.segment_bytes

    def start_at(self, offset: int) -> None:
        """Make an empty log begin at ``offset`` (a replica of a log whose older segments are gone)."""
        if self.starts or offset % self.segment_bytes:
            raise ValueError(f"an empty log can only start at a segment boundary, not {offset}")
        self.wrote = self.flushed = offset

    def read_raw(self, offset: int, limit: int) -> tuple[bytes, int]:
        """Whole records from ``offset`` (a record boundary), about ``limit`` bytes: (bytes, next offset).

        At least one record when there is one; a BLANK comes alone as its 12 encoded
        bytes and the next offset is the following segment's start.
        """
        start = self.segment_of(offset)
        if start is None or offset >= self.wrote:
            return b"", offset
        seg_end = start + self.segment_bytes
        fd = self._fd(start)
        head = os.pread(fd, 8, offset - start)
        size, magic = int.from_bytes(head[:4], "big"), int.from_bytes(head[4:8], "big")
        if magic == record.BLANK_MAGIC:
            return os.pread(fd, record.BLANK_SIZE, offset - start), seg_end
        chunk = os.pread(fd, max(size, min(limit, self.wrote - offset, seg_end - offset)), offset - start)
        end = 0
        while end + 8 <= len(chunk):
            size = int.from_bytes(chunk[end : end + 4], "big")
            if int.from_bytes(chunk[end + 4 : end + 8], "big") != record.MESSAGE_MAGIC or end + size > len(
                chunk
            ):
                break
            end += size
        return chunk[:end], offset + end

    def _new_segment(self, start: int) -> None:
        self.starts.append(start)
        fd = self._fd(start)
        os.ftruncate(fd, 0)

    def read(self, offset: int, size: int) -> Record | Bad:
        start = self.segment_of(offset)
        if start is None or offset + size > self.wrote:
            return Bad(f"offset {offset} is outside the log")
        data = os.pread(self._fd(start), size, offset - start)
        got = record.decode(data, 0, offset, start + self.segment_bytes - offset)
        if isinstance(got, Blank):
            return Bad(f"BLANK at {offset}")
        return got

    # -- flush -------------------------------------------------------------------------

    def take_dirty(self) -> tuple[int, list[int]]:
        """Claim what a flush must cover: (offset it makes durable, fds to fsync)."""
        target = self.wrote
        fds = [self._fd(s) for s in sorted(self._dirty)]
        self._dirty.clear()
        return target, fds

    def dirty_bytes(self) -> int:
        return self.wrote - self.flushed

    # -- retention ---------------------------------------------------------------------

    def delete_segment(self, start: int) -> None:
        fd = self._fds.pop(start, None)
        if fd is not None:
            os.close(fd)
        self.starts.remove(start)
        durable.remove(self.dir / seg_name(start))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    # -- recovery ----------------------------------------------------------------------

    def recover(self, scan_from: int) -> tuple[list[Record], list[Cut]]:
        """Validate from ``scan_from`` to the end; cut the log at the first bad record.

        Returns the valid records seen (to re-dispatch) and what was cut.
        """
        if not self.starts:
            self.wrote = self.flushed = 0
            return [], []
        i = max(0, bisect.bisect_right(self.starts, scan_from) - 1)
        records: list[Record] = []
        cuts: list[Cut] = []
        while True:
            start = self.starts[i]
            end, bad = self._scan_segment(start, records)
            full = end == start + self.segment_bytes
            more = i + 1 < len(self.starts)
            if bad is None and full and more and self.starts[i + 1] == end:
                i += 1
                continue
            if bad is None and more:
                bad = (
                    "gap between segments" if full else "segment ends without a BLANK before a later segment"
                )
            path = self.dir / seg_name(start)
            cut_bytes = 0
            if not full and os.path.getsize(path) > end - start:
                cut_bytes = os.path.getsize(path) - (end - start)
                os.truncate(path, end - start)
            for later in self.starts[i + 1 :]:
                cut_bytes += os.path.getsize(self.dir / seg_name(later))
                self.delete_segment(later)
            if bad is not None or cut_bytes:
                cuts.append(Cut(end, cut_bytes, bad or "trailing bytes"))
            self.wrote = self.flushed = end
            break
        for cut in cuts:
            log.warning(
                "commit log cut at offset %d: %d bytes removed (%s)", cut.offset, cut.bytes, cut.reason
            )
        return records, cuts

    def _scan_segment(self, start: int, out: list[Record]) -> tuple[int, str | None]:
        """Walk one segment; return (end offset of valid data, reason it stopped early or None)."""
        path = self.dir / seg_name(start)
        size = os.path.getsize(path)
        if size == 0:
            return start, None
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = 0
            while pos < size:
                got = record.decode(mm, pos, start + pos, self.segment_bytes - pos)
                if isinstance(got, Blank):
                    return start + self.segment_bytes, None
                if isinstance(got, Bad):
                    return start + pos, got.reason
                out.append(got)
                pos += got.size
        return start + pos, None

    def iter_records(self, from_offset: int) -> Iterator[Record]:
        """Valid records from ``from_offset`` (a record boundary) to the end, for rebuilding indexes."""
        for start in self.starts:
            if start + self.segment_bytes <= from_offset:
                continue
            found: list[Record] = []
            self._scan_segment(start, found)
            yield from (r for r in found if r.offset >= from_offset)
