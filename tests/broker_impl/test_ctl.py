"""The admin CLI against a subprocess node, and metadata surviving a restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pika
import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

TOML = """
[node]
port = 0
data_dir = "data"
log_level = "info"
"""


def ctl(data_dir: Path, *args: str, ok: bool = True) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "broker_impl.ctl", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert (proc.returncode == 0) == ok, proc.stderr
    return proc.stdout if ok else proc.stderr


def test_ctl_commands_and_restart(subprocess_node) -> None:
    node = subprocess_node(TOML).start()
    d = node.data_dir
    status = json.loads(ctl(d, "status"))
    assert status["port"] == node.port and status["alarms"] == []

    ctl(d, "add_user", "alice", "s3cret", "--tags", "monitoring")
    ctl(d, "add_vhost", "tenant")
    ctl(d, "set_permissions", "-p", "tenant", "alice", ".*", ".*", ".*")
    ctl(d, "set_policy", "ha-all", "^ha\\.", '{"ha-mode": "all"}', "--priority", "1")
    ctl(d, "set_policy", "ha-two", "^ha\\.two", '{"ha-mode": "exactly", "ha-params": 2}', "--priority", "5")
    err = ctl(d, "add_user", "alice", "x", ok=False)
    assert err.strip() == "error: user 'alice' already exists"
    assert "not valid JSON" in ctl(d, "set_policy", "bad", ".*", "{nope", ok=False)

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    ch = conn.channel()
    ch.exchange_declare("orders", "topic", durable=True)
    ch.queue_declare("ha.one", durable=True)
    ch.queue_declare("ha.two", durable=True)
    ch.queue_declare("transient")
    ch.queue_bind("ha.one", "orders", "order.*")
    ch.confirm_delivery()
    ch.basic_publish("orders", "order.new", b"o1", pika.BasicProperties(delivery_mode=2))

    conns = json.loads(ctl(d, "--json", "list_connections"))
    assert [(c["user"], c["state"]) for c in conns] == [("guest", "running")]
    table = ctl(d, "list_connections")
    assert "guest" in table and "running" in table
    queues = {q["name"]: q for q in json.loads(ctl(d, "--json", "list_queues"))}
    assert queues["ha.one"]["messages_ready"] == 1 and queues["ha.one"]["durable"] is True
    assert queues["ha.one"]["policy"] == "ha-all"
    assert queues["ha.two"]["policy"] == "ha-two"  # highest priority wins
    assert queues["ha.two"]["effective_policy_definition"] == {"ha-mode": "exactly", "ha-params": 2}
    assert queues["transient"]["policy"] is None
    assert "orders\tha.one\torder.*" in ctl(d, "list_bindings")
    assert "orders\ttopic\tTrue" in ctl(d, "list_exchanges")
    conn.close()

    node.stop()  # SIGTERM: graceful
    node.start()
    users = ctl(d, "list_users")
    assert "alice" in users
    assert "ha-two" in ctl(d, "list_policies")
    assert "orders\tha.one\torder.*" in ctl(d, "list_bindings")
    conn = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", node.port, "tenant", pika.PlainCredentials("alice", "s3cret"))
    )
    conn.close()
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    ch = conn.channel()
    assert ch.queue_declare("ha.one", durable=True, passive=True).method.message_count == 1
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        ch.queue_declare("transient", passive=True)  # non-durable queues do not come back
    ch = conn.channel()
    ch.basic_publish("orders", "order.again", b"o2", pika.BasicProperties(delivery_mode=2))
    assert ch.queue_declare("ha.one", durable=True, passive=True).method.message_count == 2
    conn.close()

    ctl(d, "clear_policy", "ha-two")
    ctl(d, "delete_user", "alice")
    assert "alice" not in ctl(d, "list_users")
    meta = json.loads((d / "metadata.json").read_text())
    assert "alice" not in meta["users"] and [p["name"] for p in meta["policies"]] == ["ha-all"]
    node.stop()
    assert "error: no running node found" in ctl(d, "status", ok=False)
