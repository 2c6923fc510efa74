"""Transactions on a mirrored queue: SIGKILL the master mid-commit; the promoted mirror has each transaction whole."""

from __future__ import annotations

import threading
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.broker_impl.cluster.conftest import PERSISTENT, amqp, drain, queue_info, wait_for
from tests.broker_impl.cluster.test_mirroring import _mirrored_queue, _synced_everywhere
from tests.polling import until

pytestmark = pytest.mark.slow

BATCH = 5


def _tx_publisher(node, committed: list[int], stop: threading.Event) -> None:
    try:
        c = amqp(node)
        ch = c.channel()
        ch.tx_select()
        b = 0
        while not stop.is_set():
            for i in range(BATCH):
                ch.basic_publish("", "ha.tx", str(b * 100 + i).encode(), PERSISTENT)
            ch.tx_commit()
            committed.append(b)
            b += 1
    except (pika.exceptions.AMQPError, OSError):
        pass  # the master died under the commit in flight: its outcome is unknown


def _transacting(node, queue: str, n: int) -> tuple[pika.BlockingConnection, Any]:
    """A connection to ``node`` and a channel in tx mode, 0..n-1 published persistent to ``queue`` first."""
    c = amqp(node)
    ch = c.channel()
    for i in range(n):
        ch.basic_publish("", queue, str(i).encode(), PERSISTENT)
    ch.tx_select()
    return c, ch


def _mirror_promoted(node, queue: str) -> None:
    wait_for(lambda: queue_info(node, queue).get("node") in ("n2", "n3"), what="a mirror promoted")


def test_master_killed_mid_commit_leaves_every_transaction_whole(cluster_factory) -> None:
    n1, n2, n3 = _synced_everywhere(cluster_factory, "ha.tx")
    committed: list[int] = []
    stop = threading.Event()
    # through n2: each commit travels to the master on n1 as one request, and from it to n2 and n3 as one broadcast
    t = threading.Thread(target=_tx_publisher, args=(n2, committed, stop), daemon=True)
    t.start()
    until(
        lambda: len(committed) >= 40,
        "40 commits before the kill",
        gone=lambda: None if t.is_alive() else "the publisher stopped",
    )
    n1.kill()
    stop.set()
    t.join(15)
    assert len(committed) >= 40, "publisher made too little progress before the kill"
    _mirror_promoted(n3, "ha.tx")
    by_batch: dict[int, list[int]] = {}
    for body in drain(n3, "ha.tx"):
        by_batch.setdefault(body // 100, []).append(body % 100)
    partial = {b: got for b, got in by_batch.items() if sorted(got) != list(range(BATCH))}
    assert not partial, f"transactions partly visible after the failover: {partial}"
    missing = set(committed) - set(by_batch)
    assert not missing, f"committed transactions lost: {sorted(missing)[:5]}"


def test_acks_committed_through_another_node_survive_the_master(cluster_factory) -> None:
    n1, n2, n3 = _synced_everywhere(cluster_factory, "ha.txack")
    _c, ch = _transacting(n2, "ha.txack", 10)
    tags = []
    for _ in range(6):
        m, _p, _b = ch.basic_get("ha.txack")
        tags.append(m.delivery_tag)
    ch.basic_ack(tags[-1], multiple=True)
    ch.tx_commit()  # through n2: commit-ok once the master on n1 and its in-sync mirrors applied the acks
    n1.kill()
    _mirror_promoted(n3, "ha.txack")
    assert drain(n3, "ha.txack") == [6, 7, 8, 9]


def test_a_commit_acking_deliveries_of_a_dead_master_fails_and_they_come_back(cluster_factory) -> None:
    """Found by reference-tx: commit-ok for acks the promoted mirror never saw, and the messages came back."""
    n1, n2, n3 = _synced_everywhere(cluster_factory, "ha.txvoid")
    _c, ch = _transacting(n2, "ha.txvoid", 4)
    tags = [ch.basic_get("ha.txvoid")[0].delivery_tag for _ in range(2)]
    ch.basic_ack(tags[-1], multiple=True)
    n1.kill()
    _mirror_promoted(n3, "ha.txvoid")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.tx_commit()
    assert e.value.reply_code == 406 and "partial tx completion" in e.value.reply_text
    assert sorted(drain(n3, "ha.txvoid")) == [0, 1, 2, 3]


def test_a_transaction_routed_before_its_node_promoted_the_mirror_commits_whole(cluster_factory) -> None:
    """Publishes routed to n2's proxy of the queue, then n2 promoted: the commit puts them in the new master.

    ``scenarios/reference-tx.yaml`` (seed 24): the first publish of a transaction on n2 was routed
    to the proxy 14 ms before n2 promoted its mirror, the commit went to the promoted queue for the
    other four and to the deleted proxy, which confirms and drops, for the first: commit-ok, one lost.
    """
    n1, n2, n3 = cluster_factory(3)
    _mirrored_queue(
        [n1, n2, n3], "ha.txpromo", {"ha-mode": "nodes", "ha-params": ["rabbit@n1", "rabbit@n2"]}, mirrors=1
    )
    wait_for(lambda: queue_info(n1, "ha.txpromo").get("synchronised_mirrors") == ["n2"], what="n2 in sync")
    c = amqp(n2)
    ch = c.channel()
    ch.tx_select()
    for i in range(3):
        ch.basic_publish("", "ha.txpromo", str(i).encode(), PERSISTENT)  # routed to the proxy: n1 masters it
    n1.kill()
    wait_for(lambda: queue_info(n2, "ha.txpromo").get("node") == "n2", what="n2 promoted")
    for i in range(3, 5):
        ch.basic_publish("", "ha.txpromo", str(i).encode(), PERSISTENT)
    ch.tx_commit()
    c.close()
    assert sorted(drain(n3, "ha.txpromo")) == [0, 1, 2, 3, 4]
