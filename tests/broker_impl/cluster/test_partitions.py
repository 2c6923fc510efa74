"""Partitions cut through per-link proxies between three subprocess nodes."""

from __future__ import annotations

import pika
import pytest

from tests.broker_impl.cluster.conftest import Net, NodeProc, wait_for

pytestmark = pytest.mark.timeout(150)

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _conn(node: NodeProc) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp_port, heartbeat=0,
                                                             connection_attempts=1))


def _info(node: NodeProc, queue: str) -> dict:
    return {q["name"]: q for q in node.ctl("list_queues")}.get(queue) or {}


def _publish(node: NodeProc, queue: str, bodies: range) -> None:
    c = _conn(node)
    ch = c.channel()
    ch.confirm_delivery()
    for i in bodies:
        ch.basic_publish("", queue, str(i).encode(), PERSISTENT)
    c.close()


def _drain(node: NodeProc, queue: str) -> set[int]:
    c = _conn(node)
    ch = c.channel()
    out = set()
    while True:
        m, _p, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            break
        out.add(int(body))
    c.close()
    return out


def _split_brain(nodes: list[NodeProc], net: Net) -> None:
    """A queue mastered on n1 and mirrored in sync everywhere, then n1 cut off: n2 promotes on its side."""
    n1, n2, n3 = nodes
    n1.ctl("set_policy", name="ha", pattern="^ha", definition={"ha-mode": "all", "ha-sync-mode": "automatic"})
    c = _conn(n1)
    c.channel().queue_declare("ha.split", durable=True)
    c.close()
    wait_for(lambda: len(_info(n1, "ha.split").get("synchronised_mirrors", [])) == 2, what="mirrors in sync")
    _publish(n1, "ha.split", range(10))
    net.partition(["n1"], ["n2", "n3"])
    wait_for(lambda: _info(n2, "ha.split").get("node") == "n2", what="n2 promoted on its side")
    _publish(n1, "ha.split", range(100, 110))  # accepted by the old master, alone
    _publish(n3, "ha.split", range(200, 210))  # accepted by the new master, through n3


def test_pause_minority_closes_and_refuses_clients_until_a_majority_is_back(cluster_factory, net) -> None:  # type: ignore[no-untyped-def]
    n1, n2, n3 = cluster_factory(3, proxied=True, partition_handling="pause_minority")
    held = _conn(n3)
    net.partition(["n1", "n2"], ["n3"])
    wait_for(lambda: n3.ctl("cluster_status")["paused"], what="n3 paused")
    with pytest.raises(pika.exceptions.AMQPError):
        held.channel()
    with pytest.raises(pika.exceptions.AMQPError):
        _conn(n3)
    assert not n1.ctl("cluster_status")["paused"]
    _conn(n1).close()
    net.heal()
    wait_for(lambda: not n3.ctl("cluster_status")["paused"], what="n3 resumed")
    _conn(n3).close()
    assert "pausing (pause_minority)" in n3.log()


def test_ignore_keeps_both_sides_writing_and_discards_one_side_on_heal(cluster_factory, net) -> None:  # type: ignore[no-untyped-def]
    nodes = cluster_factory(3, proxied=True, partition_handling="ignore")
    n1, n2, n3 = nodes
    _split_brain(nodes, net)
    net.heal()
    wait_for(lambda: len({_info(n, "ha.split").get("node") for n in nodes}) == 1, what="one master again")
    got = _drain(n3, "ha.split")
    side1, side2 = set(range(100, 110)), set(range(200, 210))
    # every message was confirmed; one side's are gone (the record with the later stamp won)
    assert set(range(10)) <= got
    assert (side1 <= got and not got & side2) or (side2 <= got and not got & side1), sorted(got)


def test_autoheal_restarts_the_side_with_fewer_clients(cluster_factory, net) -> None:  # type: ignore[no-untyped-def]
    nodes = cluster_factory(3, proxied=True, partition_handling="autoheal")
    n1, n2, n3 = nodes
    _split_brain(nodes, net)
    keep = [_conn(n2), _conn(n3)]  # clients on the majority side
    wait_for(lambda: n2.ctl("status")["connections"] >= 1, what="clients counted")
    import time

    time.sleep(0.5)  # a couple of ticks so the counts travel
    net.heal()
    wait_for(lambda: all(_info(n, "ha.split").get("node") == "n2" for n in nodes), what="n2 master everywhere")
    assert "loses to" in n1.log()
    got = _drain(n3, "ha.split")
    assert got == set(range(10)) | set(range(200, 210))  # n1's writes during the partition are discarded
    for c in keep:
        c.close()
