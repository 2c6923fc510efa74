"""Membership changes of the reference broker: forget a node, join one, on subprocess nodes (and the state's merge)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pika
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_impl.cluster.membership import Membership, MembershipError, ask_to_join, reset_node
from broker_impl.ctl import CtlError, call
from tests.broker_impl.cluster.conftest import NodeProc, declare, drain, publish, queue_info, wait_for


def _members(node: NodeProc) -> list[str]:
    return sorted(node.ctl("cluster_status")["members"])


def _running(node: NodeProc) -> list[str]:
    return sorted(node.ctl("cluster_status")["running"])


def test_a_forgotten_node_is_dropped_everywhere_and_a_reset_one_joins_empty_and_syncs(
    cluster_factory,
) -> None:
    n1, n2, n3 = cluster_factory(3)
    declare(n3, "ha.members")  # mastered on n3, the node to be forgotten
    n1.mirror("ha.members")
    publish(n1, "ha.members", range(100))

    with pytest.raises(CtlError, match="n2 is running; stop its app first"):
        n1.ctl("forget_cluster_node", node="n2")
    assert n3.ctl("stop_app") == "stopped"
    assert n3.ctl("status") == {"name": "n3", "app_running": False}
    wait_for(lambda: queue_info(n1, "ha.members").get("node") in ("n1", "n2"), what="the queue failed over")
    n1.ctl("forget_cluster_node", node="rabbit@n3")
    # n2 heard it from n1
    wait_for(lambda: all(_members(n) == ["n1", "n2"] for n in (n1, n2)), what="n1 and n2 no longer list n3")
    info = wait_for(
        lambda: (i := queue_info(n2, "ha.members")) and "n3" not in i["mirrors"] + i["gm_ring"] and i,
        what="n3's mirror gone",
    )
    assert sorted([info["node"], *info["mirrors"]]) == ["n1", "n2"]

    # the forgotten node started as it was (not reset): the members refuse its links
    assert n3.ctl("start_app") == "started"
    wait_for(lambda: "refused a connection" in n1.log() and "'node': 'n3'" in n1.log(), what="n1 refusing n3")
    assert _running(n1) == ["n1", "n2"] and _members(n2) == ["n1", "n2"]

    # reset + join: n3 is admitted through n1, learns n2 from it, and gets a mirror that syncs
    n3.ctl("stop_app")
    with pytest.raises(CtlError, match="clustered with n1, n2; reset it first"):
        n3.ctl("join_cluster", node="n1")
    n3.ctl("reset")
    n3.ctl("join_cluster", node="n1")
    n3.ctl("start_app")
    wait_for(
        lambda: all(_running(n) == ["n1", "n2", "n3"] for n in (n1, n2, n3)),
        what="every node running with n3",
    )
    wait_for(lambda: "n3" in queue_info(n1, "ha.members")["synchronised_mirrors"], what="n3's mirror in sync")
    assert drain(n3, "ha.members") == list(range(100))


def test_a_member_cut_off_while_a_node_was_forgotten_learns_it_when_the_link_returns(
    cluster_factory, net
) -> None:
    n1, n2, n3 = cluster_factory(3, proxied=True)
    net.partition(["n1", "n3"], ["n2"])
    wait_for(lambda: _running(n1) == ["n1", "n3"], what="n2 cut off")
    n3.ctl("stop_app")
    wait_for(lambda: _running(n1) == ["n1"], what="n3 down")
    n1.ctl("forget_cluster_node", node="n3")
    assert _members(n2) == ["n1", "n2", "n3"]  # it could not hear of it yet
    net.heal()
    wait_for(lambda: _members(n2) == ["n1", "n2"], what="n2 learning that n3 was forgotten")
    wait_for(lambda: _running(n2) == ["n1", "n2"], what="n1 and n2 together")


def test_forgetting_a_stopped_master_promotes_the_mirror_that_when_synced_left_waiting(
    cluster_factory,
) -> None:
    n1, n2 = cluster_factory(2)
    declare(n1, "ha.forget")
    publish(n1, "ha.forget", range(30))  # before the policy: the mirror starts without these
    n1.ctl("set_policy", name="ha", pattern="^ha", definition={"ha-mode": "all"})
    # in the ring, not only listed: a publish broadcast before the mirror joined never reaches it
    wait_for(
        lambda: (i := queue_info(n1, "ha.forget")).get("mirrors") == ["n2"] and "n2" in i.get("gm_ring", []),
        what="a mirror on n2 in the queue's ring",
    )
    publish(n1, "ha.forget", range(30, 40))
    n1.ctl("stop_app")
    wait_for(lambda: "ha-promote-on-shutdown=when-synced" in n2.log(), what="promotion refused on the stop")
    assert queue_info(n2, "ha.forget")["node"] == "n1"
    n2.ctl("forget_cluster_node", node="n1")  # n1 will not come back with its messages: the mirror takes over
    wait_for(lambda: queue_info(n2, "ha.forget").get("node") == "n2", what="n2 promoted")
    assert "promoting the mirror here (NOT in sync)" in n2.log()
    assert drain(n2, "ha.forget") == list(range(30, 40))


def test_a_queue_the_forgotten_node_mastered_without_a_mirror_is_deleted_and_stays_deleted(
    cluster_factory,
) -> None:
    n1, n2 = cluster_factory(2)
    declare(n2, "plain")  # no policy: mastered on n2 alone
    publish(n2, "plain", range(5))
    wait_for(lambda: queue_info(n1, "plain").get("node") == "n2", what="n1 knowing the queue")
    n2.ctl("stop_app")
    wait_for(lambda: _running(n1) == ["n1"], what="n2 down")
    assert "queues it mastered without a mirror deleted: //plain" in n1.ctl("forget_cluster_node", node="n2")
    wait_for(lambda: queue_info(n1, "plain") == {}, what="the queue gone from n1")
    n2.ctl("reset")
    n2.ctl("join_cluster", node="n1")
    n2.ctl("start_app")
    wait_for(lambda: _running(n2) == ["n1", "n2"], what="n2 joined")
    wait_for(lambda: not n2.ctl("cluster_status")["joining"], what="n2 serving clients")
    assert queue_info(n1, "plain") == {} and queue_info(n2, "plain") == {}


def test_a_master_stops_its_app_without_waiting_for_mirrors_that_cannot_ack(cluster_factory) -> None:
    """Mirrors frozen (SIGSTOP: links open, nothing answers) and a publish waiting for their acks: stop_app
    must not wait until GM gives up on each link (2 x tick x down_after = 40 s per mirror here)."""
    n1, n2, n3 = cluster_factory(3, down_after=100)
    declare(n1, "ha.frozen")
    n1.mirror("ha.frozen")
    frozen = [n2, n3]
    for node in frozen:
        assert node.proc is not None
        node.proc.send_signal(signal.SIGSTOP)
    try:
        waiting = threading.Thread(target=_publish_ignoring_the_close, args=(n1,), daemon=True)
        waiting.start()
        wait_for(
            lambda: queue_info(n1, "ha.frozen").get("messages_ready") == 1, what="the publish placed on n1"
        )
        assert call(n1.data_dir, "stop_app", timeout=30) == "stopped"
    finally:
        for node in frozen:
            assert node.proc is not None
            node.proc.send_signal(signal.SIGCONT)
    assert "did not come up" not in n1.log()


def _publish_ignoring_the_close(node: NodeProc) -> None:
    """One confirmed publish whose confirm cannot come (the mirrors are frozen); the app's stop closes it."""
    try:
        publish(node, "ha.frozen", range(1))
    except pika.exceptions.AMQPError:
        pass


