"""Promotion decides who is in sync from what the master said in its stream, not from a record that may lag.

The interleaving: n1 masters ``ha.stale`` with 50 messages in it, mirrored on
n2 (the oldest mirror, never synchronised: it lacks the 50) and n3. n3 is
synchronised; n1 counts it in sync and from then on waits for its acks before
it confirms (10 more messages confirmed so). The queue's record, which lists
the in-sync mirrors, never reaches n2 and n3 with n3 in it: n1's record
updates are lost from the moment n3's sync starts (as when the master's
catalog defers its stamping while it applies a peer's records, or the master
dies before it sends them). Then n1 is cut off from both (a partition under
``ignore``: n2 and n3 see their master die).

Deciding from the record (synced: none), ``when-synced`` promotes nobody and
leaves the queue without a master though n3 holds every message n1 confirmed,
and ``always`` promotes n2, which lacks the first 50. Deciding from the
stream (every broadcast of n1 names the mirrors it counts in sync, and GM hands
every surviving mirror the same broadcasts), both promote n3 with all 60.

Three real nodes in this process (each a ``Server`` on its own event-loop
thread), their cluster links through the proxies of ``conftest.Net``; the
lost record updates are n1's ``meta`` frames dropped at its transport.

Each survivor checks one tick after it sees n1 go, so which checks first is
the links' and the loops' timing. When n3 has promoted itself before n2's check
runs, n2 already follows n3 and its record names n3: n2 decides nothing, and
logs so ("nothing to promote here"). The runs with n2 late hold n2's check back
until then, so that interleaving is tested on every run, not only on a loaded
machine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from broker_impl.cluster.gm_link import node_of
from broker_impl.cluster.metadata import key
from broker_impl.cluster.mirror import MirrorMasterBQ
from broker_impl.ctl import call
from tests.broker_impl.cluster.conftest import LinkProxy, Net
from tests.broker_impl.conftest import InProcessNode, make_config
from tests.broker_impl.nodes import PERSISTENT, free_port
from tests.polling import until

QUEUE = "ha.stale"


class _Decisions(logging.Handler):
    """What each node logged about ``QUEUE`` (by the thread of the loop that logged it), and of that its
    promotion decisions: promoting, not promoting, another mirror takes over, or nothing to promote (the
    record already names another master: a survivor that checks after the promoted one took over)."""

    DECIDED = ("promoting", "takes over", "nothing to promote")

    def __init__(self, threads: dict[int, str]) -> None:
        super().__init__(logging.INFO)
        self.threads = threads
        self.lines: list[tuple[str, str]] = []
        self.seen: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if QUEUE not in text:
            return
        who = self.threads.get(record.thread or 0, "?")
        self.lines.append((who, text))
        if any(word in text for word in self.DECIDED):
            self.seen.append((who, text))

    def decided(self) -> set[str]:
        return {who for who, _ in self.seen}


class _Checks:
    """The promotion checks of ``QUEUE`` on one node's loop: scheduled and not run yet (``pending``).

    ``Mirroring`` hands its check to ``call_later`` one tick after the master goes, and again each half
    tick while GM repairs the ring; a check that returns without scheduling another has decided. With
    ``hold`` the checks are kept back from the loop until ``release``: the test picks which survivor
    decides first."""

    def __init__(self, node: InProcessNode, hold: bool = False) -> None:
        self.node = node
        self.pending = 0
        self.held: list[tuple[float, Callable[..., None], tuple[Any, ...]]] | None = [] if hold else None
        loop: Any = node.loop
        self._call_later = loop.call_later

        def install() -> None:
            loop.call_later = self._counted

        node.run(install)

    def _counted(self, delay: float, callback: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if getattr(callback, "__name__", "") != "_maybe_promote" or args[1:2] != (QUEUE,):
            return self._call_later(delay, callback, *args, **kw)
        self.pending += 1  # before the check that schedules it ends: pending never reads 0 between two

        def run(*a: Any) -> None:
            try:
                callback(*a)
            finally:
                self.pending -= 1

        if self.held is not None:
            self.held.append((delay, run, args))
            return None
        return self._call_later(delay, run, *args, **kw)

    def release(self) -> int:
        """Hand the held checks to the loop, as they were scheduled; how many there were."""
        held, self.held = self.held or [], None

        def schedule() -> None:
            for delay, run, args in held:
                self._call_later(delay, run, *args)

        self.node.run(schedule)
        return len(held)

    def idle(self) -> bool:
        """The node sees n1 down and has no check of ``QUEUE`` scheduled or held (read on its loop)."""
        return bool(
            self.node.run(lambda: not self.node.broker.cluster.transport.is_up("n1") and not self.pending)
        )


def _cluster(tmp_path: Path, net: Net) -> list[InProcessNode]:
    cport = free_port()
    names = ["n1", "n2", "n3"]
    addrs = {n: f"127.0.0.{i + 2}" for i, n in enumerate(names)}
    nodes = []
    for name in names:
        peers = {}
        for p in names:
            if p != name:
                link = net.links[(name, p)] = LinkProxy((addrs[p], cport))
                peers[p] = f"127.0.0.1:{link.port}"
        # A tick of 1 s, not the cluster tests' 0.2 s: with three nodes and a client in one loaded
        # interpreter a 0.6 s stall reads as a peer down, and the mirrors restart before the cut:
        # another interleaving than the one under test.
        cfg = make_config(
            tmp_path / name,
            node={"name": name, "port": 0, "data_dir": str(tmp_path / name / "data")},
            cluster={"node": name, "listen": addrs[name], "port": cport, "peers": peers, "tick": 1.0},
        )
        nodes.append(InProcessNode(cfg))
    for node in nodes:
        node.start()
    until(lambda: all(len(_ctl(n, "cluster_status")["running"]) == 3 for n in nodes), "all nodes running")
    return nodes


@pytest.fixture
def cluster(tmp_path: Path, net: Net) -> Iterator[list[InProcessNode]]:
    nodes = _cluster(tmp_path, net)
    yield nodes
    for node in nodes:
        node.stop()


def _ctl(node: InProcessNode, cmd: str, **args: Any) -> Any:
    return call(node.config.data_dir, cmd, args)


def _info(node: InProcessNode) -> dict[str, Any]:
    return {q["name"]: q for q in _ctl(node, "list_queues")}.get(QUEUE) or {}


def _publish(node: InProcessNode, bodies: range) -> None:
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port, heartbeat=0))
    ch = c.channel()
    ch.queue_declare(QUEUE, durable=True)
    ch.confirm_delivery()
    for i in bodies:
        ch.basic_publish("", QUEUE, str(i).encode(), PERSISTENT)
    c.close()


def _record_synced(node: InProcessNode) -> list[str]:
    """The in-sync mirrors the queue's record on ``node`` lists (read on its loop)."""
    record = node.run(lambda: node.broker.cluster.catalog.table.live().get(key("queue", "/", QUEUE)))
    return list((record or {}).get("synced", []))


