"""Per-queue consume queue: fixed 20-byte entries (log offset int64, size int32, tag hash int64).

Entry i is the i-th persistent message of the queue, so a consumer position is
just an index. Entries are written at their index's position (``pwrite``), which
makes re-dispatching the same record during recovery idempotent; an all-zero
entry (size 0) is a hole, e.g. below what retention kept.

Each queue directory also holds ``meta`` (the queue's real name and the log
offset of the delete tombstone that preceded this incarnation, so replaying an
old delete never wipes a newer queue of the same name) and ``progress`` (acks,
see ``progress.py``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from broker_impl.store import durable

ENTRY = struct.Struct(">qiq")
ENTRY_SIZE = ENTRY.size  # 20


class ConsumeQueue:
    def __init__(self, directory: Path, name: str, entries_per_file: int, since: int = -1) -> None:
        self.dir = directory
        self.name = name
        self.per_file = entries_per_file
        self.since = since
        self._fds: dict[int, int] = {}
        self._dirty: set[int] = set()
        fresh = not directory.exists()
        durable.make_dirs(directory)
        if fresh or not (directory / "meta").exists():
            durable.write_file(directory / "meta", json.dumps({"name": name, "since": since}).encode())
        self.starts = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
        self.next_index = 0
        if self.starts:
            last = self.starts[-1]
            size = os.path.getsize(directory / f"{last:020d}")
            self.next_index = last + size // ENTRY_SIZE
            if size % ENTRY_SIZE:
                os.truncate(directory / f"{last:020d}", size - size % ENTRY_SIZE)

    @staticmethod
    def read_meta(directory: Path) -> tuple[str, int] | None:
        try:
            meta = json.loads((directory / "meta").read_text())
            return str(meta["name"]), int(meta["since"])
        except (OSError, ValueError, KeyError):
            return None

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is None:
            fd = durable.open_created(self.dir / f"{start:020d}", os.O_RDWR)
            self._fds[start] = fd
            if start not in self.starts:
                self.starts.append(start)
                self.starts.sort()
        return fd

    def put(self, index: int, offset: int, size: int, tag_hash: int) -> None:
        start = index - index % self.per_file
        os.pwrite(self._fd(start), ENTRY.pack(offset, size, tag_hash), (index - start) * ENTRY_SIZE)
        self._dirty.add(start)
        self.next_index = max(self.next_index, index + 1)

    def get(self, index: int) -> tuple[int, int, int] | None:
        """(log offset, size, tag hash) of entry ``index``, None for a hole or out of range."""
        if not 0 <= index < self.next_index:
            return None
        start = index - index % self.per_file
        if start not in self.starts:
            return None
        data = os.pread(self._fd(start), ENTRY_SIZE, (index - start) * ENTRY_SIZE)
        if len(data) < ENTRY_SIZE:
            return None
        offset, size, tag = ENTRY.unpack(data)
        return None if size <= 0 else (offset, size, tag)

    def entries(self, first: int) -> list[tuple[int, int, int, int]]:
        """(index, offset, size, tag) of every entry from ``first`` on, holes skipped."""
        out = []
        for start in self.starts:
            if start + self.per_file <= first:
                continue
            data = os.pread(self._fd(start), self.per_file * ENTRY_SIZE, 0)
            for k in range(len(data) // ENTRY_SIZE):
                index = start + k
                if index < first:
                    continue
                offset, size, tag = ENTRY.unpack_from(data, k * ENTRY_SIZE)
                if size > 0:
                    out.append((index, offset, size, tag))
        return out

    def truncate_from_log_offset(self, log_end: int) -> int:
        """Drop entries pointing at or past ``log_end`` (a cut log tail); return how many."""
        cut_at = None
        for index, offset, _size, _tag in self.entries(0):
            if offset >= log_end:
                cut_at = index
                break
        if cut_at is None:
            return 0
        dropped = self.next_index - cut_at
        start = cut_at - cut_at % self.per_file
        for later in [s for s in self.starts if s > start]:
            self._remove(later)
        if start in self.starts:
            os.ftruncate(self._fd(start), (cut_at - start) * ENTRY_SIZE)
        self.next_index = cut_at
        return dropped

    def delete_below(self, index: int) -> None:
        """Remove whole files whose entries are all below ``index`` (consumed); keep the last file."""
        for start in list(self.starts[:-1]):
            if start + self.per_file <= index:
                self._remove(start)

    def _remove(self, start: int) -> None:
        fd = self._fds.pop(start, None)
        if fd is not None:
            os.close(fd)
        self._dirty.discard(start)
        self.starts.remove(start)
        durable.remove(self.dir / f"{start:020d}")

    def take_dirty(self) -> list[int]:
        fds = [self._fds[s] for s in self._dirty if s in self._fds]
        self._dirty.clear()
        return fds

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def destroy(self) -> None:
        self.close()
        durable.remove_tree(self.dir)
