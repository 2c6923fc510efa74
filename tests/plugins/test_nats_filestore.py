"""The reader of nats-server 2.9.10's message blocks (``plugins.nats.filestore``).

``data/nats-2.9.10-chaos-1-1.blk`` is the first 12 records of a real block: Debian's
nats-server 2.9.10 wrote it for stream ``chaos-1`` (block 1) in a 5-node run of this
workload, cut at a record boundary. Its checksums were written by the server, so a reader
that accepts them computes HighwayHash-64 and frames records as the server does.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.nats import filestore
from plugins.nats.client import ID_HEADER
from plugins.nats.filestore import EBIT, highwayhash64, read_block, read_index, read_stream

BLOCK = Path(__file__).parent / "data" / "nats-2.9.10-chaos-1-1.blk"
STREAM = "chaos-1"
HELD = [
    (1, "p2:1"),
    (2, "p2:2"),
    (3, "p1:1"),
    (4, "p1:2"),
    (5, "p1:3"),
    (6, "p2:3"),
    (7, "p2:4"),
    (8, "p1:4"),
    (9, "p1:5"),
    (10, "p1:6"),
    (11, "p1:7"),
    (12, "p1:8"),
]

# minio/highwayhash's test vectors: HighwayHash-64 of bytes 0..i-1 under the key 0x00..0x1f.
VECTORS64 = (
    "536ec222de567a90 78ddcdc7aa43ab7e 623db5b09a56d0b8 803d468aabef6b5c da7e009368a405f2 "
    "4145a9e468168a2b 6fcaef5b32cc4cbd 8294f53817ae024d 71315fe5085120e1 84157ac74e64d232 "
    "0ba903b1cd0ae1f6 155c415b61f4bbc3 9cfa630004c23c24 ff41e665ce589aa8 235a4548a331b024 "
    "3bf349a4863f7940 32b87ef98934abcf e2c0c5c8d267fe19 c25c569ca690dd04 04c571238e51d975 "
    "16ddd341119bad38 e0708acd2c436402 90336888625adba9 8c023f009254b0d7 1ee559ea5a615f20 "
    "8428052196c8e0ee 4f4f28a7931afc1b 1da90db7b5752151 39c6a2a076891ff7 e7e3841fef3f09ae "
    "0f866111b092ca22 685a03cf7c00c79f fc80d5ecd964c9a0 fc8131a03cf7902c 9eeb91564ef85c18 "
    "9baa5227eff5c14f eb330a5e1a39b7f5 9c6ce9b4834bb8b9 b4d95c2a71fe425e dc973f0cf9f250a1"
).split()


def records(buf: bytes) -> list[tuple[int, int]]:
    """(offset, length) of every record of a block."""
    out, at = [], 0
    while at < len(buf):
        rl = struct.unpack_from("<I", buf, at)[0] & ~(1 << 31)
        out.append((at, rl))
        at += rl
    return out


@pytest.mark.parametrize("n", range(len(VECTORS64)))
def test_highwayhash64_matches_the_reference_vectors(n: int) -> None:
    got = struct.pack("<Q", highwayhash64(bytes(range(32)), bytes(range(n)))).hex()
    assert got == VECTORS64[n]


def test_a_real_block_reads_as_the_server_wrote_it() -> None:
    entries, skipped = read_block(BLOCK.read_bytes(), STREAM, 1, ID_HEADER)
    assert entries == HELD
    assert skipped == []


def test_the_checksum_is_keyed_by_stream_and_block() -> None:
    """Under another stream name or block index every record fails its checksum."""
    for stream, index in ((STREAM, 2), ("chaos-2", 1)):
        entries, skipped = read_block(BLOCK.read_bytes(), stream, index, ID_HEADER)
        assert entries == []
        assert [s["why"] for s in skipped] == ["checksum mismatch"] * len(HELD)


def test_a_flipped_payload_bit_drops_that_record_only() -> None:
    buf = bytearray(BLOCK.read_bytes())
    at, rl = records(bytes(buf))[4]  # seq 5
    buf[at + rl - 20] ^= 0x10  # inside the payload, before the checksum
    entries, skipped = read_block(bytes(buf), STREAM, 1, ID_HEADER)
    assert entries == HELD[:4] + HELD[5:]
    assert skipped == [{"seq": 5, "at": at, "why": "checksum mismatch"}]


def test_a_flipped_length_bit_ends_the_block() -> None:
    buf = bytearray(BLOCK.read_bytes())
    at, _ = records(bytes(buf))[4]
    buf[at + 3] ^= 0x01  # total_len's top byte (not the headers bit): far past the block's end
    entries, skipped = read_block(bytes(buf), STREAM, 1, ID_HEADER)
    assert entries == HELD[:4]
    assert len(skipped) == 1 and skipped[0]["at"] == at and skipped[0]["why"].startswith("bad record length")


def test_a_torn_tail_keeps_the_records_before_it() -> None:
    buf = BLOCK.read_bytes()
    at, rl = records(buf)[-1]
    for cut in (at + 10, at + rl - 1):  # inside the header, inside the body
        entries, skipped = read_block(buf[:cut], STREAM, 1, ID_HEADER)
        assert entries == HELD[:-1]
        assert len(skipped) == 1 and skipped[0]["at"] == at


def test_erased_records_are_not_held() -> None:
    buf = bytearray(BLOCK.read_bytes())
    at, _ = records(bytes(buf))[2]  # seq 3
    seq = struct.unpack_from("<Q", buf, at + 4)[0]
    struct.pack_into("<Q", buf, at + 4, seq | EBIT)
    entries, skipped = read_block(bytes(buf), STREAM, 1, ID_HEADER)
    assert entries == HELD[:2] + HELD[3:]
    assert skipped == []


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def index_file(first: int, last: int, deleted: list[int]) -> bytes:
    """A block index as 2.9.10 writes it: magic, version, msgs, bytes, first seq and ts, last
    seq and ts, the delete map's length, the last checksum, the delete map (offsets from first)."""
    msgs = last - first + 1 - len(deleted)
    head = b"".join(uvarint(v) for v in (msgs, 1000, first, 7, last, 9, len(deleted)))
    return bytes([22, 1]) + head + b"\0" * 8 + b"".join(uvarint(s - first) for s in deleted)


