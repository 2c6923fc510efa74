"""SIGKILL a node mid-stream: every message it confirmed must come back after restart."""

from __future__ import annotations

from collections.abc import Callable

import pika
import pika.exceptions
import pytest

from tests.broker_impl.conftest import SYNC_NODE, kill_mid_stream

pytestmark = pytest.mark.slow


def _publisher(port: int) -> Callable[[int], None]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("crash", durable=True)
    ch.exchange_declare("crash-x", "direct", durable=True)
    ch.queue_bind("crash", "crash-x", "rk")
    return lambda i: ch.basic_publish("crash-x", "rk", str(i).encode(), pika.BasicProperties(delivery_mode=2))


def test_confirmed_messages_survive_sigkill(subprocess_node) -> None:
    node = subprocess_node(SYNC_NODE).start()
    confirmed, attempted = kill_mid_stream(node, _publisher, 300, "confirms")

    node.start()
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    ch = conn.channel()
    # metadata survived: durable exchange and binding route again
    ch.confirm_delivery()
    ch.basic_publish("crash-x", "rk", b"after", pika.BasicProperties(delivery_mode=2))
    seen: list[int] = []
    for method, _props, body in ch.consume("crash", inactivity_timeout=30):  # recovery may be slow to deliver
        if method is None:
            break
        ch.basic_ack(method.delivery_tag)
        if body == b"after":
            break  # published after the restart: everything recovered came before it
        seen.append(int(body))
    ch.cancel()
    conn.close()
    missing = set(confirmed) - set(seen)
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
    assert len(seen) == len(set(seen)), "a message was delivered twice"
    assert set(seen) <= set(attempted), "a message nobody published appeared"
    assert seen == sorted(seen), "per-publisher order broken"
    node.stop()
