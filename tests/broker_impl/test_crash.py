"""SIGKILL a node mid-stream: every message it confirmed must come back after restart."""

from __future__ import annotations

import threading

import pika
import pika.exceptions
import pytest

from tests.polling import until

pytestmark = pytest.mark.slow

TOML = """
[node]
port = 0
data_dir = "data"
log_level = "warning"

[store]
flush = "sync"
"""


def _publisher(port: int, confirmed: list[int], attempted: list[int], stop: threading.Event) -> None:
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("crash", durable=True)
        ch.exchange_declare("crash-x", "direct", durable=True)
        ch.queue_bind("crash", "crash-x", "rk")
        i = 0
        while not stop.is_set():
            attempted.append(i)
            ch.basic_publish("crash-x", "rk", str(i).encode(), pika.BasicProperties(delivery_mode=2))
            confirmed.append(i)
            i += 1
    except (pika.exceptions.AMQPError, OSError):
        pass  # the node died under us: whatever was in flight is unknown


def test_confirmed_messages_survive_sigkill(subprocess_node) -> None:
    node = subprocess_node(TOML).start()
    confirmed: list[int] = []
    attempted: list[int] = []
    stop = threading.Event()
    t = threading.Thread(target=_publisher, args=(node.port, confirmed, attempted, stop), daemon=True)
    t.start()
    until(
        lambda: len(confirmed) >= 300,
        "300 confirms before the kill",
        gone=lambda: None if t.is_alive() else "the publisher stopped",
    )
    node.kill()  # SIGKILL while the publisher is still going
    stop.set()
    t.join(10)
    assert len(confirmed) >= 300, "publisher made too little progress before the kill"

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
