"""Mirrored queues on three subprocess nodes: kill the master with SIGKILL and count what survives."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path
from typing import Any

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from broker_impl.backing import make_backing_queue, open_store
from broker_impl.cluster.mirror import FP_MASK, Held, fingerprint
from broker_impl.message import Message
from tests.broker_impl.cluster.conftest import (
    HA_SYNCED,
    PERSISTENT,
    NodeProc,
    amqp,
    declare,
    drain,
    publish,
    queue_info,
    wait_for,
)


def _mirrored_queue(
    nodes: list[NodeProc], queue: str, definition: dict, before: int = 0, mirrors: int = 2
) -> None:
    """Declare on n1 (its master), optionally fill it before the policy exists, then mirror it on n2 and n3."""
    n1 = nodes[0]
    declare(n1, queue)
    if before:
        publish(n1, queue, range(before))
    n1.mirror(queue, definition, mirrors)


def _synced_everywhere(cluster_factory: Any, queue: str) -> list[NodeProc]:
    """Three nodes, ``queue`` mastered on n1 and mirrored in sync on n2 and n3."""
    nodes = list(cluster_factory(3))
    _mirrored_queue(nodes, queue, HA_SYNCED)
    return nodes


def test_synced_mirrors_lose_no_confirmed_message_when_the_master_is_killed(cluster_factory) -> None:
    n1, n2, n3 = _synced_everywhere(cluster_factory, "ha.synced")
    publish(n2, "ha.synced", range(200))  # through a non-master node
    n1.kill()
    info = wait_for(
        lambda: (i := queue_info(n2, "ha.synced")) and i["node"] == "n2" and i, what="n2 promoted"
    )
    assert info["messages_ready"] == 200
    assert "promoting the mirror here (in sync)" in n2.log()
    assert drain(n3, "ha.synced") == list(range(200))


def test_unacked_messages_are_requeued_redelivered_on_promotion(cluster_factory) -> None:
    n1, n2, n3 = _synced_everywhere(cluster_factory, "ha.unacked")
    publish(n1, "ha.unacked", range(3))
    c = amqp(n1)
    ch = c.channel()
    m, _p, _b = ch.basic_get("ha.unacked")  # taken, never acked
    assert m is not None
    wait_for(lambda: queue_info(n1, "ha.unacked")["messages_unacknowledged"] == 1, what="one unacked")
    n1.kill()
    wait_for(lambda: queue_info(n2, "ha.unacked").get("node") == "n2", what="n2 promoted")
    c3 = amqp(n3)
    got = []
    for _ in range(3):
        m, _p, body = c3.channel().basic_get("ha.unacked", auto_ack=True)
        got.append((int(body), m.redelivered))
    assert got == [(0, True), (1, False), (2, False)]


def test_unsynced_mirror_promoted_always_loses_what_only_the_master_had(cluster_factory) -> None:
    n1, n2, n3 = cluster_factory(3)
    _mirrored_queue(
        [n1, n2, n3], "ha.always", {"ha-mode": "all", "ha-promote-on-failure": "always"}, before=50
    )
    assert queue_info(n1, "ha.always")["synchronised_mirrors"] == []  # manual sync: the old 50 are on n1 only
    publish(n2, "ha.always", range(50, 60))
    assert queue_info(n1, "ha.always")["messages_ready"] == 60
    n1.kill()
    wait_for(lambda: queue_info(n2, "ha.always").get("node") == "n2", what="n2 promoted")
    assert "NOT in sync" in n2.log()
    assert drain(n3, "ha.always") == list(range(50, 60))  # the 50 confirmed before mirroring are gone


def test_when_synced_keeps_the_queue_unavailable_until_the_master_returns(cluster_factory) -> None:
    n1, n2, n3 = cluster_factory(3)
    _mirrored_queue(
        [n1, n2, n3], "ha.ws", {"ha-mode": "all", "ha-promote-on-failure": "when-synced"}, before=50
    )
    publish(n2, "ha.ws", range(50, 60))
    n1.kill()
    wait_for(lambda: "n1" in n2.ctl("cluster_status")["down"], what="n1 down")
    wait_for(
        lambda: "not promoting (ha-promote-on-failure=when-synced)" in n2.log(), what="promotion refused"
    )
    assert queue_info(n2, "ha.ws")["node"] == "n1"  # nobody promoted
    c = amqp(n3)
    ch = c.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", "ha.ws", b"refused", PERSISTENT)
    c.close()
    n1.start()
    wait_for(
        lambda: all(sorted(n.ctl("cluster_status")["running"]) == ["n1", "n2", "n3"] for n in (n2, n3)),
        what="n1 back for n2 and n3",
    )
    wait_for(lambda: queue_info(n1, "ha.ws").get("messages_ready") == 60, what="60 messages recovered on n1")
    assert drain(n3, "ha.ws") == list(range(60))


def test_manual_sync_then_failover_loses_nothing_and_exactly_replaces_the_mirror(cluster_factory) -> None:
    n1, n2, n3 = cluster_factory(3)
    _mirrored_queue([n1, n2, n3], "ha.manual", {"ha-mode": "exactly", "ha-params": 2}, before=40, mirrors=1)
    mirror = queue_info(n1, "ha.manual")["mirrors"][0]
    assert queue_info(n1, "ha.manual")["synchronised_mirrors"] == []
    assert "synchronising 1 mirror(s) of ha.manual with 40 message(s)" in n1.ctl(
        "sync_queue", name="ha.manual"
    )
    wait_for(
        lambda: queue_info(n1, "ha.manual")["synchronised_mirrors"] == [mirror], what="synced by sync_queue"
    )
    n1.kill()
    by_name = {"n2": n2, "n3": n3}
    survivor = by_name[mirror]
    other = by_name["n3" if mirror == "n2" else "n2"]
    wait_for(lambda: queue_info(survivor, "ha.manual").get("node") == mirror, what="mirror promoted")
    wait_for(
        lambda: queue_info(survivor, "ha.manual").get("mirrors") == [other.name], what="replacement mirror"
    )
    assert drain(other, "ha.manual") == list(range(40))


def test_consumers_follow_the_promoted_mirror_unless_they_asked_to_be_cancelled(cluster_factory) -> None:
    n1, n2, n3 = _synced_everywhere(cluster_factory, "ha.cons")
    c3 = amqp(n3)
    stay, leave = c3.channel(), c3.channel()
    got: list[int] = []
    cancelled: list[str] = []

    def take(
        ch: pika.channel.Channel, m: pika.spec.Basic.Deliver, _p: pika.BasicProperties, body: bytes
    ) -> None:
        got.append(int(body))
        ch.basic_ack(m.delivery_tag)

    stay.basic_consume("ha.cons", take)
    leave.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    leave.basic_consume(
        "ha.cons",
        lambda ch, m, _p, body: ch.basic_reject(m.delivery_tag, requeue=True),
        arguments={"x-cancel-on-ha-failover": True},
        consumer_tag="leaver",
    )
    wait_for(lambda: queue_info(n1, "ha.cons")["consumers"] == 2, what="two consumers on the master")
    n1.kill()
    wait_for(
        lambda: c3.process_data_events(0.1) or cancelled == ["leaver"], what="basic.cancel for the leaver"
    )
    wait_for(
        lambda: queue_info(n2, "ha.cons").get("node") == "n2" and queue_info(n2, "ha.cons")["consumers"] == 1,
        what="the other consumer on the new master",
    )
    publish(n2, "ha.cons", range(20))
    wait_for(lambda: c3.process_data_events(0.1) or len(got) == 20, what="deliveries after failover")
    assert got == list(range(20))
    c3.close()


def test_two_failovers_in_a_row_keep_every_message_once(cluster_factory) -> None:
    """After the first promotion the new master syncs the remaining mirror, so the second promotion is in sync."""
    n1, n2, n3 = _synced_everywhere(cluster_factory, "ha.twice")
    publish(n2, "ha.twice", range(100))
    c = amqp(n3)
    ch = c.channel()
    for _ in range(30):  # consumed and acked on the first master
        m, _p, _b = ch.basic_get("ha.twice", auto_ack=True)
        assert m is not None
    c.close()
    n1.kill()
    wait_for(lambda: queue_info(n2, "ha.twice").get("node") == "n2", what="n2 promoted")
    publish(n3, "ha.twice", range(100, 150))
    wait_for(lambda: queue_info(n2, "ha.twice")["synchronised_mirrors"] == ["n3"], what="n3 in sync with n2")
    c = amqp(n3)
    ch = c.channel()
    for _ in range(20):  # acked on the second master: its mirror must forget them too
        m, _p, _b = ch.basic_get("ha.twice", auto_ack=True)
        assert m is not None
    c.close()
    n2.kill()
    wait_for(lambda: queue_info(n3, "ha.twice").get("node") == "n3", what="n3 promoted")
    assert "promoting the mirror here (in sync)" in n3.log()
    assert drain(n3, "ha.twice") == list(range(50, 150))


def test_mirrors_are_members_of_the_queues_gm_ring(cluster_factory) -> None:
    """The master and every mirror are members of one GM group; the ring drops a killed mirror's node."""
    n1, n2, n3 = _synced_everywhere(cluster_factory, "ha.ring")
    wait_for(
        lambda: sorted(queue_info(n1, "ha.ring")["gm_ring"]) == ["n1", "n2", "n3"], what="a ring of three"
    )
    publish(n2, "ha.ring", range(50))
    n3.kill()
    wait_for(
        lambda: sorted(queue_info(n1, "ha.ring")["gm_ring"]) == ["n1", "n2"], what="n3 gone from the ring"
    )
    publish(n1, "ha.ring", range(50, 60))
    assert queue_info(n1, "ha.ring")["synchronised_mirrors"] == ["n2"]
    n1.kill()
    wait_for(lambda: queue_info(n2, "ha.ring").get("node") == "n2", what="n2 promoted")
    assert drain(n2, "ha.ring") == list(range(60))


