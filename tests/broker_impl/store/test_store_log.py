from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from broker_impl.backing_queue import StoreError
from broker_impl.store import open_store
from broker_impl.store import record as rec
from broker_impl.store.commitlog import CommitLog
from broker_impl.store.progress import Progress

CFG = {
    "segment_bytes": 4096,
    "cq_entries_per_file": 8,
    "checkpoint_interval_ms": 60_000,
    "retention_interval_ms": 60_000,
}


def test_record_roundtrip_and_crc_covers_whole_record() -> None:
    data = rec.encode("orders", 7, 4096, b"payload-bytes", 111, 222)
    got = rec.decode(data, 0, 4096, 10_000)
    assert got == rec.Record("orders", 7, 4096, 111, 222, b"payload-bytes", 0, len(data))
    # a flipped bit in the queue name (outside the body) is caught
    name_at = rec.HEADER_SIZE + 2
    bad = bytearray(data)
    bad[name_at] ^= 0x01
    assert rec.decode(bytes(bad), 0, 4096, 10_000) == rec.Bad("crc mismatch")
    # the record knows where it belongs
    assert isinstance(rec.decode(data, 0, 8192, 10_000), rec.Bad)
    torn = rec.decode(data[:-3], 0, 4096, 10_000)
    assert isinstance(torn, rec.Bad) and torn.reason.startswith("truncated record")
    assert rec.decode(b"\0" * 64, 0, 0, 1000) == rec.Bad("zero-filled")
    assert rec.decode(rec.encode_blank(300), 0, 0, 300) == rec.Blank(300)
    assert isinstance(rec.decode(rec.encode_blank(300), 0, 0, 301), rec.Bad)


def test_segment_roll_writes_blank_and_names_by_offset(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, 1024)
    offsets = [log.append("q", i, b"x" * 100, 1, 1)[0] for i in range(30)]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[:3] == ["00000000000000000000", "00000000000000001024", "00000000000000002048"]
    assert all(len(n) == 20 for n in names)
    first = (tmp_path / names[0]).read_bytes()
    last_in_first = max(o for o in offsets if o < 1024)
    blank_at = last_in_first + rec.encoded_size("q", 100)
    assert rec.decode(first, blank_at, blank_at, 1024 - blank_at) == rec.Blank(1024 - blank_at)
    assert 1024 in offsets  # the next record opens the next segment
    log.close()
    again = CommitLog(tmp_path, 1024)
    records, cuts = again.recover(0)
    assert cuts == [] and [r.offset for r in records] == offsets and again.wrote == log.wrote


def test_consume_queue_rebuilt_from_log(tmp_path: Path) -> None:
    async def go() -> None:
        store = await open_store(tmp_path, CFG)
        for i in range(40):
            store.append("a" if i % 3 else "b/with:odd chars", b"m%d" % i)
        before = {n: q.cq.entries(0) for n, q in store.queues.items()}
        await store.close()
        for d in (tmp_path / "consumequeue").iterdir():
            for f in d.iterdir():
                if f.name.isdigit():
                    f.unlink()
        (tmp_path / "checkpoint").unlink()
        store = await open_store(tmp_path, CFG)
        assert {n: q.cq.entries(0) for n, q in store.queues.items()} == before
        assert store.recovery_report.redispatched == 40
        await store.close()

    asyncio.run(go())


def test_out_of_order_acks_survive_restart(tmp_path: Path) -> None:
    p = Progress(tmp_path / "progress")
    p.ack([3, 1, 0])
    p.ack([7, 5])
    p.mark_delivered(9)
    p.write_delivered()
    assert (p.watermark, p.acked) == (2, {3, 5, 7})
    p.close()
    q = Progress(tmp_path / "progress")
    assert (q.watermark, q.acked, q.delivered) == (2, {3, 5, 7}, 10)
    q.ack([2, 4])
    q.close()
    # a torn last record is ignored, the ones before it count
    with open(tmp_path / "progress", "ab") as f:
        f.write(b"\x00\x00\x00\x10\x12")
    r = Progress(tmp_path / "progress")
    assert (r.watermark, r.acked) == (6, {7})
    r.ack([6])
    r.close()
    assert Progress(tmp_path / "progress").watermark == 8


