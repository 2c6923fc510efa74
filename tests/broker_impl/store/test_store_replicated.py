"""A replica of a store's log: ``read_raw`` on one side, ``append_replicated`` on the other."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker_impl.backing_queue import StoreError
from broker_impl.store import Store, open_store

CFG = {
    "segment_bytes": 4096,
    "checkpoint_interval_ms": 60_000,
    "retention_interval_ms": 60_000,
    "flush": "async",
}


def copy(src: Store, dst: Store, limit: int) -> int:
    """Pull everything ``dst`` lacks, ``limit`` bytes at a time, as a slave does; returns the batches."""
    batches = 0
    pos = dst.end
    while pos < src.end:
        data, nxt = src.read_raw(pos, limit)
        assert nxt > pos
        assert dst.append_replicated(pos, data) == nxt
        pos = nxt
        batches += 1
    return batches


@pytest.mark.parametrize("limit", [1, 300, 1 << 20])
def test_the_replica_is_the_same_log_byte_for_byte_with_its_consume_queues(
    tmp_path: Path, limit: int
) -> None:
    async def go() -> None:
        a = await open_store(tmp_path / "a", CFG)
        b = await open_store(tmp_path / "b", CFG)
        for i in range(120):
            a.append("q1" if i % 3 else "q2", f"message {i}".encode() * 20)
        a.delete_queue("q2")  # a tombstone is a record like any other
        a.append("q3", b"after the delete")
        segments = len(a.log.starts)
        assert segments >= 5  # BLANK segment ends go across too
        assert copy(a, b, limit) >= segments
        assert b.end == a.end
        for seg in sorted((tmp_path / "a" / "commitlog").iterdir()):
            assert (tmp_path / "b" / "commitlog" / seg.name).read_bytes() == seg.read_bytes()
        assert sorted(b.queues) == sorted(a.queues) == ["q1", "q3"]
        for name in b.queues:
            assert b.queues[name].unacked() == a.queues[name].unacked()
        await a.close()
        await b.close()
        # and the replica recovers from its own disk
        b2 = await open_store(tmp_path / "b", CFG)
        assert b2.end == a.end and len(b2.queues["q1"].unacked()) == 80
        await b2.close()

    asyncio.run(go())


def test_bytes_that_are_not_the_next_records_are_refused(tmp_path: Path) -> None:
    async def go() -> None:
        a = await open_store(tmp_path / "a", CFG)
        b = await open_store(tmp_path / "b", CFG)
        for _ in range(5):
            a.append("q", b"x" * 100)
        data, nxt = a.read_raw(0)
        second = len(data) // 5
        b.append_replicated(0, data[:second])
        with pytest.raises(StoreError, match="start at 0 but this log ends at"):
            b.append_replicated(0, data[:second])  # a gap or a repeat
        bad = bytearray(data[second:])
        bad[40] ^= 0x01
        with pytest.raises(StoreError, match="not a record .crc mismatch"):
            b.append_replicated(second, bytes(bad))
        assert b.end == second  # nothing of the bad batch was written
        with pytest.raises(StoreError, match="not a record"):
            b.append_replicated(second, data[second + 1 :])  # shifted: the record claims another offset
        await a.close()
        await b.close()

    asyncio.run(go())


def test_an_empty_replica_starts_where_the_masters_log_starts(tmp_path: Path) -> None:
    async def go() -> None:
        a = await open_store(tmp_path / "a", CFG)
        for _ in range(60):
            a.append("q", b"y" * 200)
        first = a.log.starts[3]
        a.log.delete_segment(a.log.starts[0])  # as retention does
        b = await open_store(tmp_path / "b", CFG)
        data, _ = a.read_raw(first)
        b.append_replicated(first, data)
        assert b.log.starts == [first] and b.first_offset() == first
        c = await open_store(tmp_path / "c", CFG)
        with pytest.raises(StoreError, match="segment boundary"):
            c.append_replicated(first + 10, data)
        for s in (a, b, c):
            await s.close()

    asyncio.run(go())
