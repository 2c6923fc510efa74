"""A whole-cluster cold start: every node killed, then all started again on their data.

Each node rebuilds the cluster's metadata from what it persisted. The queue's
master is the node the cluster last recorded as master (as RabbitMQ recovers a
durable queue on the node of its recorded master pid): the node holding the
confirmed messages keeps them, the others follow it. Before the record was
persisted, every node claimed every durable queue it knew with a fresh stamp,
the highest node name won, and a node holding none of the messages took the
queue while the one that recovered them dropped its copy.
"""

from __future__ import annotations

import pytest

from tests.broker_impl.cluster.conftest import NodeProc, declare, drain, publish, queue_info, wait_for


def _cold_start(nodes: list[NodeProc], order: list[int]) -> None:
    for node in nodes:
        node.kill()
    for i in order:
        nodes[i].start()
    wait_for(
        lambda: all(len(nd.ctl("cluster_status")["running"]) == len(nodes) for nd in nodes),
        what="all nodes running again",
    )


@pytest.mark.parametrize("order", [[2, 1, 0], [0, 1, 2]], ids=["last-named-first", "master-first"])
def test_an_unmirrored_queue_keeps_its_master_and_its_messages(cluster_factory, order: list[int]) -> None:
    nodes = cluster_factory(3)
    n1, n2, n3 = nodes
    declare(n1, "cold.plain")
    publish(n2, "cold.plain", range(150))  # confirmed by the master n1, forwarded from n2
    wait_for(lambda: queue_info(n3, "cold.plain").get("node") == "n1", what="n3 knows the master")

    _cold_start(nodes, order)

    info = wait_for(
        lambda: (i := queue_info(n3, "cold.plain")) and i.get("messages_ready") == 150 and i,
        what="the queue's 150 messages back",
    )
    assert info["node"] == "n1"
    assert "dropping the copy here" not in n1.log()
    assert drain(n3, "cold.plain") == list(range(150))


def test_a_mirrored_queue_comes_back_whole_on_its_recorded_master(cluster_factory) -> None:
    nodes = cluster_factory(3)
    n1, n2, n3 = nodes
    declare(n1, "ha.cold")
    n1.mirror("ha.cold")
    publish(n3, "ha.cold", range(120))
    n1.kill()  # n2 or n3 is promoted: the record must follow the promotion, not the declaring node
    new = wait_for(
        lambda: (m := queue_info(n2, "ha.cold").get("node")) in ("n2", "n3") and m, what="promotion"
    )
    n1.start()
    wait_for(
        lambda: len(queue_info(n2, "ha.cold").get("synchronised_mirrors", [])) == 2, what="n1 back in sync"
    )
    publish(n1, "ha.cold", range(120, 200))

    _cold_start(nodes, [0, 1, 2])

    info = wait_for(
        lambda: (i := queue_info(n1, "ha.cold")) and i.get("messages_ready") == 200 and i,
        what="the queue's 200 messages back",
    )
    assert info["node"] == new
    assert drain(n1, "ha.cold") == list(range(200))
