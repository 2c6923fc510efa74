"""Which dropped writes hold a NATS stream's messages (``plugins.nats.raftlog``, ``Nats.unsynced_messages``).

The stream's own block is a real one (``data/nats-2.9.10-chaos-1-1.blk``, see
``test_nats_filestore``); the Raft log's block is built here as nats-server writes it: each
record (``filestore``'s framing and checksum, keyed by the group's name) holds one append entry
(``server/raft.go`` ``appendEntry.encode``) whose normal entries are stream appends
(``server/jetstream_cluster.go`` ``encodeStreamMsgAllowCompressAndBatch``).
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest

from harness.spec import UnsyncedWrite, message_body
from plugins.nats import Nats, raftlog
from plugins.nats.client import ID_HEADER
from plugins.nats.filestore import highwayhash64, read_block

STREAM_BLOCK = (Path(__file__).parent / "data" / "nats-2.9.10-chaos-1-1.blk").read_bytes()
STREAM_PATH = "/jetstream/APP/streams/chaos-1/msgs/1.blk"
GROUP = "S-R3F-dC0Tb1Jm"
RAFT_PATH = f"/jetstream/SYS/_js_/{GROUP}/msgs/1.blk"
REPLICATED = {"replicas": 3}


def stream_append(seq: int, msg_id: str, op: int = raftlog.STREAM_MSG) -> bytes:
    """One publish as the stream's leader proposes it (not compressed: under 8 KiB)."""
    hdr = f"NATS/1.0\r\n{ID_HEADER}: {msg_id}\r\n\r\n".encode()
    subject, reply, msg = b"chaos-1", b"_INBOX.x1", message_body(msg_id, 3, 256)
    out = bytes([op]) + struct.pack("<QQ", seq, 1_764_370_000_000_000_000 + seq)
    for part in (subject, reply, hdr):
        out += struct.pack("<H", len(part)) + part
    return out + struct.pack("<I", len(msg)) + msg + b"\x00"  # flags, a uvarint


def append_entry(pindex: int, *datas: bytes) -> bytes:
    """An append entry of normal entries, as the WAL stores it."""
    out = b"n3leader" + struct.pack("<QQQQH", 2, pindex, 2, pindex, len(datas))
    for data in datas:
        out += struct.pack("<I", 1 + len(data)) + b"\x00" + data
    return out + b"\x02"  # lterm, a uvarint


def wal_record(seq: int, payload: bytes) -> bytes:
    """A file store record with no subject or headers, checksummed as block 1 of ``GROUP``."""
    key = hashlib.sha256(f"{GROUP}-1".encode()).digest()
    ts = 1_764_370_000_000_000_000 + seq
    head = struct.pack("<IQqH", 22 + len(payload) + 8, seq, ts, 0)
    return head + payload + struct.pack("<Q", highwayhash64(key, struct.pack("<Qq", seq, ts) + payload))


def raft_block(*entries: bytes) -> bytes:
    return b"".join(wal_record(i + 1, e) for i, e in enumerate(entries))


LOG = raft_block(append_entry(0, stream_append(1, "p1:1")), append_entry(1, stream_append(2, "p2:1")))


def test_the_built_log_block_is_framed_as_the_file_store_reads_it() -> None:
    entries, skipped = read_block(LOG, GROUP, 1, ID_HEADER)
    assert skipped == [] and [seq for seq, _ in entries] == [1, 2]


def test_a_replicated_streams_dropped_own_block_alone_gives_no_ids() -> None:
    """Under ``sync_interval: always`` a cut dropped only the stream's block: the log was synced."""
    writes: list[UnsyncedWrite] = [{"path": STREAM_PATH, "offset": 0, "data": STREAM_BLOCK}]
    assert Nats().unsynced_messages(writes, REPLICATED, 3) == []
    assert Nats().unsynced_messages(writes, {"replicas": None}, 5) == []


def test_a_replicated_streams_dropped_log_block_gives_the_ids() -> None:
    writes: list[UnsyncedWrite] = [
        {"path": STREAM_PATH, "offset": 0, "data": STREAM_BLOCK},
        {"path": RAFT_PATH, "offset": 4096, "data": LOG},
    ]
    assert Nats().unsynced_messages(writes, REPLICATED, 3) == ["p1:1", "p2:1"]


def test_an_r1_streams_dropped_block_gives_the_ids() -> None:
    writes: list[UnsyncedWrite] = [
        {"path": STREAM_PATH, "offset": 0, "data": STREAM_BLOCK},
        {"path": "/jetstream/APP/streams/chaos-1/msgs/1.idx", "offset": 0, "data": LOG},
    ]
    held = [f"p1:{n}" for n in range(1, 9)] + [f"p2:{n}" for n in range(1, 5)]
    assert Nats().unsynced_messages(writes, {"replicas": 1}, 3) == held
    assert Nats().unsynced_messages(writes, {"replicas": None}, 1) == held  # a standalone server


def test_a_compressed_append_in_a_dropped_log_block_is_unreadable_not_uncounted() -> None:
    compressed = stream_append(3, "p1:2", op=raftlog.COMPRESSED_STREAM_MSG)
    batch = bytes([raftlog.BATCH_COMMIT]) + struct.pack("<H", 4) + b"uuid" + b"\x81\x01" + compressed
    for data in (compressed, batch):
        log = LOG + raft_block(append_entry(2, data))
        writes: list[UnsyncedWrite] = [{"path": RAFT_PATH, "offset": 0, "data": log}]
        with pytest.raises(ValueError, match="1 dropped Raft log append"):
            Nats().unsynced_messages(writes, REPLICATED, 3)
    assert raftlog.compressed_appends(LOG) == 0


def test_a_write_that_begins_inside_a_record_is_not_framed() -> None:
    assert list(raftlog.records(LOG[5:])) == []
    assert [len(r) for r in raftlog.records(LOG + LOG[:30])] == [len(r) for r in raftlog.records(LOG)]