def test_the_index_removes_what_was_deleted() -> None:
    info = read_index(index_file(3, 12, [5, 9]))
    assert info == (3, {5, 9})
    entries, _ = read_block(BLOCK.read_bytes(), STREAM, 1, ID_HEADER, info)
    assert [s for s, _ in entries] == [3, 4, 6, 7, 8, 10, 11, 12]


def test_an_unreadable_index_is_ignored() -> None:
    assert read_index(b"") is None
    assert read_index(bytes([23, 1]) + index_file(3, 12, [])[2:]) is None  # wrong magic
    assert read_index(index_file(3, 12, [5])[:-9]) is None  # short
    good = index_file(3, 12, [5])
    assert read_index(good[:2] + uvarint(99) + good[3:]) is None  # counts disagree


def store(tmp_path: Path, account: str = "APP") -> Path:
    msgs = tmp_path / "jetstream" / account / "streams" / STREAM / "msgs"
    msgs.mkdir(parents=True)
    (msgs / "1.blk").write_bytes(BLOCK.read_bytes())
    return tmp_path


def test_a_store_is_read_as_the_plugin_runs_it_in_the_container(tmp_path: Path) -> None:
    """``python3 -c SOURCE STORE STREAM HEADER`` prints what ``read_stream`` returns."""
    root = store(tmp_path)
    source = Path(filestore.__file__).read_text()
    out = subprocess.run(
        [sys.executable, "-c", source, str(root), STREAM, ID_HEADER],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    got = json.loads(out)
    assert got["found"] is True
    assert [tuple(e) for e in got["entries"]] == HELD
    assert got["blocks"] == [{"block": 1, "bytes": BLOCK.stat().st_size, "entries": 12, "index": False}]
    assert read_stream(root, "chaos-2", ID_HEADER)["found"] is False


def test_a_stream_in_two_accounts_is_refused(tmp_path: Path) -> None:
    root = store(tmp_path)
    store(tmp_path, "OTHER")
    with pytest.raises(ValueError, match="more than one account"):
        read_stream(root, STREAM, ID_HEADER)
