from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pamqp import commands

from broker_impl.backing import MemoryBackingQueue, PersistentBackingQueue, make_backing_queue, open_store
from broker_impl.message import Message

CFG = {"segment_bytes": 4096, "cq_entries_per_file": 16}


def msg(body: bytes, persistent: bool = True) -> Message:
    return Message("ex", "rk", commands.Basic.Properties(delivery_mode=2 if persistent else 1), body)


def test_factory_gives_persistent_queue_only_for_durable_with_store(tmp_path: Path) -> None:
    async def go() -> None:
        store = await open_store(tmp_path, CFG)
        assert isinstance(make_backing_queue("d", True, store), PersistentBackingQueue)
        assert isinstance(make_backing_queue("n", False, store), MemoryBackingQueue)
        assert not isinstance(make_backing_queue("n2", True, None), PersistentBackingQueue)
        await store.close()

    asyncio.run(go())


def test_restart_yields_unacked_persistent_once_with_redelivered_flags(tmp_path: Path) -> None:
    async def first() -> list[int]:
        store = await open_store(tmp_path, CFG)
        q = make_backing_queue("jobs", True, store, ram_budget_bytes=300)
        seqs = []
        for i in range(60):
            seqs.append(await q.publish(msg(b"p%02d" % i + b"." * 40)))
            seqs.append(await q.publish(msg(b"t%02d" % i, persistent=False)))
        assert seqs == sorted(seqs)
        fetched: list[Any] = []
        while len(fetched) < 30:
            f = q.fetch()
            assert f is not None
            fetched.append(f)
        persistent = [f for f in fetched if f.message.persistent]
        # ack out of order: every third persistent one, from the end
        await q.ack([f.seq for f in persistent[::-3]])
        await q.close()
        await store.close()
        assert len(store.log.starts) >= 3  # several segments were rolled
        return [f.seq for f in persistent if f not in persistent[::-3]]

    delivered_unacked = asyncio.run(first())

    async def second() -> None:
        store = await open_store(tmp_path, CFG)
        assert store.recovery_report.clean and store.recovered_queues() == {"jobs"}
        q = make_backing_queue("jobs", True, store)
        got = []
        while (f := q.fetch()) is not None:
            got.append(f)
        bodies = [f.message.body[:3] for f in got]
        assert all(b.startswith(b"p") for b in bodies)  # transient messages are gone
        assert len(bodies) == len(set(bodies))
        acked = 5  # persistent[::-3] of 15 persistent
        assert len(got) == 60 - acked
        assert sorted(f.seq for f in got if f.redelivered) == sorted(delivered_unacked)
        assert all(not f.redelivered for f in got if f.seq > max(delivered_unacked))
        # seqs keep increasing past recovered ones
        new = await q.publish(msg(b"after"))
        assert new > max(f.seq for f in got)
        await q.ack([f.seq for f in got])
        await q.close()
        await store.close()

    asyncio.run(second())

    async def third() -> None:
        store = await open_store(tmp_path, CFG)
        q = make_backing_queue("jobs", True, store)
        f = q.fetch()
        assert f is not None and f.message.body == b"after" and not f.redelivered
        assert q.fetch() is None
        await q.delete()
        await store.close()
        store = await open_store(tmp_path, CFG)
        assert store.recovered_queues() == set()
        await store.close()

    asyncio.run(third())


def test_a_transaction_is_fetchable_only_once_its_commit_record_is_durable(tmp_path: Path) -> None:
    """``publish_batch`` holds the batch until its fsync; a mirror's replay (``hold=False``) does not."""

    async def go() -> None:
        store = await open_store(tmp_path, {**CFG, "flush": "sync"})
        q = make_backing_queue("txq", True, store)
        held = asyncio.ensure_future(q.publish_batch([msg(b"a"), msg(b"t", persistent=False), msg(b"b")]))
        await asyncio.sleep(0)  # its first step wrote the commit record; the group commit has not run
        assert q.len() == 3 and q.fetch() is None
        seqs = await held
        assert [q.fetch().message.body for _ in range(3)] == [b"a", b"t", b"b"]  # type: ignore[union-attr]
        await q.ack(seqs)
        mirror = asyncio.ensure_future(q.publish_batch([msg(b"c"), msg(b"d")], hold=False))
        await asyncio.sleep(0)
        got = q.fetch()
        assert got is not None and got.message.body == b"c"  # before its fsync: the master fetched it already
        await mirror
        await store.close()
        store = await open_store(tmp_path, CFG)
        again = make_backing_queue("txq", True, store)
        assert [again.fetch().message.body for _ in range(2)] == [b"c", b"d"]  # type: ignore[union-attr]
        await store.close()

    asyncio.run(go())