def test_progress_compaction_keeps_state(tmp_path: Path) -> None:
    p = Progress(tmp_path / "progress")
    for i in range(0, 40_000, 2):
        p.ack([i + 1])
        p.ack([i])
    p.ack([100_000])
    snap = p.compact_begin()
    p.ack([40_000])  # arrives while the snapshot is being written
    (tmp_path / "progress.tmp").write_bytes(snap)
    p.compact_finish()
    assert (tmp_path / "progress").stat().st_size < 200
    p.close()
    q = Progress(tmp_path / "progress")
    assert (q.watermark, q.acked) == (40_001, {100_000})


def test_retention_deletes_only_fully_acked_segments(tmp_path: Path) -> None:
    async def go() -> None:
        store = await open_store(tmp_path, CFG)
        placed = [store.append("a", b"x" * 200) for _ in range(60)]
        placed_b = store.append("b", b"y")
        await store.flush()
        await store.write_checkpoint()
        assert store.apply_retention() == []  # nothing acked yet ("b" pins its segment too)
        store.ack("a", list(range(30)))
        store.ack("b", [placed_b[2]])
        deleted = store.apply_retention()
        first_needed = placed[30][0]
        assert deleted and all(s + 4096 <= first_needed for s in deleted)
        assert store.log.starts[0] <= first_needed
        store.ack("a", list(range(30, 60)))
        store.append("a", b"z")
        await store.flush()
        await store.write_checkpoint()
        store.apply_retention()
        assert store.log.starts == [store.log.starts[-1]]  # only the active segment is kept
        await store.close()
        store = await open_store(tmp_path, CFG)
        q = store.queues["a"]
        assert [i for i, *_ in q.unacked()] == [60]
        await store.close()

    asyncio.run(go())


def test_group_commit_batches_fsyncs(tmp_path: Path) -> None:
    async def go() -> None:
        store = await open_store(tmp_path, {**CFG, "segment_bytes": 1 << 20})
        n = 200
        ends = []
        for i in range(n):
            off, size, _ = store.append("q", b"m%d" % i)
            ends.append(off + size)
        order: list[tuple[int, int]] = []

        async def wait(end: int) -> None:
            await store.wait_durable(end)
            # when a publisher wakes, the fsync covering its record has completed
            order.append((end, store.log.flushed))

        await asyncio.gather(*(wait(e) for e in ends))
        assert len(order) == n and all(flushed >= end for end, flushed in order)
        assert 1 <= store.stats["log_fsyncs"] <= 3, store.stats
        await store.close()

    asyncio.run(go())


def test_sync_flush_timeout_raises_store_error(tmp_path: Path) -> None:
    async def go() -> None:
        store = await open_store(tmp_path, {**CFG, "flush_timeout_ms": 50})
        off, size, _ = store.append("q", b"m")
        await store._flush_lock.acquire()  # a disk that does not come back
        with pytest.raises(StoreError, match="flush timeout"):
            await store.wait_durable(off + size)
        store._flush_lock.release()
        await store.close()

    asyncio.run(go())


def test_queue_delete_is_not_resurrected_by_crash_recovery(tmp_path: Path) -> None:
    async def go() -> None:
        store = await open_store(tmp_path, CFG)
        for _ in range(5):
            store.append("q", b"old")
        await store.flush()
        await store.write_checkpoint()
        store.delete_queue("q")
        assert not (tmp_path / "consumequeue" / "q-q").exists()
        store.append("q", b"new")  # the same name declared again
        store.ack("q", [])
        await store.flush()
        store.abandon()  # crash: abort marker stays, checkpoint is before the delete
        store = await open_store(tmp_path, CFG)
        assert not store.recovery_report.clean
        entries = store.queues["q"].unacked()
        assert len(entries) == 1
        got = store.read(entries[0][1], entries[0][2])
        assert got is not None and got.payload == b"new"
        await store.close()

    asyncio.run(go())


def test_store_config_errors_are_one_line(tmp_path: Path) -> None:
    from broker_impl.store import StoreConfigError

    for table, text in (
        ({"flush_interval_ms": 0}, "flush_interval_ms = 0"),
        ({"segment_bytes": 10}, "at least 4096"),
    ):
        with pytest.raises(StoreConfigError, match=text) as e:
            asyncio.run(open_store(tmp_path, table))
        assert "\n" not in str(e.value)
    shutil.rmtree(tmp_path)
    assert not os.path.exists(tmp_path)
