"""Which of a NATS server's files hold a stream's messages as a power cut's dropped writes show
them, and what a replicated stream's Raft log holds (nats-server ``server/raft.go``,
``server/jetstream_cluster.go``).

A replicated stream (R>1) is a Raft group: its log is a file store of its own in the system
account's ``_js_`` directory (``<store>/jetstream/SYS/_js_/S-R3F-<id>/msgs/<n>.blk``, beside the
meta group's ``_meta_`` and the consumers' ``C-...`` groups), and the stream's own blocks
(``<store>/jetstream/<account>/streams/<stream>/msgs/<n>.blk``) are applied from it: a server
that lost them rebuilds them from the log. An R1 stream, or any stream of a standalone server, has
no Raft group (``createRaftGroup`` returns none for a single peer): its own blocks are the store.

Each log record (the file store's framing, ``filestore``; no subject, no headers) holds one append
entry (``appendEntry.encode``): the leader's id (8 bytes), term, commit, pterm, pindex (u64 each),
an entry count (u16), then per entry its length (u32, the type byte included), its type (1 byte,
0: normal) and its data. A stream append's data is ``encodeStreamMsg``'s: the op ``streamMsgOp``
(4), then sequence, time, subject, reply, headers and payload verbatim (the body's head is there
for ``body_ids``); or the op ``compressedStreamMsgOp`` (14) and the same S2-compressed, which hides
the body. NATS compresses an append whose subject, reply, headers and payload exceed 8 KiB
(2.10.16 and later); before, 256 bytes (2.10.0 to 2.10.14) or 4 KiB (2.9), once every peer says
it can decode them (``checkAllowMsgCompress``). The batch ops (16, 17) wrap either.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from plugins.nats.filestore import CHECKSUM, MSG_HDR, RL_BAD

RAFT_DIR = "/_js_/"  # the system account's Raft groups
STREAM_DIR = "/streams/"  # an account's streams
BLOCK = ".blk"
STREAM_MSG, COMPRESSED_STREAM_MSG, BATCH_MSG, BATCH_COMMIT = 4, 14, 16, 17
AE_HEAD = 8 + 4 * 8 + 2  # leader id, term, commit, pterm, pindex, entry count


def message_blocks(path: str, replicated: bool) -> bool:
    """Whether ``path`` is a block that holds the stream's messages as the store of record: the
    Raft log's blocks for a replicated stream, the stream's own blocks otherwise."""
    where = RAFT_DIR if replicated else STREAM_DIR
    return path.endswith(BLOCK) and where in "/" + path.lstrip("/")


def records(buf: bytes) -> Iterator[bytes]:
    """The payloads of the whole log records at the start of ``buf`` (a dropped write may begin
    or end inside one: the walk stops at the first framing that does not hold)."""
    at = 0
    while at + MSG_HDR <= len(buf):
        rl, _seq, _ts, slen = struct.unpack_from("<IQqH", buf, at)
        rl &= ~(1 << 31)
        if slen or rl < MSG_HDR + CHECKSUM or rl > RL_BAD or at + rl > len(buf):
            return
        yield buf[at + MSG_HDR : at + rl - CHECKSUM]
        at += rl


def stream_ops(entry: bytes) -> Iterator[int]:
    """The stream ops of one append entry's normal entries (a batch op's inner op)."""
    if len(entry) < AE_HEAD:
        return
    (count,) = struct.unpack_from("<H", entry, AE_HEAD - 2)
    at = AE_HEAD
    for _ in range(count):
        if at + 5 > len(entry):
            return
        (size,) = struct.unpack_from("<I", entry, at)
        data = entry[at + 5 : at + 4 + size]
        at += 4 + size
        if entry[at - size] != 0 or not data:  # not a normal entry
            continue
        yield inner_op(data)


def inner_op(data: bytes) -> int:
    """The op of a stream entry's data, through a batch op's id and sequence."""
    if data[0] not in (BATCH_MSG, BATCH_COMMIT) or len(data) < 3:
        return data[0]
    (blen,) = struct.unpack_from("<H", data, 1)
    at = 3 + blen
    while at < len(data) and data[at] & 0x80:  # the batch sequence, a uvarint
        at += 1
    return data[at + 1] if at + 1 < len(data) else data[0]


def compressed_appends(buf: bytes) -> int:
    """How many stream appends in the whole records of ``buf`` are S2-compressed (their bodies'
    ids cannot be read)."""
    return sum(op == COMPRESSED_STREAM_MSG for rec in records(buf) for op in stream_ops(rec))
