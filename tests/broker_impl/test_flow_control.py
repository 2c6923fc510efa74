"""Back-pressure end to end: a fast publisher is slowed down and broker memory stays bounded.

Two mechanisms, as in RabbitMQ: credit flow along reader -> channel -> queue -> store
(shown against the store's fsync, the slow stage of a durable queue), and the memory
alarm (shown against a slow consumer). With flow control switched off the same
load piles up inside the broker.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pika
import pytest

from tests.broker_impl.conftest import InProcessNode
from tests.polling import until

pytestmark = pytest.mark.slow

N = 8000
BODY = b"x" * 512


def _buffered(node: InProcessNode) -> tuple[int, int]:
    """Messages waiting inside the broker between stages, and unread input bytes."""

    def read() -> tuple[int, int]:
        b = node.broker
        msgs = sum(ch.inbox_len for c in b.connections for ch in c.channels.values())
        msgs += sum(q.inbox_len + q.writes_in_flight for q in b.all_queues())
        return msgs, 0

    return node.run(read)


def _flood(node: InProcessNode) -> dict[str, Any]:
    done = threading.Event()
    result: dict[str, Any] = {}

    def publish() -> None:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
        ch = conn.channel()
        ch.queue_declare("flood", durable=True)
        props = pika.BasicProperties(delivery_mode=2)
        t0 = time.monotonic()
        for _ in range(N):
            ch.basic_publish("", "flood", BODY, props)
        ch.confirm_delivery()
        ch.basic_publish("", "flood", b"end", props)  # confirmed after everything before it
        result["seconds"] = time.monotonic() - t0
        conn.close()
        done.set()

    t = threading.Thread(target=publish, daemon=True)
    t.start()
    peak = 0
    states: set[str] = set()
    while not done.wait(0.005):
        peak = max(peak, _buffered(node)[0])
        states |= set(node.run(lambda: [c.operator_state() for c in node.broker.connections]))
    t.join()
    result["peak"] = peak
    result["states"] = states
    result["count"] = node.run(lambda: node.broker.vhosts["/"].queues["flood"].message_count())
    return result


SMALL_CREDIT = {
    "flow__initial": 100,
    "flow__more_after": 50,
    "flow__store_initial": 200,
    "flow__store_more_after": 100,
}


def test_credit_flow_bounds_broker_buffers(node_factory) -> None:
    on = _flood(node_factory(**SMALL_CREDIT))
    assert on["count"] == N + 1  # nothing lost
    # reader->channel 100 + channel->queue 100 + queue->store 200 in flight at most
    assert on["peak"] <= 100 + 100 + 200 + 50, on
    assert "flow" in on["states"], on  # the publisher was throttled and operators can see it


def test_without_flow_control_publishers_are_never_throttled(node_factory) -> None:
    # How much piles up between stages then depends on whether the disk's fsync keeps up
    # (it often does here), so growth is shown against a slow consumer below and in
    # bench/flow_memory.py; what the switch must do every time is stop the throttling.
    off = _flood(node_factory(flow__enabled=False, **SMALL_CREDIT))
    assert off["count"] == N + 1
    assert off["states"] == {"running"}, off


def _ram(node: InProcessNode) -> int:
    """Bytes of message bodies the node's queues hold in memory."""
    return node.run(lambda: sum(q.bq.ram_bytes() for q in node.broker.all_queues()))


