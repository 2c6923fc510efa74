"""SIGKILL a node with transactions open and committing: after the restart each transaction is all there or gone."""

from __future__ import annotations

from collections.abc import Callable

import pika
import pika.exceptions
import pytest

from broker_impl.store.commitlog import CommitLog
from broker_impl.store.config import StoreConfig
from broker_impl.store.record import FLAG_TX_PREPARED
from tests.broker_impl.conftest import SYNC_NODE, kill_mid_stream

pytestmark = pytest.mark.slow

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
    node = subprocess_node(SYNC_NODE).start()
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


def _tx_publisher(port: int) -> Callable[[int], None]:
    ch = _connect(port).channel()
    ch.queue_declare("txs", durable=True)
    ch.tx_select()

    def commit_batch(b: int) -> None:
        for i in range(BATCH):
            ch.basic_publish("", "txs", b"%d:%d" % (b, i), PERSISTENT)
        ch.tx_commit()

    return commit_batch


def test_sigkill_mid_stream_keeps_every_transaction_whole(subprocess_node) -> None:
    node = subprocess_node(SYNC_NODE).start()
    committed, attempted = kill_mid_stream(node, _tx_publisher, 100, "commits")

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
