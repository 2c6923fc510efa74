from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pamqp import commands

from broker_impl.backing import MemoryBackingQueue, StoreConfigError, make_backing_queue, open_store
from broker_impl.message import Message


def msg(body: bytes, persistent: bool = False) -> Message:
    return Message("ex", "rk", commands.Basic.Properties(delivery_mode=2 if persistent else 1), body)


def run(coro):
    return asyncio.run(coro)


def test_fifo_ack_and_depth() -> None:
    async def go() -> None:
        q = MemoryBackingQueue("q")
        seqs = [await q.publish(msg(b"m%d" % i)) for i in range(5)]
        assert seqs == sorted(seqs) and len(set(seqs)) == 5
        assert (q.len(), q.depth(), q.ram_bytes()) == (5, 5, 10)
        f = q.fetch()
        assert f is not None and f.message.body == b"m0" and not f.redelivered
        assert (q.len(), q.depth(), q.unacked()) == (4, 5, [seqs[0]])
        await q.ack([f.seq])
        assert (q.len(), q.depth(), q.unacked(), q.ram_bytes()) == (4, 4, [], 8)

    run(go())


def test_requeue_returns_to_original_position_marked_redelivered() -> None:
    async def go() -> None:
        q = MemoryBackingQueue("q")
        for i in range(4):
            await q.publish(msg(b"%d" % i))
        a, b, c = q.fetch(), q.fetch(), q.fetch()
        assert a and b and c
        q.requeue([c.seq, a.seq])
        got = [q.fetch() for _ in range(3)]
        assert [(g.message.body, g.redelivered) for g in got if g] == [
            (b"0", True),
            (b"2", True),
            (b"3", False),
        ]
        assert q.unacked() == sorted([a.seq, b.seq, c.seq + 1, c.seq])
        assert q.fetch() is None

    run(go())


def test_drop_purge_publish_delivered() -> None:
    async def go() -> None:
        q = MemoryBackingQueue("q")
        s = await q.publish_delivered(msg(b"direct"))
        assert q.unacked() == [s] and q.len() == 0
        for i in range(3):
            await q.publish(msg(b"%d" % i))
        f = q.fetch()
        assert f is not None
        await q.drop([f.seq])
        assert await q.purge() == 2
        assert (q.len(), q.depth(), q.ram_bytes()) == (0, 1, len(b"direct"))
        q.requeue([s])
        g = q.fetch()
        assert g is not None and g.message.body == b"direct" and g.redelivered
        # Unknown seqs are ignored: a mirror may replay an ack it already applied.
        await q.ack([g.seq, 12345])
        assert q.depth() == 0

    run(go())


def test_paging_keeps_ram_under_budget_and_order(tmp_path: Path) -> None:
    async def go() -> None:
        q = MemoryBackingQueue("q", ram_budget_bytes=1000, spill_dir=tmp_path / "spill")
        for i in range(500):
            await q.publish(msg(b"%05d" % i + b"x" * 95))
            assert q.ram_bytes() <= 1000
        assert q.ram_bytes() == 1000 and q.spilled_bytes() > 0
        out = []
        while (f := q.fetch()) is not None:
            out.append(f.message.body[:5])
            await q.ack([f.seq])
            assert q.ram_bytes() <= 1000
        assert out == [b"%05d" % i for i in range(500)]
        assert q.spilled_bytes() == 0
        await q.close()
        assert not (tmp_path / "spill").exists()

    run(go())


def test_spill_segments_are_freed_while_draining(tmp_path: Path) -> None:
    async def go() -> None:
        q = MemoryBackingQueue("q", ram_budget_bytes=0, spill_dir=tmp_path)
        q._spill_file().segment_bytes = 4096
        for _ in range(200):
            await q.publish(msg(b"y" * 100))
        assert q._spill is not None and q._spill.segment_count() > 3
        for _ in range(190):
            f = q.fetch()
            assert f is not None
            await q.ack([f.seq])
        assert q._spill.segment_count() <= 2
        assert len(list(tmp_path.iterdir())) == q._spill.segment_count()

    run(go())


def test_lower_budget_pages_out_and_requeued_paged_message_is_readable(tmp_path: Path) -> None:
    async def go() -> None:
        q = MemoryBackingQueue("q", spill_dir=tmp_path)
        for i in range(10):
            await q.publish(msg(b"%d" % i * 10))
        f = q.fetch()
        assert f is not None
        q.set_ram_budget(25)
        assert q.ram_bytes() <= 25
        q.requeue([f.seq])
        bodies = []
        while (g := q.fetch()) is not None:
            bodies.append(g.message.body)
        assert bodies == [b"%d" % i * 10 for i in range(10)]

    run(go())


@pytest.mark.slow
def test_million_messages_stay_under_budget(tmp_path: Path) -> None:
    async def go() -> None:
        budget = 4 * 1024 * 1024
        q = MemoryBackingQueue("q", ram_budget_bytes=budget, spill_dir=tmp_path)
        body = b"z" * 100
        for _ in range(1_000_000):
            await q.publish(msg(body))
        assert q.ram_bytes() <= budget and q.len() == 1_000_000
        for _ in range(1000):
            f = q.fetch()
            assert f is not None
            await q.ack([f.seq])
        assert q.ram_bytes() <= budget
        await q.delete()

    run(go())


def test_factory_picks_memory_queue_and_validates_config(tmp_path: Path) -> None:
    async def go() -> None:
        store = await open_store(tmp_path, {"flush": "async"})
        q = make_backing_queue("t", False, store, ram_budget_bytes=10)
        assert isinstance(q, MemoryBackingQueue) and not q.durable
        await q.close()
        await store.close()
        with pytest.raises(StoreConfigError, match="flush = 'fast'.*'sync' and 'async'"):
            await open_store(tmp_path, {"flush": "fast"})
        with pytest.raises(StoreConfigError, match="unknown key 'segment_size'"):
            await open_store(tmp_path, {"segment_size": 1})

    run(go())
