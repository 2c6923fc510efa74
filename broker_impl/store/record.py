"""Commit-log record layout (big-endian), adapted from RocketMQ's CommitLog.doAppend.

======  ==============  =====================================================
bytes   field           why
======  ==============  =====================================================
4       TOTALSIZE       walk the log record by record
4       MAGIC           tells a message from a BLANK segment end (or garbage)
4       CRC32           over the WHOLE record except this field (RocketMQ only
                        covers the body: a flipped bit in the queue name or
                        offset would go unnoticed there)
4       SYSFLAG         ``FLAG_DELETE`` marks a queue-delete tombstone; the
                        ``FLAG_TX_*`` bits mark transaction records (below)
8       QUEUEOFFSET     index of the message in its queue's consume queue
                        (a transaction's commit record: the index of its first
                        message; a prepared or rollback record: the transaction
                        id, as RocketMQ, whose prepared records have no queue
                        offset either)
8       PHYSICALOFFSET  the record's own log offset: a record copied to the
                        wrong place (or a stale one after truncation) fails
8       BORNTIMESTAMP   ms; the message's own timestamp property when it has one
8       STORETIMESTAMP  ms
2 + n   QUEUE           queue name, UTF-8
4 + n   PAYLOAD         ``Message.to_bytes()``: exchange, routing key,
                        properties, body
======  ==============  =====================================================

Transactions (AMQP ``tx``), RocketMQ's way (``seeds/004``): a publish inside a
transaction is written at once as a prepared ("half") record, ``FLAG_TX_PREPARED``,
which recovery never dispatches to a consume queue; ``tx.commit`` writes, for
each queue the transaction touched, ONE commit record holding copies of all its
messages for that queue (``FLAG_TX_COMMIT``, payload = ``pack_batch``), and one
holding all its acks there (``FLAG_TX_ACK``, payload = 8-byte indexes);
``tx.rollback`` writes a ``FLAG_TX_ROLLBACK`` record with no payload. One record is
all-or-nothing after a crash (its CRC covers it, recovery cuts the log at the
first bad one), which is what makes a transaction atomic per queue: the unit the
AMQP spec asks servers to make atomic at least.

A BLANK record fills the end of a segment: TOTALSIZE = the rest of the segment,
MAGIC = ``BLANK_MAGIC``, CRC32 over those 8 bytes. It is written when a record
plus ``END_MIN_BLANK`` bytes does not fit, so a BLANK always fits.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from dataclasses import dataclass

MESSAGE_MAGIC = 0xDAA320A7  # RocketMQ's MESSAGE_MAGIC_CODE
BLANK_MAGIC = 0xCBD43194  # RocketMQ's BLANK_MAGIC_CODE
FLAG_DELETE = 1
FLAG_TX_PREPARED = 2
FLAG_TX_COMMIT = 4
FLAG_TX_ACK = 8
FLAG_TX_ROLLBACK = 16
END_MIN_BLANK = 12  # RocketMQ reserves 8; our BLANK also carries a CRC

_HEAD = struct.Struct(">IIIIQQQQ")  # size, magic, crc, sysflag, qoff, phys, born, store
_BLANK = struct.Struct(">III")
HEADER_SIZE = _HEAD.size
BLANK_SIZE = _BLANK.size  # what a BLANK record really writes (it claims the rest of the segment)
MAX_RECORD = 1 << 30


@dataclass(slots=True, frozen=True)
class Record:
    queue: str
    queue_offset: int
    offset: int
    born_ms: int
    store_ms: int
    payload: bytes
    sysflag: int = 0
    size: int = 0


@dataclass(slots=True, frozen=True)
class Blank:
    size: int


@dataclass(slots=True, frozen=True)
class Bad:
    """Why the bytes at an offset are not a record: the recovery report quotes it."""

    reason: str


def encode(
    queue: str, queue_offset: int, offset: int, payload: bytes, born_ms: int, store_ms: int, sysflag: int = 0
) -> bytes:
    q = queue.encode()
    size = HEADER_SIZE + 2 + len(q) + 4 + len(payload)
    head = _HEAD.pack(size, MESSAGE_MAGIC, 0, sysflag, queue_offset, offset, born_ms, store_ms)
    tail = b"".join((struct.pack(">H", len(q)), q, struct.pack(">I", len(payload)), payload))
    crc = zlib.crc32(tail, zlib.crc32(head[12:], zlib.crc32(head[:8])))
    return b"".join((head[:8], struct.pack(">I", crc), head[12:], tail))


def encoded_size(queue: str, payload_len: int) -> int:
    return HEADER_SIZE + 2 + len(queue.encode()) + 4 + payload_len


def encode_blank(size: int) -> bytes:
    head = struct.pack(">II", size, BLANK_MAGIC)
    return head + struct.pack(">I", zlib.crc32(head))


def decode(buf: bytes | memoryview | mmap.mmap, pos: int, offset: int, room: int) -> Record | Blank | Bad:
    """Decode the record at ``buf[pos:]`` whose log offset is ``offset``.

    ``room`` is how many bytes the segment has left from ``pos`` (the segment
    size, not the file size: a BLANK must reach exactly the segment end).
    """
    have = len(buf) - pos
    if have < 8:
        return Bad("truncated header" if any(bytes(buf[pos:])) else "zero-filled")
    size, magic = struct.unpack_from(">II", buf, pos)
    if size == 0 and magic == 0:
        return Bad("zero-filled")
    if magic == BLANK_MAGIC:
        if size != room or have < _BLANK.size:
            return Bad(f"bad BLANK size {size} (segment has {room} left)")
        (crc,) = struct.unpack_from(">I", buf, pos + 8)
        if crc != zlib.crc32(bytes(buf[pos : pos + 8])):
            return Bad("BLANK crc mismatch")
        return Blank(size)
    if magic != MESSAGE_MAGIC:
        return Bad(f"bad magic 0x{magic:08x}")
    if size < HEADER_SIZE + 6 or size > room or size > MAX_RECORD:
        return Bad(f"bad size {size}")
    if size > have:
        return Bad(f"truncated record ({have} of {size} bytes)")
    rec = bytes(buf[pos : pos + size])
    (crc,) = struct.unpack_from(">I", rec, 8)
    if crc != zlib.crc32(rec[12:], zlib.crc32(rec[:8])):
        return Bad("crc mismatch")
    _, _, _, sysflag, qoff, phys, born, stored = _HEAD.unpack_from(rec, 0)
    if phys != offset:
        return Bad(f"record claims offset {phys}")
    (qlen,) = struct.unpack_from(">H", rec, HEADER_SIZE)
    p = HEADER_SIZE + 2
    queue = rec[p : p + qlen].decode()
    p += qlen
    if p + 4 > size:
        return Bad(f"queue name length {qlen} does not fit size {size}")
    (plen,) = struct.unpack_from(">I", rec, p)
    p += 4
    if p + plen != size:
        return Bad(f"payload length {plen} does not match size {size}")
    return Record(queue, qoff, phys, born, stored, rec[p:], sysflag, size)


def pack_batch(payloads: list[bytes]) -> bytes:
    """A commit record's payload: each message's ``to_bytes`` with a 4-byte length."""
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)


def unpack_batch(payload: bytes) -> list[bytes]:
    out, off = [], 0
    while off + 4 <= len(payload):
        (n,) = struct.unpack_from(">I", payload, off)
        out.append(payload[off + 4 : off + 4 + n])
        off += 4 + n
    return out


def pack_indexes(indexes: list[int]) -> bytes:
    return struct.pack(f">{len(indexes)}Q", *indexes)


def unpack_indexes(payload: bytes) -> list[int]:
    return list(struct.unpack(f">{len(payload) // 8}Q", payload[: len(payload) // 8 * 8]))