def test_the_other_mirror_follows_the_promoted_master_without_a_resync(cluster_factory) -> None:
    """With manual sync, a mirror that had to restart would stay out of sync: staying in the group keeps it in sync."""
    n1, n2, n3 = cluster_factory(3)
    _mirrored_queue(
        [n1, n2, n3], "ha.follow", {"ha-mode": "all"}
    )  # manual sync; empty queue: mirrors in sync at once
    wait_for(
        lambda: len(queue_info(n1, "ha.follow")["synchronised_mirrors"]) == 2, what="both mirrors in sync"
    )
    publish(n3, "ha.follow", range(80))
    c = amqp(n3)
    ch = c.channel()
    m, _p, _b = ch.basic_get("ha.follow")  # unacked when the master dies: requeued on every copy
    assert m is not None
    wait_for(lambda: queue_info(n1, "ha.follow")["messages_unacknowledged"] == 1, what="one unacked")
    n1.kill()
    wait_for(lambda: queue_info(n2, "ha.follow").get("node") == "n2", what="n2 promoted")
    wait_for(lambda: queue_info(n2, "ha.follow")["synchronised_mirrors"] == ["n3"], what="n3 in sync with n2")
    assert "synchronising mirror" not in n2.log()
    assert "promoted to master" in n3.log()
    publish(n3, "ha.follow", range(80, 100))
    n2.kill()
    wait_for(lambda: queue_info(n3, "ha.follow").get("node") == "n3", what="n3 promoted")
    assert "promoting the mirror here (in sync)" in n3.log()
    assert sorted(drain(n3, "ha.follow")) == list(range(100))


