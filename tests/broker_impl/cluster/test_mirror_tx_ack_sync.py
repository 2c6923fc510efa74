"""A committed ack batch being flushed must not knock the mirrors out of sync, so commits keep waiting for them.

The master's persistent queue takes a transaction's acked messages out of its
depth at once and then waits for the ack record's fsync. Before the fix the
master broadcast the acks only after that fsync, so every operation broadcast
in between (a fetch, another transaction's publishes) carried a depth a mirror
could not have: the mirror answered "NOT in sync", the master stopped waiting
for it, and a commit landing in that window got commit-ok with no mirror
holding its publishes. ``scenarios/reference-tx.yaml`` showed it as hundreds of
in/out-of-sync flips a run (every mirror together, since they replay the same
stream), and a kill of the master in such a window can leave the promoted mirror
without a committed transaction.

The master and the mirror here are the real ``MirrorMasterBQ`` and ``Mirror``
on real backing queues (the master's on a real store with ``flush: sync``);
what they are handed of their nodes (GM, links) is a pair of recorders wired to
each other: the master's broadcasts are fed to the mirror, the mirror's acks to
the master.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from functools import partial
from pathlib import Path
from typing import Any

from pamqp import commands

from broker_impl.backing import make_backing_queue, open_store
from broker_impl.cluster.config import ClusterConfig
from broker_impl.cluster.mirror import Mirror, MirrorMasterBQ, Site
from broker_impl.message import Message
from tests.polling import until_async


class _Endpoint:
    """A GM member: the master's broadcasts go to ``deliver`` (the mirror) unless held back."""

    def __init__(self) -> None:
        self.ring: list[str] = []
        self.id = "n1/m"
        self.group = "g"
        self.deliver: Any = None
        self.hold = False
        self.held: list[tuple[dict[str, Any], bytes]] = []
        self.on_view: Any = None

    def join(self) -> None:
        pass

    def close(self) -> None:
        pass

    def tick(self) -> None:
        pass

    def broadcast(self, payload: tuple[dict[str, Any], bytes]) -> None:
        if self.hold:
            self.held.append(payload)
        elif self.deliver is not None:
            self.deliver(*payload)

    def release(self) -> None:
        self.hold = False
        for h, blob in self.held:
            self.deliver(h, blob)
        self.held.clear()


class _Gm:
    def __init__(self, endpoint: _Endpoint | None = None) -> None:
        self._endpoint = endpoint or _Endpoint()

    def endpoint(self, group: str, **_callbacks: Any) -> _Endpoint:
        return self._endpoint


class _Transport:
    """A node's links: sends are recorded, and handed to ``route`` (the other side) when it is set."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.route: Any = None
        self.peers = ["n1", "n2"]

    def send(self, peer: str, msg: dict[str, Any], blob: bytes = b"") -> bool:
        self.sent.append(msg)
        if self.route is not None:
            self.route(msg)
        return True

    def is_up(self, peer: str) -> bool:
        return True


def _site(me: str, transport: _Transport, gm: _Gm, store: Any) -> Site:
    return Site(
        ClusterConfig(me),
        transport,  # type: ignore[arg-type]
        gm,  # type: ignore[arg-type]
        lambda coro: asyncio.get_running_loop().create_task(coro),
        mirrors={},
        reconcile_mirrors=lambda: None,
        local_changed=lambda: None,
        backing=lambda key, durable: make_backing_queue(key, durable, store, ram_budget_bytes=1 << 20),
    )


def _msg(i: int) -> Message:
    return Message("", "q", commands.Basic.Properties(delivery_mode=2), b"m%d" % i)


async def _run(data_dir: Path) -> tuple[list[dict[str, Any]], bool]:
    store = await open_store(data_dir / "n1", {"flush": "sync"})
    mstore = await open_store(data_dir / "n2", {"flush": "sync"})
    endpoint = _Endpoint()
    m_transport, s_transport = _Transport(), _Transport()
    master = MirrorMasterBQ(
        make_backing_queue("q", True, store, ram_budget_bytes=1 << 20),
        _site("n1", m_transport, _Gm(endpoint), store),
        "/",
        "q",
    )
    master.add_mirror("n2", sync=False)
    mirror = Mirror(_site("n2", s_transport, _Gm(), mstore), "/", "q", "n1", True, "g", "n1/m")
    endpoint.deliver = lambda h, blob: mirror.feed(h, blob)
    acks: list[dict[str, Any]] = []

    def to_master(msg: dict[str, Any]) -> None:
        if msg.get("t") == "mq_ack":
            acks.append(msg)
            master.mirror_acked("n2", int(msg["n"]), bool(msg["synced"]))

    s_transport.route = to_master
    mirror.feed({"op": "start", "n": -1, "depth": -1}, b"")  # the mirror's member joined the group
    master.mirror_joined("n2")
    await until_async(
        lambda: master.mirrors["n2"].synced, "the mirror of an empty queue in sync", every=0.005
    )

    await master.publish_batch([_msg(i) for i in range(6)])  # a committed transaction of 6
    fetched = [master.fetch() for _ in range(4)]
    seqs = [f.seq for f in fetched if f is not None]
    assert len(seqs) == 4
    # The store's fsyncs run on its two pool threads: keep both busy until ``gate`` opens, so the ack
    # record's fsync (and the next commit's) is held for as long as the steps below take.
    gate = threading.Event()
    blockers = [asyncio.get_running_loop().run_in_executor(store._pool, gate.wait) for _ in range(2)]
    acking = asyncio.ensure_future(master.ack_batch(seqs))  # a consumer's committed ack transaction of 4
    await asyncio.sleep(
        0
    )  # its first step: the acked messages leave the master's depth, the fsync is pending
    master.fetch()  # a delivery meanwhile
    n_fetch = master._n
    await until_async(
        partial(lambda n: any(a["n"] >= n for a in acks), n_fetch), "the fetch's ack", every=0.005
    )
    # the next commit: its broadcast does not reach the mirror yet (still on its way when the master dies)
    endpoint.hold = True
    committing = asyncio.ensure_future(master.publish_batch([_msg(i) for i in range(10, 15)]))
    await asyncio.sleep(0)  # its first step: the publishes take their places and wait for the fsync
    assert not acking.done() and not committing.done()
    gate.set()
    await asyncio.gather(*blockers)
    # the master's own fsync done (its publishes have their seqs): what is left is the wait for the mirror
    await until_async(lambda: master.held.waiting() == 0, "the master's fsync of the commit", every=0.005)
    for _ in range(3):
        await asyncio.sleep(0)
    waited_for_the_mirror = not committing.done()  # done: commit-ok with no mirror holding the transaction
    endpoint.release()
    async with asyncio.timeout(10):
        await asyncio.gather(acking, committing)
    await mirror.discard()
    await master.close()
    await store.close()
    await mstore.close()
    return acks, waited_for_the_mirror


def test_a_pending_committed_ack_batch_leaves_the_mirror_in_sync_and_commits_wait_for_it() -> None:
    with tempfile.TemporaryDirectory() as d:
        acks, waited = asyncio.run(_run(Path(d)))
    flips = [a for a in acks if not a["synced"]]
    assert not flips, f"the mirror reported out of sync while the acks were flushed: {flips}"
    assert waited, "tx.commit-ok went out before the in-sync mirror had the transaction"
