"""The replication frames on literal bytes."""

from __future__ import annotations

import pytest

from broker_impl.replication import wire


def test_frames_split_anywhere_come_out_whole() -> None:
    data = (
        wire.encode_offset(wire.DATA, 4096, b"abc")
        + wire.encode_json(wire.HELLO, {"end": 7})
        + wire.encode_offset(wire.REPORT, 1 << 40)
    )
    assert data[:5] == b"\x00\x00\x00\x0c\x03"  # length 12 = kind + 8-byte offset + 3 bytes; kind DATA
    for cut in range(len(data) + 1):
        dec = wire.Decoder()
        frames = dec.feed(data[:cut]) + dec.feed(data[cut:])
        assert [f.kind for f in frames] == [wire.DATA, wire.HELLO, wire.REPORT]
        assert frames[0].data() == (4096, b"abc")
        assert frames[1].json() == {"end": 7}
        assert frames[2].offset() == 1 << 40


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"\x00\x00\x00\x00\x01", "frame length 0 out of range"),
        (b"\x7f\xff\xff\xff\x01", "out of range"),
        (b"\x00\x00\x00\x01\x63", "unknown frame kind 99"),
    ],
)
def test_garbage_is_a_wire_error(raw: bytes, needle: str) -> None:
    with pytest.raises(wire.WireError, match=needle):
        wire.Decoder().feed(raw)


def test_bodies_are_checked_when_read() -> None:
    (frame,) = wire.Decoder().feed(wire.encode(wire.HELLO, b"[1]"))
    with pytest.raises(wire.WireError, match="not a JSON object"):
        frame.json()
    (frame,) = wire.Decoder().feed(wire.encode(wire.REPORT, b"\x01"))
    with pytest.raises(wire.WireError, match="shorter than an offset"):
        frame.offset()
