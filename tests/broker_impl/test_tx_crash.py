"""SIGKILL a node with transactions open and committing: after the restart each transaction is all there or gone."""

from __future__ import annotations

import threading

import pika
import pika.exceptions
import pytest

from broker_impl.store.commitlog import CommitLog
from broker_impl.store.config import StoreConfig
from broker_impl.store.record import FLAG_TX_PREPARED
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

PERSISTENT = pika.BasicProperties(delivery_mode=2)
BATCH = 5


def _connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))


def _drain(port: int, queue: str) -> list[bytes]:
    """Everything in ``queue``: a marker published after the restart ends the drain."""
    conn = _connect(port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"end", PERSISTENT)
    seen: list[bytes] = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=30):
        assert method is not None, "the end marker never came"
        ch.basic_ack(method.delivery_tag)
        if body == b"end":
            break
        seen.append(body)
    ch.cancel()
    conn.close()
    return seen


def test_sigkill_between_prepared_records_and_commit_rolls_back(subprocess_node) -> None:
    node = subprocess_node(TOML).start()
    conn = _connect(node.port)
    ch = conn.channel()
    ch.queue_declare("txk", durable=True)
    ch.tx_select()
    for i in range(BATCH):
        ch.basic_publish("", "txk", b"committed-%d" % i, PERSISTENT)
    ch.tx_commit()
    for i in range(BATCH):
        ch.basic_publish("", "txk", b"open-%d" % i, PERSISTENT)
    ch.queue_declare("txk", passive=True)  # a round trip behind the publishes: their half records are written
    node.kill()

    node.start()
    assert _drain(node.port, "txk") == [b"committed-%d" % i for i in range(BATCH)]
    node.stop()
    segment = StoreConfig.from_table({}).segment_bytes
    halves = [
        r.payload
        for r in CommitLog(node.data_dir / "store" / "commitlog", segment).iter_records(0)
        if r.sysflag & FLAG_TX_PREPARED
    ]
    assert len(halves) == 2 * BATCH, "the open transaction's publishes were not written as prepared records"


def _tx_publisher(port: int, committed: list[int], attempted: list[int], stop: threading.Event) -> None:
    try:
        conn = _connect(port)
        ch = conn.channel()
        ch.queue_declare("txs", durable=True)
        ch.tx_select()
        b = 0
        while not stop.is_set():
            attempted.append(b)
            for i in range(BATCH):
                ch.basic_publish("", "txs", b"%d:%d" % (b, i), PERSISTENT)
            ch.tx_commit()
            committed.append(b)
            b += 1
    except (pika.exceptions.AMQPError, OSError):
        pass  # the node died under us: the commit in flight is unknown


def test_sigkill_mid_stream_keeps_every_transaction_whole(subprocess_node) -> None:
    node = subprocess_node(TOML).start()
    committed: list[int] = []
    attempted: list[int] = []
    stop = threading.Event()
    t = threading.Thread(target=_tx_publisher, args=(node.port, committed, attempted, stop), daemon=True)
    t.start()
    until(
        lambda: len(committed) >= 100,
        "100 commits before the kill",
        gone=lambda: None if t.is_alive() else "the publisher stopped",
    )
    node.kill()  # SIGKILL while the publisher is still committing
    stop.set()
    t.join(10)
    assert len(committed) >= 100, "publisher made too little progress before the kill"

    node.start()
    by_batch: dict[int, list[int]] = {}
    for body in _drain(node.port, "txs"):
        b, i = body.split(b":")
        by_batch.setdefault(int(b), []).append(int(i))
    node.stop()
    partial = {b: got for b, got in by_batch.items() if sorted(got) != list(range(BATCH))}
    assert not partial, f"transactions partly visible: {partial}"
    missing = set(committed) - set(by_batch)
    assert not missing, f"committed transactions lost: {sorted(missing)[:5]}"
    assert set(by_batch) <= set(attempted), "a transaction nobody started appeared"
