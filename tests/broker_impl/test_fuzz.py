"""Hostile input: the codec never raises anything but a protocol error, and a bad connection
is closed with the right code while the node keeps serving others and stored messages stay put."""

from __future__ import annotations

import socket
import struct
from typing import Any, TypeVar

import pika
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body, commands, frame, header

from broker_impl.codec import (
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_ERROR,
    NOT_ALLOWED,
    PROTOCOL_HEADER,
    UNEXPECTED_FRAME,
    AMQPError,
    BadProtocolHeader,
    Decoded,
    FrameDecoder,
)
from tests.broker_impl.conftest import InProcessNode
from tests.factories import fixture_settings


# -- codec ------------------------------------------------------------------------------
@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=40))
def test_codec_only_raises_protocol_errors(data: bytes, chunk: int) -> None:
    d = FrameDecoder(4096)
    d.feed(PROTOCOL_HEADER)
    d.next_frame()
    try:
        for i in range(0, len(data), chunk):
            d.feed(data[i : i + chunk])
            list(d.frames())
    except AMQPError as exc:
        assert 500 <= exc.code < 600
    except BadProtocolHeader:
        pytest.fail("header already consumed")


_methods = st.sampled_from(
    [
        commands.Basic.Qos(prefetch_count=3),
        commands.Queue.Declare(queue="q"),
        commands.Basic.Ack(5, multiple=True),
        commands.Channel.Open(),
        commands.Basic.Publish(exchange="x", routing_key="rk"),
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), _methods), max_size=8), st.integers(1, 50))
def test_codec_roundtrips_valid_frames_under_any_split(frames_: list[tuple[int, Any]], chunk: int) -> None:
    raw = b"".join(frame.marshal(m, ch) for ch, m in frames_)
    d = FrameDecoder()
    d.feed(PROTOCOL_HEADER)
    d.next_frame()
    out: list[Any] = []
    for i in range(0, len(raw), chunk):
        d.feed(raw[i : i + chunk])
        out.extend(d.frames())
    assert [(f.channel, f.frame.name) for f in out] == [(ch, m.name) for ch, m in frames_]


# -- connections ---------------------------------------------------------------------------
F = TypeVar("F")


class Raw:
    """A bare socket speaking just enough AMQP to reach a given state."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.dec = FrameDecoder(1 << 20, expect_header=False)

    def send(self, *frames_: tuple[int, Any]) -> None:
        self.sock.sendall(b"".join(frame.marshal(f, ch) for ch, f in frames_))

    def recv_frame(self) -> Decoded | None:
        while True:
            d = self.dec.next_frame()
            if d is not None:
                return d
            data = self.sock.recv(65536)
            if not data:
                return None
            self.dec.feed(data)

    def expect(self, cls: type[F]) -> F:
        while True:
            d = self.recv_frame()
            assert d is not None, f"connection closed while waiting for {cls.__name__}"
            if isinstance(d.frame, cls):
                return d.frame

    def handshake(self, stage: str = "open") -> None:
        self.sock.sendall(PROTOCOL_HEADER)
        self.expect(commands.Connection.Start)
        if stage == "start":
            return
        self.send((0, commands.Connection.StartOk({"capabilities": {}}, "PLAIN", "\0guest\0guest")))
        self.expect(commands.Connection.Tune)
        if stage == "tune":
            return
        self.send((0, commands.Connection.TuneOk(2047, 131072, 0)), (0, commands.Connection.Open("/")))
        self.expect(commands.Connection.OpenOk)
        if stage == "channel":
            self.send((1, commands.Channel.Open()))
            self.expect(commands.Channel.OpenOk)

    def close_code(self) -> int | None:
        """The reply code of the server's connection.close, None if it hung up without one."""
        try:
            while True:
                d = self.recv_frame()
                if d is None:
                    return None
                if isinstance(d.frame, commands.Connection.Close):
                    return d.frame.reply_code
        except (OSError, AMQPError):
            return None
        finally:
            self.sock.close()


def _stored(node: InProcessNode) -> list[bytes]:
    """Contents of the durable queue, read on the broker's loop without consuming."""

    def read() -> list[bytes]:
        q = node.broker.vhosts["/"].queues["keep"]
        return [q.bq.depth(), q.bq.len()]

    return node.run(read)