def _drop_from(node: InProcessNode, kind: str) -> None:
    """From now on ``node``'s frames of ``kind`` leave it no more (whatever else it sends does)."""
    transport = node.broker.cluster.transport
    send: Callable[..., bool] = transport.send

    def send_but(peer: str, header: dict[str, Any], blob: bytes = b"") -> bool:
        return True if header.get("t") == kind else send(peer, header, blob)

    transport.send = send_but


def _master_bq(node: InProcessNode) -> MirrorMasterBQ:
    bq = node.broker.vhosts["/"].queues[QUEUE].bq
    assert isinstance(bq, MirrorMasterBQ)
    return bq


class _Run:
    """The three nodes, the promotion decisions they log for ``QUEUE``, and the steps of the interleaving."""

    def __init__(self, cluster: list[InProcessNode], net: Net) -> None:
        self.nodes = cluster
        self.net = net
        self.decisions = _Decisions({n._thread.ident or 0: n.config.name for n in cluster})
        self.logger = logging.getLogger("broker_impl.cluster")

    def __enter__(self) -> _Run:
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self.decisions)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.decisions)
        self.logger.setLevel(self.level)

    def mirrored_unsynced(self, rule: str) -> None:
        """50 messages on n1, then mirrors on n2 and n3 that lack them (manual sync), in every node's record."""
        n1 = self.nodes[0]
        _publish(n1, range(50))
        policy = {"ha-mode": "all", "ha-promote-on-failure": rule}
        _ctl(n1, "set_policy", name="ha", pattern="^ha", definition=policy)
        until(lambda: all(_info(n).get("mirrors") == ["n2", "n3"] for n in self.nodes), "n2, n3 mirror")
        assert [_record_synced(n) for n in self.nodes[1:]] == [[], []]

    def n3_counted(self, rule: str) -> None:
        """n1 counts n3 in sync and confirms 10 more messages on its acks; the record never says so."""
        n1, n2, n3 = self.nodes
        self.mirrored_unsynced(rule)
        n1.run(lambda: _drop_from(n1, "meta"))
        n1.run(lambda: _master_bq(n1).sync("n3"))
        until(lambda: n1.run(lambda: _master_bq(n1).cluster_fields()["synced"]) == ["n3"], "n1 counts n3")
        _publish(n1, range(50, 60))  # confirmed once n3 (in sync, on n1's count) has each
        assert _record_synced(n2) == _record_synced(n3) == []  # the record lags: n3 is not in it

    def cut_n1(self, late: str | None = None, record: bool = True) -> list[tuple[str, str]]:
        """n1 cut off from both peers; back once n2 and n3 have each decided. With ``late`` (a survivor) its
        checks are held until the other survivor has promoted itself and ``late``'s copy follows it, and
        with ``record`` its record too."""
        checks = {n.config.name: _Checks(n, hold=n.config.name == late) for n in self.nodes[1:]}
        for (a, b), link in self.net.links.items():
            if "n1" in (a, b):
                link.set_cut(True)
        if late is not None:
            first = next(name for name in checks if name != late)
            until(
                lambda: self._follows(late, first, record),
                f"{late} follows {first}",
                gone=lambda: self._stuck(checks, promotes=first),
            )
            assert checks[late].release() > 0
        until(
            lambda: {"n2", "n3"} <= self.decisions.decided(),
            "n2 and n3 decided",
            gone=lambda: self._stuck(checks),
        )
        return self.decisions.seen

    def _follows(self, node: str, master: str, record: bool) -> bool:
        """``master`` has promoted itself, and ``node``'s copy (and with ``record`` its record) follows it
        (read on ``node``'s loop)."""
        if not any(
            who == master and "promoting the mirror here" in text for who, text in self.decisions.seen
        ):
            return False
        n = next(n for n in self.nodes if n.config.name == node)

        def follows() -> bool:
            cluster = n.broker.cluster
            m = cluster.ha.mirrors.get(("/", QUEUE))
            data = cluster.catalog.table.live().get(key("queue", "/", QUEUE)) or {}
            return (
                m is not None
                and node_of(m.master_member) == master
                and (not record or data.get("master") == master)
            )

        return bool(n.run(follows))

    def _stuck(self, checks: dict[str, _Checks], promotes: str | None = None) -> str | None:
        """Why the wait can no longer end: a survivor whose checks are all done with no decision logged
        (a check logs its decision before it ends, so a read after ``idle`` sees it), or ``promotes``
        decided without promoting itself."""
        for name, c in checks.items():
            if name not in self.decisions.decided() and c.idle() and name not in self.decisions.decided():
                return f"{name} has no promotion check left and logged no decision; {self._state()}"
        if promotes is not None and promotes in self.decisions.decided() and checks[promotes].idle():
            mine = [text for who, text in self.decisions.seen if who == promotes]
            if not any("promoting the mirror here" in text for text in mine):
                return f"{promotes} decided {mine}; {self._state()}"
        return None

    def _state(self) -> str:
        """Each node's view of n1 and the queue, and what it logged about the queue."""
        parts = []
        for n in self.nodes:
            name = n.config.name

            def view(n: InProcessNode = n) -> dict[str, Any]:
                cluster = n.broker.cluster
                m = cluster.ha.mirrors.get(("/", QUEUE))
                return {
                    "n1 up": n.config.name == "n1" or cluster.transport.is_up("n1"),
                    "record": cluster.catalog.table.live().get(key("queue", "/", QUEUE)),
                    "follows": m.master_member if m is not None else None,
                }

            logged = [text for who, text in self.decisions.lines if who == name]
            parts.append(f"{name}: {n.run(view)}, logged {logged}")
        return "; ".join(parts)


