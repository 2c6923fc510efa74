"""Crash and corruption: a real process killed mid-stream, and damaged log tails."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker_impl.store import open_store
from broker_impl.store.commitlog import seg_name
from broker_impl.store.store import CHECKPOINT, RecoveryReport

WRITER = Path(__file__).with_name("crash_writer.py")
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_sigkill_loses_no_confirmed_append(tmp_path: Path, flush: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(tmp_path), flush], stdout=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None
    confirmed = []
    for line in proc.stdout:
        confirmed.append(line.decode().split())
        if len(confirmed) >= 1500:
            break
    proc.send_signal(signal.SIGKILL)
    # lines already printed (in the pipe) were confirmed too
    rest = proc.stdout.read()
    proc.wait()
    confirmed += [ln.split() for ln in rest.decode().splitlines() if len(ln.split()) == 3]
    assert (tmp_path / "abort").exists()

    async def check() -> None:
        store = await open_store(tmp_path, {"flush": flush, "segment_bytes": 64 * 1024})
        assert not store.recovery_report.clean
        for offset, size, head in confirmed:
            got = store.read(int(offset), int(size))
            assert got is not None, (offset, store.recovery_report)
            assert got.payload.startswith(head.encode())
        await store.close()

    asyncio.run(check())
    assert len(list((tmp_path / "commitlog").iterdir())) > 1  # the run crossed segments


CFG = {"segment_bytes": 4096, "checkpoint_interval_ms": 60_000}


def _fill(tmp_path: Path, n: int = 40) -> list[tuple[int, int]]:
    async def go() -> list[tuple[int, int]]:
        store = await open_store(tmp_path, CFG)
        placed = [store.append("q", b"body-%03d" % i + b"-" * 60)[:2] for i in range(n)]
        await store.flush()
        store.abandon()  # crash before any checkpoint: recovery scans from the start
        return placed

    return asyncio.run(go())


def _reopen(tmp_path: Path) -> tuple[list[bytes], RecoveryReport]:
    async def go() -> tuple[list[bytes], RecoveryReport]:
        store = await open_store(tmp_path, CFG)
        q = store.queues["q"]
        bodies = []
        for _i, off, size in q.unacked():
            got = store.read(off, size)
            assert got is not None
            bodies.append(got.payload[:8])
        report = store.recovery_report
        # the store keeps working after the cut: a new append lands where the tail was
        off, size, index = store.append("q", b"after")
        assert index == len(bodies) and off == report.log_end
        await store.close()
        return bodies, report

    return asyncio.run(go())


def _segment_file(tmp_path: Path, offset: int) -> tuple[Path, int]:
    start = offset - offset % 4096
    return tmp_path / "commitlog" / seg_name(start), offset - start


def _flip(path: Path, at: int, mask: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ mask]))


def _expect_prefix(tmp_path: Path, keep: int, reason: str, cut_at: int) -> None:
    bodies, report = _reopen(tmp_path)
    assert bodies == [b"body-%03d" % i for i in range(keep)]
    assert len(report.cuts) == 1 and report.cuts[0].offset == cut_at, report
    assert reason in report.cuts[0].reason and report.cuts[0].bytes > 0


def test_truncated_last_record(tmp_path: Path) -> None:
    placed = _fill(tmp_path)
    off, size = placed[-1]
    path, pos = _segment_file(tmp_path, off)
    os.truncate(path, pos + size // 2)
    _expect_prefix(tmp_path, len(placed) - 1, "truncated", off)


def test_zero_filled_tail(tmp_path: Path) -> None:
    placed = _fill(tmp_path)
    off, _ = placed[-3]
    path, pos = _segment_file(tmp_path, off)
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(b"\0" * (4096 - pos))
    _expect_prefix(tmp_path, len(placed) - 3, "zero-filled", off)


def test_bit_flip_in_last_record_body(tmp_path: Path) -> None:
    placed = _fill(tmp_path)
    off, size = placed[-1]
    path, pos = _segment_file(tmp_path, off)
    _flip(path, pos + size - 10, 0x04)
    _expect_prefix(tmp_path, len(placed) - 1, "crc mismatch", off)


def test_bit_flip_in_middle_record_drops_later_segments(tmp_path: Path) -> None:
    placed = _fill(tmp_path)
    k = 5
    off, _ = placed[k]
    path, pos = _segment_file(tmp_path, off)
    assert len(list((tmp_path / "commitlog").iterdir())) > 1
    _flip(path, pos + 30, 0x80)
    _expect_prefix(tmp_path, k, "crc mismatch", off)
    assert [p.name for p in (tmp_path / "commitlog").iterdir()] == [seg_name(0)]


@pytest.mark.parametrize("keep", [0, 7, 19])
def test_a_short_checkpoint_says_so_and_the_whole_log_is_scanned(
    tmp_path: Path, keep: int, caplog: pytest.LogCaptureFixture
) -> None:
    async def clean_close() -> None:
        store = await open_store(tmp_path, CFG)
        for i in range(40):
            store.append("q", b"body-%03d" % i + b"-" * 60)
        await store.close()  # a clean shutdown writes the checkpoint at the log end

    asyncio.run(clean_close())
    ckpt = tmp_path / CHECKPOINT
    ckpt.write_bytes(ckpt.read_bytes()[:keep])
    with caplog.at_level("WARNING", logger="broker_impl.store"):
        bodies, report = _reopen(tmp_path)
    assert bodies == [b"body-%03d" % i for i in range(40)]
    assert report.scanned_from == 0
    assert f"checkpoint is corrupt ({keep} of 20 bytes)" in caplog.text