def _publish_all(
    port: int,
    n: int,
    body: bytes,
    blocked_events: list[str],
    done: threading.Event,
    consumed_all: threading.Event,
) -> None:
    """Publish ``n`` confirmed messages, noting each connection.blocked and unblocked heard."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    conn.add_on_connection_blocked_callback(lambda _c, f: blocked_events.append("blocked"))
    conn.add_on_connection_unblocked_callback(lambda _c, f: blocked_events.append("unblocked"))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("slow")
    for i in range(n):
        ch.basic_publish("", "slow", str(i).encode() + body)
    done.set()
    # The publisher stays connected while the consumer empties the queue: once it is below the
    # watermark the alarm clears and every connection it blocked hears connection.unblocked.
    consumed_all.wait()
    conn.process_data_events(time_limit=0)  # pika delivers blocked/unblocked only while it processes events
    for _ in range(6000):
        if not blocked_events or blocked_events[-1] == "unblocked":
            break
        conn.process_data_events(time_limit=0.05)
    conn.close()


def _consume_slowly(port: int, n: int, consumed: list[int], consumed_all: threading.Event) -> None:
    """Take the ``n`` messages at 2 ms each, acking every one: a consumer slower than the publisher."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare("slow")
    ch.basic_qos(prefetch_count=10)
    for method, _p, b in ch.consume("slow", inactivity_timeout=10):
        if method is None:
            break
        time.sleep(0.002)  # the slow consumer
        consumed.append(int(b[: b.index(b"y")]))
        ch.basic_ack(method.delivery_tag)
        if len(consumed) == n:
            break
    conn.close()
    consumed_all.set()


def _watch_publishing(node: InProcessNode, flow: bool, done: threading.Event) -> tuple[int, set[str]]:
    """The most memory the queues held and the connection states seen while the publisher ran."""
    peak = 0
    states: set[str] = set()
    while not done.wait(0.01):
        peak = max(peak, _ram(node))
        states |= set(node.run(lambda: [c.operator_state() for c in node.broker.connections]))
        if not flow and "blocked" in states:
            break  # held back with nothing consuming: it would wait for ever (asserted below)
    return peak, states


@pytest.mark.parametrize("flow", [True, False], ids=["flow-on", "flow-off"])
def test_slow_consumer_memory_bounded_only_with_flow_control(node_factory, flow: bool) -> None:
    watermark = 1_000_000
    node = node_factory(
        flow__enabled=flow,
        flow__memory_source="queues",
        flow__memory_high_watermark=watermark,
        flow__queue_ram_bytes=100_000_000,
        flow__check_interval_ms=20,
    )
    n, body = 1500, b"y" * 2048  # 3 MB in total: three times the watermark
    blocked_events: list[str] = []
    consumed: list[int] = []
    done = threading.Event()
    consumed_all = threading.Event()
    pub = threading.Thread(
        target=_publish_all, args=(node.port, n, body, blocked_events, done, consumed_all), daemon=True
    )
    con = threading.Thread(target=_consume_slowly, args=(node.port, n, consumed, consumed_all), daemon=True)
    pub.start()
    if flow:
        # The alarm holds the publisher until something is consumed: the consumer starts once
        # the queue is past the watermark.
        until(lambda: _ram(node) >= watermark or done.is_set(), "the queue past the watermark", every=0.01)
        con.start()
    peak, states = _watch_publishing(node, flow, done)
    consumed_when_published = len(consumed)
    if not flow:
        # Nothing has been consumed yet (a consumer slower than the publisher at its extreme):
        # with no alarm to stop it, every confirmed message sits in the queue.
        peak = _ram(node)
        con.start()
    con.join()
    pub.join()
    assert sorted(consumed) == list(range(n))  # nothing lost either way
    if flow:
        assert "blocked" in blocked_events and blocked_events[-1] == "unblocked", blocked_events
        assert "blocked" in states
        # bounded: the watermark plus what was in flight when the alarm fired (credit + one check interval)
        assert peak < watermark + 1_000_000, peak
        # The publisher was held back to the consumer's pace: its last confirm came when the queue
        # held less than the peak bound, so the consumer had taken the rest (10 may sit unacked).
        assert consumed_when_published >= n - (watermark + 1_000_000) // len(body) - 10, (
            consumed_when_published
        )
    else:
        assert blocked_events == [] and "blocked" not in states
        assert peak >= n * len(body), peak  # three times the watermark