@pytest.mark.parametrize("late", [None, "n2"], ids=["either-first", "n2-late"])
@pytest.mark.parametrize("rule", ["when-synced", "always"])
def test_a_mirror_the_master_counted_in_sync_is_promoted_though_the_record_never_said_so(
    cluster: list[InProcessNode], net: Net, rule: str, late: str | None
) -> None:
    n3 = cluster[2]
    with _Run(cluster, net) as run:
        run.n3_counted(rule)
        seen = run.cut_n1(late)
    promoted = [who for who, text in seen if "promoting the mirror here" in text]
    assert promoted == ["n3"], seen
    # n2 checking after n3 took over decides nothing, and only because n3 is the master it already follows
    after = [text for who, text in seen if who == "n2" and "nothing to promote" in text]
    assert all("follows n3" in text or "'master': 'n3'" in text for text in after), seen
    assert late is None or len(after) == 1, seen
    assert n3.run(lambda: n3.broker.vhosts["/"].queues[QUEUE].bq.depth()) == 60


@pytest.mark.parametrize("rule", ["when-synced", "always"])
def test_a_survivor_that_follows_the_promoted_master_does_not_promote_itself_though_its_record_lags(
    cluster: list[InProcessNode], net: Net, rule: str
) -> None:
    """n3 promotes itself and n2's copy follows it (n3's ``promoted`` broadcast came through GM), but n3's
    record updates are lost, so n2's record still names n1 when n2's check runs. Deciding from that record
    ``always`` promoted n2 (not in sync) beside n3: two masters, one without the first 50 messages."""
    n3 = cluster[2]
    with _Run(cluster, net) as run:
        run.n3_counted(rule)
        n3.run(lambda: _drop_from(n3, "meta"))
        seen = run.cut_n1(late="n2", record=False)
    assert [who for who, text in seen if "promoting the mirror here" in text] == ["n3"], seen
    assert [text for who, text in seen if who == "n2" and "follows n3" in text] != [], seen
    assert n3.run(lambda: n3.broker.vhosts["/"].queues[QUEUE].bq.depth()) == 60


def test_a_mirror_in_sync_that_the_master_never_counted_so_is_not_promoted_when_synced(
    cluster: list[InProcessNode], net: Net
) -> None:
    """n3's reports never reach n1, so n1 confirms without waiting for n3: a publish it confirmed could
    have reached no surviving copy. Under ``when-synced`` n3, in sync by its own count, is refused."""
    n1, _n2, n3 = cluster
    with _Run(cluster, net) as run:
        run.mirrored_unsynced("when-synced")
        n3.run(lambda: _drop_from(n3, "mq_ack"))
        n1.run(lambda: _master_bq(n1).sync("n3"))
        _publish(n1, range(50, 60))  # confirmed by n1 alone (it counts no mirror in sync)
        until(lambda: n3.run(lambda: n3.broker.cluster.ha.mirrors[("/", QUEUE)].synced), "n3 in sync here")
        assert n1.run(lambda: _master_bq(n1).cluster_fields()["synced"]) == []
        seen = run.cut_n1()
    assert [who for who, text in seen if "promoting the mirror here" in text] == [], seen
    assert sorted(who for who, text in seen if "not promoting" in text) == ["n2", "n3"], seen
