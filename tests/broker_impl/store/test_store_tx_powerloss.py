"""Transactions in the commit log under power loss, on the project's lazy filesystem (unsynced writes dropped).

A transaction's publishes are prepared ("half") records, its commit is one
record per queue holding its messages and one holding its acks. After the power
goes: a transaction whose commit record was on disk is all there (messages in
the queue, acks applied) and one whose commit record was not is all gone,
prepared records or not, even when a checkpoint fsync'ed the consume queue and
ack log in between.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from broker_impl.store import open_store
from broker_impl.store.commitlog import CommitLog
from broker_impl.store.record import FLAG_TX_PREPARED
from faults.lazyfs import LazyMount, fuse_available

REASON = fuse_available()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"needs FUSE: {REASON}")]

CFG: dict[str, Any] = {"flush": "sync", "checkpoint_interval_ms": 600_000, "segment_bytes": 64 * 1024}


def _bodies(store, queue: str) -> list[bytes]:
    out = []
    for index, offset, size in store.queues[queue].unacked():
        got = store.read_message(offset, size, index)
        assert got is not None, f"index {index} unreadable"
        out.append(got[0])
    return out


@pytest.mark.parametrize("checkpoint_after", [False, True])
def test_power_cut_keeps_committed_and_drops_uncommitted(lazy: LazyMount, checkpoint_after: bool) -> None:
    data = Path(lazy.mountpoint) / "store"

    async def before_cut() -> None:
        store = await open_store(data, CFG)
        plain = [store.append("q", b"plain-%d" % i) for i in range(4)]
        await store.wait_durable(plain[-1][0] + plain[-1][1])
        # committed and durable: three messages and acks of plain-0 and plain-1
        for i in range(3):
            store.prepare("q", 1, b"a-%d" % i)
        off, size, _first = store.append_batch("q", [b"a-%d" % i for i in range(3)])
        await store.wait_durable(store.ack_batch("q", [plain[0][2], plain[1][2]]))
        # prepared and flushed, never committed (the client went away before tx.commit)
        for i in range(3):
            store.prepare("q", 2, b"b-%d" % i)
        await store.flush()
        # committed in the page cache only: its records and its acks must not survive the cut
        for i in range(3):
            store.prepare("q", 3, b"c-%d" % i)
        store.append_batch("q", [b"c-%d" % i for i in range(3)])
        store.ack_batch("q", [plain[2][2]])
        if checkpoint_after:
            # fsyncs the consume queue (entries of tx 3 included) and the ack log; the log stays unflushed
            await store.write_checkpoint()
        assert lazy.command("crash")["ok"]
        store.abandon()

    asyncio.run(before_cut())

    async def after_cut() -> None:
        store = await open_store(data, CFG)
        assert _bodies(store, "q") == [b"plain-2", b"plain-3", b"a-0", b"a-1", b"a-2"]
        prepared = [
            r
            for r in CommitLog(data / "commitlog", CFG["segment_bytes"]).iter_records(0)
            if r.sysflag & FLAG_TX_PREPARED
        ]
        assert [r.payload for r in prepared] == [b"a-0", b"a-1", b"a-2", b"b-0", b"b-1", b"b-2"]
        # the log goes on after recovery: a new commit lands after what survived
        store.append_batch("q", [b"d-0"])
        assert _bodies(store, "q")[-1] == b"d-0"
        await store.close()

    asyncio.run(after_cut())
