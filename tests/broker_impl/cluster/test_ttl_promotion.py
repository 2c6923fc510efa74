"""Message TTL and dead-lettering across a failover: a mirror promoted to master must expire what it
took over (and dead-letter it), as the old master would have."""

from __future__ import annotations

import functools

from tests.broker_impl.cluster.conftest import NodeProc, amqp, publish, queue_info, wait_for

TTL_MS = 2000


def _declare(n1: NodeProc) -> None:
    """On n1 (the masters): a direct exchange ``dlx`` into ``ha.dead``, and ``ha.ttl`` with a TTL
    dead-lettering through it; both mirrored on every node, in sync."""
    c = amqp(n1)
    ch = c.channel()
    ch.exchange_declare("dlx", "direct", durable=True)
    ch.queue_declare("ha.dead", durable=True)
    ch.queue_bind("ha.dead", "dlx", routing_key="ha.ttl")
    ch.queue_declare(
        "ha.ttl", durable=True, arguments={"x-message-ttl": TTL_MS, "x-dead-letter-exchange": "dlx"}
    )
    c.close()
    n1.ctl("set_policy", name="ha", pattern="^ha", definition={"ha-mode": "all", "ha-sync-mode": "automatic"})

    def in_sync(q: str) -> bool:
        return len(queue_info(n1, q).get("synchronised_mirrors", [])) == 2

    for q in ("ha.ttl", "ha.dead"):
        wait_for(functools.partial(in_sync, q), what=f"{q} in sync")


def test_a_promoted_mirror_expires_and_dead_letters_what_it_took_over(cluster_factory) -> None:
    n1, n2, n3 = cluster_factory(3)
    _declare(n1)
    publish(n1, "ha.ttl", range(5))  # confirmed: every mirror has them
    n1.kill()  # before they expire: the promoted mirror's deadlines are the only ones left
    wait_for(lambda: queue_info(n2, "ha.ttl").get("node") in ("n2", "n3"), what="ha.ttl promoted")
    wait_for(lambda: queue_info(n2, "ha.dead").get("messages_ready") == 5, what="five dead-lettered")
    assert queue_info(n3, "ha.ttl")["messages_ready"] == 0
    c = amqp(n3)
    ch = c.channel()
    got = []
    while True:
        m, props, body = ch.basic_get("ha.dead", auto_ack=True)
        if m is None:
            break
        death = props.headers["x-death"][0]
        got.append((int(body), death["reason"], death["queue"]))
    c.close()
    assert got == [(i, "expired", "ha.ttl") for i in range(5)]