@pytest.mark.parametrize("synced", [True, False])
def test_promotion_on_a_controlled_stop_follows_ha_promote_on_shutdown(cluster_factory, synced: bool) -> None:
    """A stopped (not killed) master: the default ``when-synced`` promotes an in-sync mirror only."""
    n1, n2 = cluster_factory(2)
    declare(n1, "ha.stop")
    publish(n1, "ha.stop", range(30))  # before the policy: a new mirror starts without these
    n1.ctl("set_policy", name="ha", pattern="^ha", definition={"ha-mode": "all"})
    wait_for(lambda: queue_info(n1, "ha.stop").get("mirrors") == ["n2"], what="a mirror on n2")
    if synced:
        n1.ctl("sync_queue", name="ha.stop")
        wait_for(lambda: queue_info(n1, "ha.stop")["synchronised_mirrors"] == ["n2"], what="n2 in sync")
    else:
        assert queue_info(n1, "ha.stop")["synchronised_mirrors"] == []
    n1.stop()
    if synced:
        wait_for(lambda: queue_info(n2, "ha.stop").get("node") == "n2", what="n2 promoted")
        assert "master n1 stopped; promoting the mirror here (in sync)" in n2.log()
        assert drain(n2, "ha.stop") == list(range(30))
    else:
        wait_for(lambda: "ha-promote-on-shutdown=when-synced" in n2.log(), what="promotion refused")
        assert queue_info(n2, "ha.stop").get("node") == "n1"


