"""Per-queue spill files: where message bodies go when a queue's RAM budget is spent.

RabbitMQ's variable queue moves messages between RAM and disk (q1/q2/delta/q3/q4)
so that a long queue does not exhaust memory. Here the order and the index stay in
memory and only the serialised messages go to disk. Spill files are scratch space,
not durable state: a restart deletes them (``open_store`` clears ``spill/``), and
they are never fsync'ed.

Files are segmented so space is returned while the queue drains: each segment
counts its live messages and is deleted when the count reaches zero and it is no
longer the one being appended to.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from broker_impl.message import Message

_SEG_BITS = 40  # a location is (segment number << 40) | offset inside the segment


class SpillFile:
    """Append-only scratch storage for serialised messages of one queue."""

    def __init__(self, directory: Path, segment_bytes: int = 64 * 1024 * 1024) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._fds: dict[int, int] = {}
        self._live: dict[int, int] = {}
        self._seg = -1
        self._pos = 0
        self.bytes_on_disk = 0

    def _roll(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        old = self._seg
        self._seg += 1
        self._pos = 0
        path = self.directory / f"{self._seg:020d}.spill"
        self._fds[self._seg] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._live[self._seg] = 0
        if old >= 0 and self._live.get(old) == 0:
            self._remove(old)

    def write(self, message: Message) -> tuple[int, int]:
        """Store a message; return (location, length) for ``read``/``release``."""
        data = message.to_bytes()
        if self._seg < 0 or (self._pos > 0 and self._pos + len(data) > self.segment_bytes):
            self._roll()
        fd = self._fds[self._seg]
        os.pwrite(fd, data, self._pos)
        loc = (self._seg << _SEG_BITS) | self._pos
        self._pos += len(data)
        self._live[self._seg] += 1
        self.bytes_on_disk += len(data)
        return loc, len(data)

    def read(self, loc: int, length: int) -> Message:
        fd = self._fds[loc >> _SEG_BITS]
        data = os.pread(fd, length, loc & ((1 << _SEG_BITS) - 1))
        return Message.from_bytes(data)

    def release(self, loc: int, length: int) -> None:
        """The message at ``loc`` is gone from the queue; free its segment when empty."""
        seg = loc >> _SEG_BITS
        self._live[seg] -= 1
        self.bytes_on_disk -= length
        if self._live[seg] == 0 and seg != self._seg:
            self._remove(seg)

    def _remove(self, seg: int) -> None:
        os.close(self._fds.pop(seg))
        del self._live[seg]
        (self.directory / f"{seg:020d}.spill").unlink(missing_ok=True)

    def segment_count(self) -> int:
        return len(self._fds)

    def close(self) -> None:
        """Drop every spill segment: spilled bodies never outlive the process."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._live.clear()
        self._seg = -1
        self.bytes_on_disk = 0
        shutil.rmtree(self.directory, ignore_errors=True)
