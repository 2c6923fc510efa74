"""Bytes in, frames out (and back), with no sockets.

The decoder keeps one buffer per connection and slices off what it consumed,
so a frame split over many reads, or many frames in one read, cost the same.
Every way the input can be wrong maps to the AMQP reply code the connection
closes with, so the connection layer never inspects raw bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from pamqp import body, commands, constants, frame, header, heartbeat
from pamqp import exceptions as pamqp_exceptions
from pamqp.base import Frame as MethodFrame

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_OVERHEAD = 8  # 7-byte header + frame-end octet

# Reply codes (AMQP 0-9-1 constants) used by every layer.
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_TEXT = {
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE",
    NO_ROUTE: "NO_ROUTE",
    NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}

Frame = MethodFrame | header.ContentHeader | body.ContentBody | heartbeat.Heartbeat | header.ProtocolHeader

_FRAME_HDR = struct.Struct(">BHI")


class AMQPError(Exception):
    """A protocol error with the reply code to close with.

    ``class_id``/``method_id`` name the offending method (0 when none), as
    channel.close and connection.close carry them.
    """

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id

    @property
    def reply_text(self) -> str:
        name = REPLY_TEXT.get(self.code, str(self.code))
        return f"{name} - {self.text}"[:255]


class ConnectionError_(AMQPError):
    """Closes the whole connection (hard error)."""


class ChannelError(AMQPError):
    """Closes only the channel it happened on (soft error)."""


class BadProtocolHeader(Exception):
    """The client did not open with AMQP 0-9-1; the server answers with its own header and hangs up."""


@dataclass(slots=True)
class Decoded:
    channel: int
    frame: Frame


class FrameDecoder:
    """Incremental decoder: ``feed(bytes)`` then iterate ``frames()``.

    ``frame_max`` bounds the accepted frame size (including the 8 bytes of
    overhead), as connection.tune negotiated it; an oversize frame is a
    FRAME_ERROR before its payload is even buffered.
    """

    def __init__(self, frame_max: int = 131072, expect_header: bool = True) -> None:
        self.frame_max = frame_max
        self._buf = bytearray()
        self._expect_header = expect_header

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def next_frame(self) -> Decoded | None:
        """Return one decoded frame, or None when more bytes are needed. Raises AMQPError/BadProtocolHeader."""
        buf = self._buf
        if self._expect_header:
            if len(buf) < 8:
                if PROTOCOL_HEADER[: len(buf)] != bytes(buf):
                    raise BadProtocolHeader(bytes(buf))
                return None
            if bytes(buf[:8]) != PROTOCOL_HEADER:
                raise BadProtocolHeader(bytes(buf[:8]))
            del buf[:8]
            self._expect_header = False
            return Decoded(0, header.ProtocolHeader())
        if len(buf) < 7:
            return None
        ftype, channel, size = _FRAME_HDR.unpack_from(buf, 0)
        if ftype not in (
            constants.FRAME_METHOD,
            constants.FRAME_HEADER,
            constants.FRAME_BODY,
            constants.FRAME_HEARTBEAT,
        ):
            raise ConnectionError_(FRAME_ERROR, f"unknown frame type {ftype}")
        if size + FRAME_OVERHEAD > self.frame_max:
            raise ConnectionError_(
                FRAME_ERROR, f"frame size {size + FRAME_OVERHEAD} exceeds frame_max {self.frame_max}"
            )
        total = 7 + size + 1
        if len(buf) < total:
            return None
        if buf[total - 1] != constants.FRAME_END:
            raise ConnectionError_(FRAME_ERROR, f"bad frame end byte 0x{buf[total - 1]:02x}")
        if ftype == constants.FRAME_HEARTBEAT:
            del buf[:total]
            if channel != 0:
                raise ConnectionError_(FRAME_ERROR, f"heartbeat on channel {channel}")
            return Decoded(0, heartbeat.Heartbeat())
        if size == 0:
            raise ConnectionError_(FRAME_ERROR, "empty frame payload")
        data = bytes(buf[:total])
        del buf[:total]
        try:
            _used, ch, value = frame.unmarshal(data)
        except pamqp_exceptions.UnmarshalingException as exc:
            if ftype == constants.FRAME_METHOD and "Unknown method index" in str(exc):
                raise ConnectionError_(NOT_IMPLEMENTED, str(exc)[:200]) from None
            raise ConnectionError_(
                SYNTAX_ERROR if ftype == constants.FRAME_METHOD else FRAME_ERROR, str(exc)[:200]
            ) from None
        except Exception as exc:  # pamqp raises assorted errors on hostile input
            raise ConnectionError_(SYNTAX_ERROR, f"cannot decode frame: {type(exc).__name__}") from None
        return Decoded(ch, value)

    def frames(self) -> Iterator[Decoded]:
        while True:
            d = self.next_frame()
            if d is None:
                return
            yield d


def encode_method(channel: int, method: MethodFrame) -> bytes:
    return frame.marshal(method, channel)


def encode_heartbeat() -> bytes:
    return frame.marshal(heartbeat.Heartbeat(), 0)


def encode_content(
    channel: int,
    method: MethodFrame,
    properties: commands.Basic.Properties,
    payload: bytes,
    frame_max: int,
) -> bytes:
    """A method, its content header and as many body frames as frame_max demands (none for an empty body)."""
    parts = [
        frame.marshal(method, channel),
        frame.marshal(header.ContentHeader(0, len(payload), properties), channel),
    ]
    chunk = frame_max - FRAME_OVERHEAD
    view = memoryview(payload)
    for off in range(0, len(payload), chunk):
        parts.append(frame.marshal(body.ContentBody(bytes(view[off : off + chunk])), channel))
    return b"".join(parts)