def test_a_killed_master_comes_back_as_an_in_sync_mirror_and_confirms_keep_flowing(cluster_factory) -> None:
    """The slow-clients scenario's failovers: n1 then n2 killed and restarted; each returns as a mirror that joins the ring.

    A restarted node sees its peers come up one link at a time: its mirror's join
    request or its catchup to its new right neighbour can meet a link that is not
    up yet, and the mirror must neither stay out of the ring for ever nor leave
    its neighbour dropping the ring traffic (every later confirm would hang).
    """
    n1, n2, n3 = cluster_factory(3, tick=0.5)
    queue = "ha.rejoin"
    _mirrored_queue([n1, n2, n3], queue, HA_SYNCED)
    publish(n2, queue, range(30))
    n1.kill()
    wait_for(lambda: queue_info(n2, queue).get("node") == "n2", what="n2 promoted")
    n1.start()
    wait_for(
        lambda: sorted(queue_info(n2, queue)["synchronised_mirrors"]) == ["n1", "n3"], what="n1 back in sync"
    )
    publish(n3, queue, range(30, 60))  # confirmed only once n1 and n3 both have them
    n2.kill()
    wait_for(lambda: queue_info(n3, queue).get("node") == "n3", what="n3 promoted")
    n2.start()
    wait_for(
        lambda: sorted(queue_info(n3, queue)["synchronised_mirrors"]) == ["n1", "n2"], what="n2 back in sync"
    )
    publish(n1, queue, range(60, 90))
    assert drain(n2, queue) == list(range(90))


class _Stream:
    """Publishers with confirms, one connection each, running until stopped; what each got confirmed.

    Several connections keep several publishes in flight at every moment, so
    some are always between the master's broadcast and its fsync: the window a
    sync snapshot must not miss.
    """

    def __init__(self, nodes: list[NodeProc], queue: str, per_node: int = 3) -> None:
        self.queue = queue
        self.confirmed: set[int] = set()
        self.attempted: set[int] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(node, k * len(nodes) + i), daemon=True)
            for k in range(per_node)
            for i, node in enumerate(nodes)
        ]
        for t in self._threads:
            t.start()

    def _run(self, node: NodeProc, k: int) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                c = amqp(node)
            except pika.exceptions.AMQPError:
                return  # the node is gone (the killed master)
            ch = c.channel()
            ch.confirm_delivery()
            try:
                while not self._stop.is_set():
                    body = k * 1_000_000 + i
                    i += 1
                    with self._lock:
                        self.attempted.add(body)
                    try:
                        ch.basic_publish("", self.queue, str(body).encode(), PERSISTENT)
                    except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
                        continue
                    with self._lock:
                        self.confirmed.add(body)
                c.close()
            except pika.exceptions.AMQPError:
                continue  # outcome of the last publish unknown; reconnect

    def count(self) -> int:
        with self._lock:
            return len(self.confirmed)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def test_an_automatically_synced_mirror_reaches_and_keeps_sync_under_a_steady_publish_stream(
    cluster_factory,
) -> None:
    """The sync snapshot holds what the master's queue holds, publishes still waiting for their fsync included.

    A mirror that got a snapshot without them would lack them for good: with no
    consumer the head never drains, so it would stay out of sync, the master
    would wait for the other mirror only, and a master cut off from that one
    confirms what it alone holds.
    """
    n1, n2, n3 = cluster_factory(3, tick=0.5)  # nine publishers on a small machine: no false suspicions
    queue = "ha.stream"
    declare(n1, queue)
    stream = _Stream([n1, n2, n3], queue)
    wait_for(lambda: stream.count() >= 300, what="the stream flowing")
    n1.ctl("set_policy", name="ha", pattern="^ha", definition={"ha-mode": "all", "ha-sync-mode": "automatic"})
    wait_for(
        lambda: sorted(queue_info(n1, queue).get("synchronised_mirrors", [])) == ["n2", "n3"],
        what="both mirrors in sync under the stream",
    )
    assert "NOT in sync after sync" not in n2.log() + n3.log()
    seen = stream.count()
    samples = []
    while stream.count() < seen + 500:  # every sample while 500 more are confirmed
        samples.append(sorted(queue_info(n1, queue)["synchronised_mirrors"]))
    assert samples and all(s == ["n2", "n3"] for s in samples), samples
    n1.kill()
    wait_for(lambda: queue_info(n2, queue).get("node") == "n2", what="n2 promoted")
    assert "promoting the mirror here (in sync)" in n2.log()
    seen = stream.count()
    wait_for(lambda: stream.count() >= seen + 100, what="confirms from the new master")
    stream.stop()
    got = drain(n2, queue)
    assert len(got) == len(set(got))
    assert set(got) <= stream.attempted
    assert stream.confirmed - set(got) == set()


