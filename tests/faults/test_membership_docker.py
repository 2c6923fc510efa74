"""member-remove on the reference broker, seen from inside its cluster: the forgotten node is no
longer a member anywhere and its mirror is gone (the queue it mastered failed over); the node that
joined again is a member, holds a mirror again and that mirror is in sync with every message. The
join is the final heal's, from the worst state a failed heal can leave: the node reset and running
alone (it counts only itself as a member), listed first."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from faults.membership import MemberRemove
from harness.spec import FaultContext
from tests.faults.docker_cluster import running_cluster
from tests.polling import until

pytestmark = [pytest.mark.docker, pytest.mark.chaos]

QUEUE = "chaos.members"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with running_cluster("reference", "mbr", 3, {"ha_mode": "all", "ha_sync_mode": "automatic"}) as c:
        yield c


def ctl(cluster: Any, node: str, *args: str) -> Any:
    rc, out = cluster.nodes[node].exec(cluster.plugin.ctl("--json", *args), timeout=30)
    assert rc == 0, out
    return json.loads(out)


def queue(cluster: Any, node: str) -> dict[str, Any]:
    return next(q for q in ctl(cluster, node, "list_queues") if q["name"] == QUEUE)


def test_a_node_is_forgotten_with_its_mirror_then_joins_and_syncs(cluster: Any) -> None:
    import pika

    host, port = cluster.client_endpoints()["n1"]
    conn = pika.BlockingConnection(pika.ConnectionParameters(host, port, connection_attempts=3))
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)  # mastered on n1, the node that leaves
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("", QUEUE, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    until(
        lambda: sorted(queue(cluster, "n2")["synchronised_mirrors"]) == ["n2", "n3"],
        "two mirrors in sync",
        every=0.5,
    )

    ctx = FaultContext(cluster)
    done = MemberRemove(ctx, {"node": "n1"}, "f1").apply()
    assert done["members_after"] == ["n2", "n3"], done
    for node in ("n2", "n3"):
        assert sorted(ctl(cluster, node, "cluster_status")["members"]) == ["n2", "n3"]
    moved = until(
        lambda: (q := queue(cluster, "n2"))["node"] in ("n2", "n3") and "n1" not in q["mirrors"] and q,
        "the queue failed over without n1's mirror",
        every=0.5,
    )
    assert "n1" not in moved["gm_ring"] and moved["messages_ready"] == 50, moved

    for cmd in ("reset", "start_app"):  # alone: a member of nothing but itself
        ctl(cluster, "n1", cmd)
    assert ctl(cluster, "n1", "cluster_status")["running"] == ["n1"]
    healed = MemberRemove.heal_all(ctx)
    assert healed is not None and healed["n1"]["members_after"] == ["n1", "n2", "n3"], healed
    assert sorted(ctl(cluster, "n1", "cluster_status")["members"]) == ["n1", "n2", "n3"]
    joined = until(
        lambda: "n1" in (q := queue(cluster, "n2"))["synchronised_mirrors"] and q,
        "n1's mirror in sync",
        every=0.5,
    )
    assert "n1" in joined["gm_ring"], joined
    local = queue(cluster, "n1")  # n1 started empty: what it holds came by the sync
    assert local["local_messages_ready"] == 50 and local["messages_ready"] == 50, local


def test_the_final_heal_leaves_a_stopped_member_alone(cluster: Any) -> None:
    """A member whose app is stopped (as RabbitMQ's ``pause_minority`` stops it) has not left: the
    final heal must not join it again, since a join starts with ``reset`` and wipes its data."""
    ctx = FaultContext(cluster)
    ctl(cluster, "n2", "stop_app")
    try:
        until(
            lambda: "n2" not in ctl(cluster, "n1", "cluster_status")["running"],
            "n1 sees n2 stopped",
            every=0.5,
        )
        assert sorted(ctl(cluster, "n1", "cluster_status")["members"]) == ["n1", "n2", "n3"]
        assert MemberRemove.heal_all(ctx) is None
    finally:
        ctl(cluster, "n2", "start_app")
    until(
        lambda: sorted(ctl(cluster, "n1", "cluster_status")["running"]) == ["n1", "n2", "n3"],
        "n2 running again",
        every=0.5,
    )