@pytest.fixture
def seeded(node: InProcessNode) -> InProcessNode:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("keep", durable=True)
    for i in range(10):
        ch.basic_publish("", "keep", f"k{i}".encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    return node


def _still_serving(node: InProcessNode) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    ch = conn.channel()
    assert ch.queue_declare("keep", durable=True, passive=True).method.message_count == 10
    conn.close()


_CONTENT_HEADER = header.ContentHeader(0, 3, commands.Basic.Properties())


@pytest.mark.parametrize(
    ("stage", "payload", "code"),
    [
        ("channel", b"\x01\x00\x01\x00\x00\x00\x04\x00\x14\x00\x0a\x00", FRAME_ERROR),  # bad frame end
        ("channel", b"\x01\x00\x01\x7f\x00\x00\x00", FRAME_ERROR),  # oversize frame
        ("channel", b"\x07\x00\x01\x00\x00\x00\x01\x00\xce", FRAME_ERROR),  # unknown frame type
        ("open", frame.marshal(commands.Basic.Qos(), 5), CHANNEL_ERROR),  # channel never opened
        ("channel", frame.marshal(_CONTENT_HEADER, 1), UNEXPECTED_FRAME),  # content without a method
        ("channel", frame.marshal(body.ContentBody(b"abc"), 1), UNEXPECTED_FRAME),
        (
            "channel",
            frame.marshal(commands.Basic.Publish(routing_key="keep"), 1)
            + frame.marshal(commands.Basic.Qos(), 1),
            UNEXPECTED_FRAME,
        ),  # method where a header belongs
        ("start", frame.marshal(commands.Connection.Open("/"), 0), COMMAND_INVALID),  # out of order
        ("open", frame.marshal(commands.Queue.Declare(queue="x"), 0), COMMAND_INVALID),  # channel method on 0
        (
            "channel",
            frame.marshal(commands.Connection.Open("/"), 1),
            COMMAND_INVALID,
        ),  # connection method on 1
        ("channel", frame.marshal(commands.Channel.Open(), 1), CHANNEL_ERROR),  # second open
        ("open", frame.marshal(commands.Channel.Open(), 3000), NOT_ALLOWED),  # beyond channel_max
    ],
)
def test_bad_input_closes_only_that_connection(
    seeded: InProcessNode, stage: str, payload: bytes, code: int
) -> None:
    before = _stored(seeded)
    bystander = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", seeded.port))
    raw = Raw(seeded.port)
    raw.handshake(stage)
    raw.sock.sendall(payload)
    assert raw.close_code() == code
    assert bystander.is_open
    bystander.channel().queue_declare("keep", durable=True, passive=True)
    bystander.close()
    assert _stored(seeded) == before
    _still_serving(seeded)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", seeded.port))
    ch = conn.channel()
    got = [ch.basic_get("keep", auto_ack=True) for _ in range(10)]
    assert [b for _m, _p, b in got] == [f"k{i}".encode() for i in range(10)]  # same bodies, same order
    assert not any(m.redelivered for m, _p, _b in got)  # never handed out by the bad connection
    conn.close()


def test_wrong_protocol_header_gets_ours_back(node: InProcessNode) -> None:
    s = socket.create_connection(("127.0.0.1", node.port), timeout=5)
    s.sendall(b"AMQP\x01\x01\x08\x00")
    assert s.recv(8) == PROTOCOL_HEADER
    assert s.recv(8) == b""


@fixture_settings(40)
@given(
    stage=st.sampled_from(["start", "tune", "open", "channel"]),
    junk=st.binary(min_size=1, max_size=64),
    truncate=st.booleans(),
)
def test_fuzzed_frames_never_hurt_the_node(
    seeded: InProcessNode, stage: str, junk: bytes, truncate: bool
) -> None:
    before = _stored(seeded)
    raw = Raw(seeded.port)
    raw.handshake(stage)
    if truncate:
        # a frame header that promises more than is ever sent, then the client vanishes
        raw.sock.sendall(struct.pack(">BHI", 1, 1, len(junk) + 10) + junk)
        raw.sock.close()
    else:
        raw.sock.sendall(junk)
        raw.sock.shutdown(socket.SHUT_WR)
        code = raw.close_code()
        assert code is None or 500 <= code < 600 or code == 403
    assert _stored(seeded) == before
    _still_serving(seeded)
