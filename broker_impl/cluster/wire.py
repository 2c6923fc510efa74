"""Inter-node frames: bytes in, messages out, with no sockets involved.

A frame is ``length:u32 | type:u8 | header_len:u32 | header | blob`` where
``length`` counts everything after itself, ``header`` is a UTF-8 JSON object and
``blob`` is opaque bytes (a message in its store form). JSON keeps the control
traffic readable in a packet capture; the blob keeps message bodies out of it
so a body is never escaped or copied through a text codec.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

HELLO = 1  # first frame on a connection: who is dialling, and its incarnation
HEARTBEAT = 2
DATA = 3

_TYPES = (HELLO, HEARTBEAT, DATA)
_PREFIX = struct.Struct(">IBI")
MAX_FRAME = 256 << 20


class WireError(Exception):
    """The peer sent bytes that are not a frame; the connection must be dropped."""


@dataclass(frozen=True, slots=True)
class Frame:
    type: int
    header: dict[str, Any] = field(default_factory=dict)
    blob: bytes = b""


def encode(frame: Frame) -> bytes:
    head = json.dumps(frame.header, separators=(",", ":")).encode()
    return _PREFIX.pack(5 + len(head) + len(frame.blob), frame.type, len(head)) + head + frame.blob


class Decoder:
    """Feed it whatever the socket returned; iterate the complete frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[Frame]:
        self._buf += data
        while len(self._buf) >= 4:
            (length,) = struct.unpack_from(">I", self._buf, 0)
            if length < 5 or length > MAX_FRAME:
                raise WireError(f"bad frame length {length}")
            if len(self._buf) < 4 + length:
                return
            _, ftype, hlen = _PREFIX.unpack_from(self._buf, 0)
            if ftype not in _TYPES:
                raise WireError(f"unknown frame type {ftype}")
            if 5 + hlen > length:
                raise WireError(f"header length {hlen} beyond frame length {length}")
            start = _PREFIX.size
            try:
                header = json.loads(bytes(self._buf[start : start + hlen]) or b"{}")
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise WireError(f"frame header is not JSON: {exc}") from None
            if not isinstance(header, dict):
                raise WireError("frame header is not a JSON object")
            blob = bytes(self._buf[start + hlen : 4 + length])
            del self._buf[: 4 + length]
            yield Frame(ftype, header, blob)
