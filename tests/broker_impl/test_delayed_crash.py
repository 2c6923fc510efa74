"""Confirmed delayed messages through a SIGKILL and a power cut: delivered once due, never before, none lost.

A delayed publish is confirmed once its schedule record is flushed; nothing was due
when the node died, so every confirmed one must come out of the restarted node's
schedule, each no earlier than its due time (taken on this host's clock before
the publish was sent: the broker's due time can only be later).
"""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from broker_impl.store import durable
from faults.lazyfs import LazyMount
from tests.broker_impl.conftest import SubprocessNode
from tests.ports import free_port

pytestmark = pytest.mark.slow

N = 40


def _toml(data_dir: str = "data", control_port: int = 0) -> str:
    return f"""
[node]
port = 0
data_dir = "{data_dir}"
control_port = {control_port}
log_level = "warning"

[store]
flush = "sync"
"""


def _publish_delayed(port: int) -> dict[bytes, float]:
    """Publish N delayed messages with confirms; their due times on this host's wall clock."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_declare("dq", durable=True)
    ch.queue_bind("dq", "dx", "rk")
    due: dict[bytes, float] = {}
    for i in range(N):
        delay = 3000 + (i * 37) % 2000  # out of publish order on purpose
        body = f"m{i}".encode()
        due[body] = time.time() + delay / 1000
        ch.basic_publish("dx", "rk", body, pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay}))
    conn.close()  # every publish above was confirmed (pika raises otherwise)
    return due


def _consume_all(port: int, due: dict[bytes, float]) -> dict[bytes, float]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    seen: dict[bytes, float] = {}
    for method, _props, body in ch.consume("dq", inactivity_timeout=30):
        if method is None:
            break
        seen.setdefault(body, time.time())
        ch.basic_ack(method.delivery_tag)
        if set(seen) >= set(due):
            break
    ch.cancel()
    conn.close()
    return seen


def _check(due: dict[bytes, float], seen: dict[bytes, float]) -> None:
    missing = set(due) - set(seen)
    assert not missing, f"{len(missing)} confirmed delayed messages lost, e.g. {sorted(missing)[:5]}"
    early = {b: round(due[b] - t, 3) for b, t in seen.items() if t < due[b]}
    assert not early, f"delivered before due (seconds early): {early}"


def test_confirmed_delayed_messages_survive_sigkill(subprocess_node) -> None:
    node = subprocess_node(_toml()).start()
    due = _publish_delayed(node.port)
    node.kill()  # before anything was due
    node.start()
    _check(due, _consume_all(node.port, due))
    node.stop()


def test_confirmed_delayed_messages_survive_power_loss(lazy: LazyMount, tmp_path: Path) -> None:
    data = Path(lazy.mountpoint) / "data"
    durable.make_dirs(data)  # the node's data directory exists (durably) before the node, as in a deployment
    control_port = free_port()  # the lazy filesystem has no Unix sockets: control over TCP
    node = SubprocessNode(tmp_path, _toml(str(data), control_port))
    node.data_dir = data
    try:
        node.start()
        due = _publish_delayed(node.port)
        node.kill()
        assert lazy.command("crash")["ok"]  # what was not fsync'ed is gone
        node.start()
        _check(due, _consume_all(node.port, due))
    finally:
        node.kill()
