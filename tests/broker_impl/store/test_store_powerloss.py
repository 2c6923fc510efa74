"""Ack-log compaction under power loss, on the project's lazy filesystem (FUSE, unsynced writes dropped).

``Progress.compact_finish`` swaps a snapshot of the acked indexes in for the ack
log. If the snapshot were renamed over the log before its bytes were fsync'ed, or
the rename not made durable while the old log's records were relied on, a power
loss would bring acked messages back (or lose the whole ack log). The acks a
checkpoint made durable must stay acked wherever the power goes.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from broker_impl.store import durable, open_store, progress
from faults.lazyfs import LazyMount, fuse_available

REASON = fuse_available()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"needs FUSE: {REASON}")]

CFG = {"flush": "sync", "checkpoint_interval_ms": 600_000, "segment_bytes": 64 * 1024}
N = 200


class PowerCut(BaseException):
    """The machine is off: nothing after the cut runs (a BaseException, so no ``except OSError`` sees it)."""


def _run_until_compaction(lazy: LazyMount, monkeypatch: pytest.MonkeyPatch, crash_at: str | None) -> None:
    """Ack every message one by one, checkpoint (which compacts), and cut the power at ``crash_at``."""
    monkeypatch.setattr(progress, "COMPACT_BYTES", 1024)
    data = Path(lazy.mountpoint) / "store"
    crashed: list[dict[str, Any]] = []

    def crash(where: str) -> None:
        if where == crash_at and not crashed:
            crashed.append(lazy.command("crash"))
            raise PowerCut(where)

    real_replace, real_fsync_dir = os.replace, durable.fsync_dir

    def replace(src, dst):
        crash("before-rename")
        real_replace(src, dst)
        crash("after-rename")

    def fsync_dir(path):
        real_fsync_dir(path)
        crash("after-dir-fsync")

    async def go() -> None:
        store = await open_store(data, CFG)
        placed = [store.append("q", b"m%04d" % i) for i in range(N)]
        await store.wait_durable(placed[-1][0] + placed[-1][1])
        await store.write_checkpoint()
        for _, _, index in placed:
            store.ack("q", [index])
        assert store.queues["q"].progress.wants_compaction()
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(durable, "fsync_dir", fsync_dir)
        try:
            await store.write_checkpoint()  # fsyncs the ack log first: every ack is durable from here on
            assert not store.queues["q"].progress.wants_compaction(), "the checkpoint did not compact"
            crash("end")
        except PowerCut:
            pass
        finally:
            monkeypatch.undo()
            store.abandon()

    asyncio.run(go())
    assert crashed, f"the power never went at {crash_at}"
    assert crashed[0]["ok"]

    async def reopen() -> None:
        store = await open_store(data, CFG)
        assert store.queues["q"].unacked() == [], f"acked messages came back (power cut {crash_at})"
        await store.close()

    asyncio.run(reopen())


@pytest.mark.parametrize("crash_at", ["before-rename", "after-rename", "after-dir-fsync", "end"])
def test_compaction_keeps_checkpointed_acks_through_a_power_cut(
    lazy: LazyMount, monkeypatch: pytest.MonkeyPatch, crash_at: str
) -> None:
    _run_until_compaction(lazy, monkeypatch, crash_at)


@pytest.mark.parametrize("how", ["durable", "plain"])
def test_a_removed_segment_and_queue_stay_removed_after_a_power_cut(lazy: LazyMount, how: str) -> None:
    """Under the strict model a removal is a name change: only the store's helpers fsync the directory."""
    m = Path(lazy.mountpoint)
    (m / "log").mkdir()
    (m / "log" / "00000000000000000000").write_bytes(b"old segment")
    (m / "cq" / "chaos-1").mkdir(parents=True)
    (m / "cq" / "chaos-1" / "meta").write_bytes(b"{}")
    assert lazy.command("flush")["ok"]
    if how == "durable":
        durable.remove(m / "log" / "00000000000000000000")
        durable.remove_tree(m / "cq" / "chaos-1")
    else:
        os.unlink(m / "log" / "00000000000000000000")
        (m / "cq" / "chaos-1" / "meta").unlink()
        (m / "cq" / "chaos-1").rmdir()
    assert lazy.command("crash")["ok"]
    left = sorted(str(p.relative_to(m)) for p in m.rglob("*"))
    if how == "durable":
        assert left == ["cq", "log"]
    else:
        assert left == ["cq", "cq/chaos-1", "cq/chaos-1/meta", "log", "log/00000000000000000000"]
