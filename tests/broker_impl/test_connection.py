"""Connection-level behaviour: heartbeats, blocking, channel.flow, graceful close."""

from __future__ import annotations

import time

import pika
import pytest
from pamqp import commands, heartbeat

from tests.broker_impl.conftest import InProcessNode
from tests.broker_impl.test_fuzz import Raw
from tests.polling import until


def poll_states(
    node: InProcessNode, want: list[str], pump: pika.BlockingConnection | None = None
) -> list[str]:
    """The connections' flow states once they equal want (no deadline: tests/polling.py)."""

    def states() -> list[str] | None:
        if pump is not None:
            pump.process_data_events(time_limit=0.05)
        got = node.run(lambda: sorted(c.operator_state() for c in node.broker.connections))
        return got if got == want else None

    return until(states, f"connection states {want}", every=0 if pump is not None else 0.02)


def test_server_sends_heartbeats_and_drops_silent_client(node: InProcessNode) -> None:
    raw = Raw(node.port)
    raw.handshake("tune")
    raw.send((0, commands.Connection.TuneOk(2047, 131072, 1)), (0, commands.Connection.Open("/")))
    raw.expect(commands.Connection.OpenOk)
    t0 = time.monotonic()
    beats = 0
    raw.sock.settimeout(10)
    while True:
        d = raw.recv_frame()
        if d is None:
            break
        if isinstance(d.frame, heartbeat.Heartbeat):
            beats += 1
    silent_for = time.monotonic() - t0
    assert beats >= 2  # every timeout/2
    assert silent_for >= 1.5  # not before about two timeouts (a slow machine can only make this later)
    assert node.run(lambda: len(node.broker.connections)) == 0


def test_heartbeating_client_stays(node: InProcessNode) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port, heartbeat=1))
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.2)
    assert conn.is_open
    conn.channel().queue_declare("hb")
    conn.close()


def test_disk_alarm_blocks_publishers_not_consumers(node_factory) -> None:
    node = node_factory(flow__disk_free_limit=10**18, flow__check_interval_ms=20)  # always "low on disk"
    consumer = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    cch = consumer.channel()
    cch.queue_declare("d")
    publisher = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", node.port, blocked_connection_timeout=1.0)
    )
    pch = publisher.channel()
    states = poll_states(node, ["blocking", "blocking"])
    assert states == ["blocking", "blocking"]
    pch.basic_publish("", "d", b"one")  # accepted, then the reader stops reading this socket
    states = poll_states(node, ["blocked", "blocking"], pump=publisher)
    assert states == ["blocked", "blocking"]
    # the consumer-only connection still works while the alarm is on
    assert cch.basic_get("d", auto_ack=True)[2] == b"one"
    with pytest.raises(pika.exceptions.ConnectionBlockedTimeout):
        for _ in range(20):
            pch.basic_publish("", "d", b"more")
            publisher.process_data_events(time_limit=0.2)
    node.run(lambda: setattr(node.broker.config.flow, "disk_free_limit", 0))
    consumer.close()


def test_connection_blocked_only_sent_to_clients_that_ask(node_factory) -> None:
    node = node_factory(flow__disk_free_limit=10**18, flow__check_interval_ms=20)
    raw = Raw(node.port)
    raw.handshake("open")  # advertises no capabilities
    poll_states(node, ["blocking"])  # the alarm reached this connection: a Blocked would be sent now
    raw.send((0, commands.Connection.Close(200, "bye", 0, 0)))
    frames = []
    while True:
        d = raw.recv_frame()
        if d is None:
            break
        frames.append(type(d.frame).__name__)
        if isinstance(d.frame, commands.Connection.CloseOk):
            break
    assert "Blocked" not in frames and frames[-1] == "CloseOk"


def test_channel_flow_pauses_deliveries(node: InProcessNode) -> None:
    raw = Raw(node.port)
    raw.handshake("channel")
    raw.send((1, commands.Queue.Declare(queue="cf")))
    raw.expect(commands.Queue.DeclareOk)
    raw.send((1, commands.Channel.Flow(active=False)))
    assert raw.expect(commands.Channel.FlowOk).active is False
    raw.send((1, commands.Basic.Consume(queue="cf", consumer_tag="t", no_ack=True)))
    raw.expect(commands.Basic.ConsumeOk)
    publisher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    pch = publisher.channel()
    pch.confirm_delivery()
    pch.basic_publish("", "cf", b"held")
    raw.sock.settimeout(0.3)
    with pytest.raises(TimeoutError):
        raw.recv_frame()
    raw.sock.settimeout(5)
    raw.send((1, commands.Channel.Flow(active=True)))
    raw.expect(commands.Channel.FlowOk)
    deliver = raw.expect(commands.Basic.Deliver)
    assert deliver.consumer_tag == "t"
    publisher.close()


def test_graceful_shutdown_closes_clients_with_320(node_factory) -> None:
    node = node_factory()
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    node.call(node.server.stop())
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        conn.process_data_events(time_limit=1)
        conn.channel()
    assert err.value.reply_code == 320


def test_publishes_in_the_same_read_as_connection_close_are_kept(node: InProcessNode) -> None:
    from pamqp import body, header

    raw = Raw(node.port)
    raw.handshake("channel")
    raw.send((1, commands.Queue.Declare(queue="last-words")))
    raw.expect(commands.Queue.DeclareOk)
    props = commands.Basic.Properties()
    frames = []
    for i in range(500):
        payload = str(i).encode()
        frames += [
            (1, commands.Basic.Publish(routing_key="last-words")),
            (1, header.ContentHeader(0, len(payload), props)),
            (1, body.ContentBody(payload)),
        ]
    frames.append((0, commands.Connection.Close(200, "bye", 0, 0)))
    raw.send(*frames)  # one write: the close arrives while the channel still has work queued
    raw.expect(commands.Connection.CloseOk)
    raw.sock.close()
    count = node.run(lambda: node.broker.vhosts["/"].queues["last-words"].message_count())
    assert count == 500
