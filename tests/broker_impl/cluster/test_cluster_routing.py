"""Three nodes as subprocesses: membership, shared metadata, and clients on non-master nodes."""

from __future__ import annotations

import pika

from tests.broker_impl.cluster.conftest import amqp, wait_for


def test_cluster_status_sees_a_killed_peer_go_down_and_come_back(cluster_factory) -> None:
    n1, n2, n3 = cluster_factory(3, tick=0.2, down_after=3)
    st = n1.ctl("cluster_status")
    assert st["members"] == ["n1", "n2", "n3"] and st["running"] == ["n1", "n2", "n3"]
    n3.kill()
    st = wait_for(lambda: (s := n1.ctl("cluster_status")) and "n3" in s["down"] and s, what="n3 down on n1")
    assert st["running"] == ["n1", "n2"]
    n3.start()
    wait_for(lambda: n1.ctl("cluster_status")["running"] == ["n1", "n2", "n3"], what="n3 back")
    assert [p["times_down"] for p in n1.ctl("cluster_status")["peers"] if p["name"] == "n3"] == [1]


def test_metadata_is_cluster_wide(cluster_factory) -> None:
    n1, n2, n3 = cluster_factory(3)
    c = amqp(n2)
    ch = c.channel()
    ch.exchange_declare("ex1", "topic", durable=True)
    ch.queue_declare("shared", durable=True)
    ch.queue_bind("shared", "ex1", "a.*")
    c.close()
    n3.ctl("add_user", name="alice", password="pw", tags=[])
    n1.ctl("set_policy", name="ttl", pattern="^shared$", definition={"message-ttl": 60000})

    def converged() -> bool:
        for n in (n1, n2, n3):
            qs = {q["name"]: q for q in n.ctl("list_queues")}
            if "shared" not in qs or qs["shared"]["policy"] != "ttl":
                return False
            if not any(b["source"] == "ex1" and b["routing_key"] == "a.*" for b in n.ctl("list_bindings")):
                return False
            if "alice" not in [u["name"] for u in n.ctl("list_users")]:
                return False
        return True

    wait_for(converged, what="metadata on every node")
    masters = {
        n.name: {q["name"]: q.get("node", n.name) for q in n.ctl("list_queues")}["shared"]
        for n in (n1, n2, n3)
    }
    assert masters == {"n1": "n2", "n2": "n2", "n3": "n2"}
    c = amqp(n3)
    c.channel().queue_delete("shared")
    c.close()
    wait_for(
        lambda: all("shared" not in [q["name"] for q in n.ctl("list_queues")] for n in (n1, n2, n3)),
        what="delete everywhere",
    )


def test_publish_and_consume_through_non_master_nodes(cluster_factory) -> None:
    n1, n2, n3 = cluster_factory(3)
    c1 = amqp(n1)
    c1.channel().queue_declare("work", durable=True)
    wait_for(
        lambda: (
            "work" in [q["name"] for q in n2.ctl("list_queues")]
            and "work" in [q["name"] for q in n3.ctl("list_queues")]
        ),
        what="queue everywhere",
    )
    c2 = amqp(n2)
    pub = c2.channel()
    pub.confirm_delivery()
    for i in range(200):
        pub.basic_publish("", "work", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    master = {q["name"]: q for q in n1.ctl("list_queues")}["work"]
    assert master["messages_ready"] == 200  # every confirm came from the master after it stored the message
    c3 = amqp(n3)
    sub = c3.channel()
    sub.basic_qos(prefetch_count=20)
    got: list[int] = []
    requeued_once = False
    for method, _props, body in sub.consume(
        "work", inactivity_timeout=30
    ):  # a stall, not a slow machine, ends it
        if method is None:
            break
        if int(body) == 7 and not requeued_once:
            sub.basic_reject(method.delivery_tag, requeue=True)
            requeued_once = True
            continue
        got.append(int(body))
        sub.basic_ack(method.delivery_tag)
        if len(got) == 200:
            break
    sub.cancel()
    assert sorted(got) == list(range(200))
    assert {q["name"]: q for q in n1.ctl("list_queues")}["work"]["messages_ready"] == 0
    pub.basic_publish("", "work", b"last", pika.BasicProperties(delivery_mode=2))
    method, _props, body = sub.basic_get("work")
    assert body == b"last" and method.message_count == 0
    sub.basic_nack(method.delivery_tag, requeue=True)
    method, _props, body = sub.basic_get("work", auto_ack=True)
    assert body == b"last" and method.redelivered
    for c in (c1, c2, c3):
        c.close()


def test_unacked_deliveries_return_when_the_consumers_node_dies(cluster_factory) -> None:
    n1, n2, n3 = cluster_factory(3)
    c1 = amqp(n1)
    ch = c1.channel()
    ch.queue_declare("held", durable=True)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", "held", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    wait_for(lambda: "held" in [q["name"] for q in n3.ctl("list_queues")], what="queue on n3")
    c3 = amqp(n3)
    sub = c3.channel()
    held: list[bytes] = []
    sub.basic_consume("held", lambda _ch, _m, _p, body: held.append(body))
    wait_for(lambda: c3.process_data_events(0.2) or len(held) == 5, what="five deliveries on n3")
    wait_for(
        lambda: {q["name"]: q for q in n1.ctl("list_queues")}["held"]["messages_unacknowledged"] == 5,
        what="all five delivered to n3 and unacked",
    )
    n3.kill()
    wait_for(
        lambda: {q["name"]: q for q in n1.ctl("list_queues")}["held"]["messages_ready"] == 5,
        what="requeued on the master",
    )
    m, _p, body = ch.basic_get("held", auto_ack=True)
    assert body == b"0" and m.redelivered
    c1.close()