_op = st.one_of(
    st.tuples(st.just("publish"), st.booleans()),
    st.tuples(st.just("publish_delivered"), st.booleans()),
    st.tuples(st.just("yield"), st.integers(1, 3)),
    st.tuples(st.just("settle")),
    st.tuples(st.just("fetch")),
    st.tuples(st.sampled_from(["ack", "drop", "requeue"]), st.lists(st.integers(0, 20), max_size=3)),
    st.tuples(st.just("purge")),
)


async def _snapshot_vs_queue(ops: list[tuple[Any, ...]], data_dir: Path) -> None:
    """Drive a real persistent backing queue (fsync before a publish returns) as the master does, then compare.

    The comparison happens with whatever publishes are still waiting for
    their fsync at that point: the moment a sync can come.
    """
    store = await open_store(data_dir, {"flush": "sync"})
    q = make_backing_queue("q", True, store, ram_budget_bytes=2000)
    held = Held()
    tasks: list[asyncio.Task[None]] = []
    count = 0

    async def publish(m: Message) -> None:
        ticket = held.wait(m)
        held.placed(ticket, await q.publish(m))

    for o in ops:
        kind = o[0]
        if kind in ("publish", "publish_delivered"):
            count += 1
            m = Message("", "q", _props(o[1]), b"%d" % count + b"x" * 200)
            if kind == "publish":
                tasks.append(asyncio.ensure_future(publish(m)))
                await asyncio.sleep(0)  # its first step: the message takes its place in the queue
            elif (
                q.depth() == 0
            ):  # the broker uses it on an empty queue only, and learns the seq before anything else
                ticket = held.ticket()
                held.add(ticket, await q.publish_delivered(m), m)
        elif kind == "yield":
            for _ in range(o[1]):
                await asyncio.sleep(0)
        elif kind == "settle":
            await asyncio.gather(*tasks)
        elif kind == "fetch":
            f = q.fetch()
            if f is not None:
                held.fetched(f.seq, f.message)
        elif kind in ("ack", "drop", "requeue"):
            unacked = q.unacked()
            seqs = list(dict.fromkeys(unacked[i % len(unacked)] for i in o[1])) if unacked else []
            if kind == "requeue":
                q.requeue(seqs)
            else:
                await (q.ack(seqs) if kind == "ack" else q.drop(seqs))
                held.forget(seqs)
        elif kind == "purge":
            await q.purge()
            held.purge(set(q.unacked()))
    snapshot, unacked = held.snapshot(), q.unacked()
    assert (
        held.fp == sum(fingerprint(m) for _, m in snapshot) & FP_MASK
    )  # the content fingerprint follows too
    assert sorted(s for s, _ in snapshot if s in unacked) == unacked
    assert [held[s].body for s in unacked] == [m.body for s, m in snapshot if s in unacked]
    ready = []
    while (f := q.fetch()) is not None:
        ready.append(f.message.body)
    assert [m.body for s, m in snapshot if s not in unacked] == ready
    await asyncio.gather(*tasks)
    await q.close()
    await store.close()


def _props(persistent: bool) -> commands.Basic.Properties:
    return commands.Basic.Properties(delivery_mode=2 if persistent else 1)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[
        *settings().suppress_health_check,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(ops=st.lists(_op, max_size=16))
def test_a_sync_snapshot_is_what_the_queue_holds_even_while_writes_are_pending(
    ops: list[tuple[Any, ...]],
) -> None:
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(_snapshot_vs_queue(ops, Path(d)))
