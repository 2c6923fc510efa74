"""The codec on literal bytes: no sockets."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import body, commands, frame, header

from broker_impl.codec import (
    FRAME_ERROR,
    NOT_IMPLEMENTED,
    PROTOCOL_HEADER,
    SYNTAX_ERROR,
    BadProtocolHeader,
    ConnectionError_,
    FrameDecoder,
    encode_content,
    encode_heartbeat,
)


def started() -> FrameDecoder:
    d = FrameDecoder(4096)
    d.feed(PROTOCOL_HEADER)
    first = d.next_frame()
    assert first is not None and isinstance(first.frame, header.ProtocolHeader)
    return d


def test_protocol_header_then_method() -> None:
    d = FrameDecoder()
    d.feed(PROTOCOL_HEADER + frame.marshal(commands.Channel.Open(), 1))
    frames = list(d.frames())
    assert isinstance(frames[0].frame, header.ProtocolHeader)
    assert frames[1].channel == 1 and isinstance(frames[1].frame, commands.Channel.Open)
    assert d.buffered == 0


def test_wrong_protocol_header_is_refused() -> None:
    d = FrameDecoder()
    d.feed(b"AMQP\x01\x01\x00\x0a")
    with pytest.raises(BadProtocolHeader):
        d.next_frame()
    d = FrameDecoder()
    d.feed(b"GET / HTTP/1.1\r\n")
    with pytest.raises(BadProtocolHeader):
        d.next_frame()


def test_frame_split_byte_by_byte_and_many_per_read() -> None:
    data = frame.marshal(commands.Basic.Qos(prefetch_count=7), 3) * 3
    d = started()
    out: list[Any] = []
    for i in range(len(data)):
        d.feed(data[i : i + 1])
        out.extend(d.frames())
    assert [f.frame.prefetch_count for f in out] == [7, 7, 7]
    d = started()
    d.feed(data)
    assert len(list(d.frames())) == 3


def test_heartbeat() -> None:
    d = started()
    d.feed(encode_heartbeat())
    f = d.next_frame()
    assert f is not None and f.channel == 0 and type(f.frame).__name__ == "Heartbeat"


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"\x01\x00\x01\x00\x00\x00\x04\x00\x14\x00\x0a\xff", FRAME_ERROR),  # bad end byte
        (b"\x09\x00\x01\x00\x00\x00\x01\x00\xce", FRAME_ERROR),  # unknown frame type
        (b"\x01\x00\x01\x00\x01\x00\x00", FRAME_ERROR),  # oversize (65536 > 4096) before payload arrives
        (b"\x01\x00\x01\x00\x00\x00\x04\x00\x63\x00\x01\xce", NOT_IMPLEMENTED),  # unknown method 99.1
        (
            b"\x01\x00\x01\x00\x00\x00\x05\x00\x3c\x00\x28\x00\xce",
            SYNTAX_ERROR,
        ),  # truncated basic.publish args
        (b"\x01\x00\x01\x00\x00\x00\x00\xce", FRAME_ERROR),  # empty method payload
    ],
)
def test_malformed_frames_map_to_reply_codes(raw: bytes, code: int) -> None:
    d = started()
    d.feed(raw)
    with pytest.raises(ConnectionError_) as err:
        d.next_frame()
    assert err.value.code == code


def test_incomplete_frame_waits() -> None:
    d = started()
    d.feed(b"\x01\x00\x01\x00\x00\x00\x10\x00")
    assert d.next_frame() is None


def test_content_split_at_frame_max() -> None:
    payload = bytes(range(256)) * 40  # 10240 bytes
    raw = encode_content(
        1, commands.Basic.Deliver("c", 1, False, "", "q"), commands.Basic.Properties(), payload, 4096
    )
    d = started()
    d.feed(raw)
    frames = [f.frame for f in d.frames()]
    bodies = [f for f in frames if isinstance(f, body.ContentBody)]
    assert [len(b.value) for b in bodies] == [4088, 4088, 2064]
    assert b"".join(b.value for b in bodies) == payload
    assert isinstance(frames[1], header.ContentHeader) and frames[1].body_size == len(payload)


def test_empty_body_has_no_body_frame() -> None:
    raw = encode_content(
        1, commands.Basic.Deliver("c", 1, False, "", "q"), commands.Basic.Properties(), b"", 4096
    )
    d = started()
    d.feed(raw)
    frames = [f.frame for f in d.frames()]
    assert len(frames) == 2 and isinstance(frames[1], header.ContentHeader) and frames[1].body_size == 0