# --------------------------------------------------------------------------- the state itself

changes = st.lists(
    st.tuples(st.sampled_from(["forget", "admit"]), st.sampled_from(["a", "b", "c"])), max_size=8
)


@given(left=changes, right=changes)
def test_two_copies_merge_to_the_same_members_whatever_the_order(
    tmp_path_factory: pytest.TempPathFactory, left: list, right: list
) -> None:
    copies = []
    for script in (left, right):
        m = Membership(tmp_path_factory.mktemp("m") / "members.json", "a", {"a": 1, "b": 1, "c": 1})
        for op, name in script:
            try:
                m.forget(name) if op == "forget" else m.admit(name)
            except MembershipError:
                pass
        copies.append(m)
    x, y = copies
    merged_xy = Membership(x.path, "a", x.epochs)
    merged_xy.merge(y.epochs)
    merged_yx = Membership(y.path, "a", y.epochs)
    merged_yx.merge(x.epochs)
    assert merged_xy.epochs == merged_yx.epochs
    # a change made on either side is never undone by merging with an older copy
    for name in ("a", "b", "c"):
        assert merged_xy.epochs[name] == max(x.epochs[name], y.epochs[name])


def test_reset_and_join_refuse_what_cannot_work(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "metadata.json").write_text("{}")
    (tmp_path / "node.json").write_text("{}")
    with pytest.raises(MembershipError, match="clustered with b, c; reset it first"):
        ask_to_join(tmp_path, "a", "b", ["b", "c"])
    assert reset_node(tmp_path, "a", ["node.json"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster_members.json", "node.json"]
    with pytest.raises(MembershipError, match="x is not in this node's"):
        ask_to_join(tmp_path, "a", "x", ["b", "c"])
    with pytest.raises(MembershipError, match="cannot join itself"):
        ask_to_join(tmp_path, "a", "a", ["b", "c"])
    ask_to_join(tmp_path, "a", "b", ["b", "c"])
    m = Membership.load(tmp_path, "a", ["b", "c"])
    assert m.members() == ["a"] and m.join == "b"
