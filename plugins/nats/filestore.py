"""What one NATS server's own file store holds for a stream, read from its message blocks.

A JetStream API read goes to the stream's leader, so it says what the leader serves, not
what each replica keeps. This module reads a server's files instead: the stream's message
blocks (``<store>/jetstream/<account>/streams/<stream>/msgs/<n>.blk``) and their indexes
(``<n>.idx``), in the format of nats-server 2.9.10's ``server/filestore.go``:

- a record is ``total_len u32`` (high bit: has headers), ``seq u64`` (high bit: erased),
  ``ts i64``, ``subj_len u16``, the subject, with headers ``hdr_len u32`` and the headers,
  the payload, and an 8-byte HighwayHash-64 of ``seq ts subject headers payload`` keyed by
  SHA-256 of ``"<stream>-<block index>"`` (all little-endian);
- an index holds the block's first sequence and its delete map (messages removed from the
  middle of the block, which stay in the ``.blk`` until it is compacted).

A record whose checksum does not match is not held (the server refuses to serve it:
``errBadMsg``); a record whose framing is broken ends the block (the server truncates
there when it rebuilds the block). Only the standard library is imported: the plugin runs
this file's source in the node's container (``python3 -c SOURCE STORE_DIR STREAM ID_HEADER``)
and reads the JSON it prints.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import sys
from pathlib import Path
from typing import Any

MASK = (1 << 64) - 1
HBIT = 1 << 31  # total_len: the record has headers
EBIT = 1 << 63  # seq: an erased record
MSG_HDR = 22
CHECKSUM = 8
RL_BAD = 32 * 1024 * 1024  # rlBadThresh: a longer record is garbage
IDX_MAGIC, IDX_VERSION = 22, 1

_INIT0 = (0xDBE6D5D5FE4CCE2F, 0xA4093822299F31D0, 0x13198A2E03707344, 0x243F6A8885A308D3)
_INIT1 = (0x3BD39E10CB0EF593, 0xC0ACF169B5F18A8C, 0xBE5466CF34E90C6C, 0x452821E638D01377)


def _rot32(x: int) -> int:
    return ((x >> 32) | (x << 32)) & MASK


def _zipper(v0: int, v1: int) -> tuple[int, int]:
    res = v0 & (0xFF << 16)
    res2 = (v0 & (0xFF << 56)) + (v1 & (0xFF << 16))
    res += (v1 & (0xFF << 56)) >> 8
    res2 += (v0 & (0xFF << 48)) >> 8
    res += ((v0 & (0xFF << 40)) + (v1 & (0xFF << 48))) >> 16
    res2 += (v1 & (0xFF << 40)) >> 16
    res += ((v0 & (0xFF << 24)) + (v1 & (0xFF << 32))) >> 24
    res2 += ((v1 & (0xFF << 24)) + (v0 & (0xFF << 32))) >> 24
    res += (v0 & (0xFF << 8)) << 32
    res2 += (v1 & 0xFF) << 48
    res += v0 << 56
    res2 += (v1 & (0xFF << 8)) << 24
    return res & MASK, res2 & MASK


class _HighwayHash64:
    """HighwayHash-64 (minio/highwayhash's generic code, which nats-server uses)."""

    def __init__(self, key: bytes) -> None:
        k = struct.unpack("<4Q", key)
        self.mul0 = list(_INIT0)
        self.mul1 = list(_INIT1)
        self.v0 = [_INIT0[i] ^ k[i] for i in range(4)]
        self.v1 = [_INIT1[i] ^ _rot32(k[i]) for i in range(4)]

    def _update(self, packet: bytes) -> None:
        v0, v1, mul0, mul1 = self.v0, self.v1, self.mul0, self.mul1
        lanes = struct.unpack("<4Q", packet)
        for i in range(4):
            v1[i] = (v1[i] + lanes[i] + mul0[i]) & MASK
            mul0[i] ^= (v1[i] & 0xFFFFFFFF) * (v0[i] >> 32) & MASK
            v0[i] = (v0[i] + mul1[i]) & MASK
            mul1[i] ^= (v0[i] & 0xFFFFFFFF) * (v1[i] >> 32) & MASK
        a, b = _zipper(v1[0], v1[1])
        v0[0], v0[1] = (v0[0] + a) & MASK, (v0[1] + b) & MASK
        a, b = _zipper(v1[2], v1[3])
        v0[2], v0[3] = (v0[2] + a) & MASK, (v0[3] + b) & MASK
        a, b = _zipper(v0[0], v0[1])
        v1[0], v1[1] = (v1[0] + a) & MASK, (v1[1] + b) & MASK
        a, b = _zipper(v0[2], v0[3])
        v1[2], v1[3] = (v1[2] + a) & MASK, (v1[3] + b) & MASK

    def _remainder(self, tail: bytes) -> None:
        n = len(tail)
        mod32 = (n << 32) + n
        for i in range(4):
            self.v0[i] = (self.v0[i] + mod32) & MASK
            lo, hi = self.v1[i] & 0xFFFFFFFF, self.v1[i] >> 32
            lo = ((lo << n) | (lo >> (32 - n))) & 0xFFFFFFFF
            hi = ((hi << n) | (hi >> (32 - n))) & 0xFFFFFFFF
            self.v1[i] = (hi << 32) | lo
        mod4 = n & 3
        remain = n - mod4
        block = bytearray(32)
        block[:remain] = tail[:remain]
        if n >= 16:
            block[28:32] = tail[n - 4 : n]
        elif mod4:
            last = tail[remain] + (tail[remain + (mod4 >> 1)] << 8) + (tail[n - 1] << 16)
            block[16:20] = struct.pack("<I", last)
        self._update(bytes(block))

    def sum64(self, data: bytes) -> int:
        full = len(data) & ~31
        for off in range(0, full, 32):
            self._update(data[off : off + 32])
        if full < len(data):
            self._remainder(data[full:])
        for _ in range(4):
            perm = (_rot32(self.v0[2]), _rot32(self.v0[3]), _rot32(self.v0[0]), _rot32(self.v0[1]))
            self._update(struct.pack("<4Q", *perm))
        return (self.v0[0] + self.v1[0] + self.mul0[0] + self.mul1[0]) & MASK


def highwayhash64(key: bytes, data: bytes) -> int:
    """HighwayHash-64 of ``data`` under a 32-byte ``key``."""
    if len(key) != 32:
        raise ValueError(f"HighwayHash needs a 32-byte key, got {len(key)}")
    return _HighwayHash64(key).sum64(data)


def _uvarint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while i < len(buf):
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, i
        shift += 7
        if shift > 63:
            break
    raise ValueError("bad varint")


def read_index(buf: bytes) -> tuple[int, set[int]] | None:
    """A block index's first sequence and delete map; None if it is missing or unreadable
    (the server then rebuilds the block from the ``.blk`` alone)."""
    if len(buf) < 2 or buf[0] != IDX_MAGIC or buf[1] != IDX_VERSION:
        return None
    try:
        i = 2
        msgs, i = _uvarint(buf, i)
        _bytes, i = _uvarint(buf, i)
        first, i = _uvarint(buf, i)
        _ts, i = _uvarint(buf, i)
        last, i = _uvarint(buf, i)
        _ts, i = _uvarint(buf, i)
        dmap_len, i = _uvarint(buf, i)
        first, last = first & ~EBIT, last & ~EBIT
        if i + CHECKSUM > len(buf) or msgs != (last - first + 1) - dmap_len:
            return None
        i += CHECKSUM
        deleted: set[int] = set()
        for _ in range(dmap_len):
            seq, i = _uvarint(buf, i)
            if seq == 0:
                break
            deleted.add((seq & ~EBIT) + first)
    except ValueError:
        return None
    return first, deleted


def message_id(headers: bytes, payload: bytes, header: str) -> str:
    """The workload's message id: the ``header`` line of the NATS headers, else the payload's
    text up to the first ``|``."""
    want = header.lower().encode()
    for line in headers.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == want:
            return value.strip().decode(errors="replace")
    return payload.split(b"|", 1)[0].decode(errors="replace")


def read_block(
    buf: bytes, stream: str, index: int, header: str, index_info: tuple[int, set[int]] | None = None
) -> tuple[list[tuple[int, str]], list[dict[str, Any]]]:
    """The live records of block ``index`` as (sequence, message id) pairs, and what was
    skipped (``{"seq", "at", "why"}``: a bad checksum, or broken framing that ends the block)."""
    key = hashlib.sha256(f"{stream}-{index}".encode()).digest()
    first, deleted = index_info if index_info is not None else (0, set())
    entries: list[tuple[int, str]] = []
    skipped: list[dict[str, Any]] = []
    at, end = 0, len(buf)
    while at < end:
        if at + MSG_HDR > end:
            skipped.append({"seq": None, "at": at, "why": f"torn record header ({end - at} bytes)"})
            break
        rl, seq, ts, slen = struct.unpack_from("<IQqH", buf, at)
        has_headers = bool(rl & HBIT)
        rl &= ~HBIT
        dlen = rl - MSG_HDR
        if dlen < CHECKSUM or slen > dlen or rl > RL_BAD or at + rl > end:
            skipped.append({"seq": seq & ~EBIT, "at": at, "why": f"bad record length {rl}"})
            break
        data = buf[at + MSG_HDR : at + rl]
        at += rl
        if seq == 0 or seq & EBIT or seq < first or seq in deleted:
            continue  # erased, or removed through the index
        subject, rest = data[:slen], data[slen : dlen - CHECKSUM]
        headers = b""
        if has_headers:
            if len(rest) < 4:
                skipped.append({"seq": seq, "at": at - rl, "why": "headers length missing"})
                continue
            (hlen,) = struct.unpack_from("<I", rest)
            headers, rest = rest[4 : 4 + hlen], rest[4 + hlen :]
        body = struct.pack("<Qq", seq, ts) + subject + headers + rest
        if highwayhash64(key, body) != struct.unpack_from("<Q", data, dlen - CHECKSUM)[0]:
            skipped.append({"seq": seq, "at": at - rl, "why": "checksum mismatch"})
            continue
        entries.append((seq, message_id(headers, rest, header)))
    return entries, skipped


def stream_dirs(root: Path, stream: str) -> list[Path]:
    """Every ``streams/<stream>`` directory under a server's store (one per account)."""
    return sorted(p for p in root.glob(f"**/streams/{stream}") if p.is_dir() and (p / "msgs").is_dir())


def read_stream(root: Path, stream: str, header: str) -> dict[str, Any]:
    """What the store under ``root`` holds of ``stream``: entries in sequence order,
    the records skipped, and the blocks read."""
    dirs = stream_dirs(root, stream)
    if not dirs:
        return {"found": False, "entries": [], "skipped": [], "blocks": []}
    if len(dirs) > 1:
        raise ValueError(f"stream {stream!r} is in more than one account: {[str(d) for d in dirs]}")
    msgs = dirs[0] / "msgs"
    blocks = sorted(
        (int(m.group(1)), p) for p in msgs.iterdir() if (m := re.fullmatch(r"(\d+)\.blk", p.name))
    )
    entries: list[tuple[int, str]] = []
    skipped: list[dict[str, Any]] = []
    read: list[dict[str, Any]] = []
    for index, path in blocks:
        idx = msgs / f"{index}.idx"
        info = read_index(idx.read_bytes()) if idx.exists() else None
        got, bad = read_block(path.read_bytes(), stream, index, header, info)
        entries += got
        skipped += [{**b, "block": index} for b in bad]
        read.append(
            {"block": index, "bytes": path.stat().st_size, "entries": len(got), "index": info is not None}
        )
    entries.sort()
    return {"found": True, "entries": entries, "skipped": skipped, "blocks": read}


if __name__ == "__main__":
    root, name, id_header = sys.argv[1:4]
    print(json.dumps(read_stream(Path(root), name, id_header)))
