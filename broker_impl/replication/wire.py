"""Frames on a master-slave link: bytes in, frames out, no sockets.

Every frame is ``length (4, big-endian, of what follows) | kind (1) | body``.

=========  ===========  ================================================================
kind       direction    body
=========  ===========  ================================================================
HELLO      slave ->     JSON ``{"node", "segment_bytes", "end"}``: who it is and where its
                        replica ends (RocketMQ's slave opens by reporting its max offset)
REPORT     slave ->     8-byte offset: the replica is safe up to here (after every write
                        and as a heartbeat; what a SYNC master waits for)
DATA       both         8-byte offset + whole log records from that offset (empty: the
                        master's heartbeat); the slave's answer to SEND uses it too
META       master ->    JSON: the master's durable metadata (queues a slave must know)
SEND       master ->    JSON ``{"from", "to"}``: a master back from an abnormal stop asks
                        for the replica's bytes beyond its own log end
SENT       slave ->     JSON ``{"end"}``: everything asked for was sent
REFUSE     master ->    JSON ``{"reason"}``: the master will not feed this replica; the
                        slave logs the reason and tries again later
=========  ===========  ================================================================
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

HELLO, REPORT, DATA, META, SEND, SENT, REFUSE = range(1, 8)
KINDS = {
    HELLO: "HELLO",
    REPORT: "REPORT",
    DATA: "DATA",
    META: "META",
    SEND: "SEND",
    SENT: "SENT",
    REFUSE: "REFUSE",
}
MAX_FRAME = 64 * 1024 * 1024
_LEN = struct.Struct(">IB")
_OFF = struct.Struct(">Q")


class WireError(Exception):
    """The peer sent something that is not a frame of this protocol; the link is closed."""


@dataclass(slots=True, frozen=True)
class Frame:
    kind: int
    body: bytes

    def json(self) -> dict[str, Any]:
        try:
            value = json.loads(self.body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise WireError(f"{KINDS[self.kind]} body is not JSON ({exc})") from None
        if not isinstance(value, dict):
            raise WireError(f"{KINDS[self.kind]} body is not a JSON object")
        return value

    def offset(self) -> int:
        if len(self.body) < _OFF.size:
            raise WireError(f"{KINDS[self.kind]} body shorter than an offset")
        return int(_OFF.unpack_from(self.body)[0])

    def data(self) -> tuple[int, bytes]:
        return self.offset(), self.body[_OFF.size :]


def encode(kind: int, body: bytes) -> bytes:
    return _LEN.pack(len(body) + 1, kind) + body


def encode_json(kind: int, value: dict[str, Any]) -> bytes:
    return encode(kind, json.dumps(value, separators=(",", ":"), default=str).encode())


def encode_offset(kind: int, offset: int, data: bytes = b"") -> bytes:
    return encode(kind, _OFF.pack(offset) + data)


class Decoder:
    """Feed bytes as they arrive; take whole frames out."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        out = []
        while len(self._buf) >= _LEN.size:
            length, kind = _LEN.unpack_from(self._buf)
            if length < 1 or length > MAX_FRAME:
                raise WireError(f"frame length {length} out of range")
            if kind not in KINDS:
                raise WireError(f"unknown frame kind {kind}")
            if len(self._buf) < 4 + length:
                break
            out.append(Frame(kind, bytes(self._buf[_LEN.size : 4 + length])))
            del self._buf[: 4 + length]
        return out
