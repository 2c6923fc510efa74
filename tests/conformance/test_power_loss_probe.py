"""``validate``'s power-loss probe judges by whether the broker ever held unsynced data under its
data directory, not by the instant of the cut: a broker that fsyncs every write may hold nothing
unsynced then (ActiveMQ with ``journalDiskSyncs``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from faults.lazyfs.model import LazyState
from harness.conformance import FAIL, PASS, lazyfs_held_data, recovery_check


def op_with(lazyfs: dict[str, Any]) -> dict[str, Any]:
    return {"value": json.dumps({"done": {"nodectl": {"lazyfs": {"ok": True, **lazyfs}}}})}


def test_a_broker_that_synced_everything_by_the_cut_passes() -> None:
    check = lazyfs_held_data("power-loss", op_with({"dropped_bytes": 0, "written_bytes": 81920}), "/data")
    assert check.status == PASS and "wrote 81920 bytes under /data" in check.detail


def test_dropped_bytes_pass_and_nothing_written_fails_with_the_data_dir_advice() -> None:
    dropped = op_with(
        {"dropped_bytes": 594, "dropped_data": [{"path": "/kahadb/db-1.log"}], "written_bytes": 9000}
    )
    assert lazyfs_held_data("power-loss", dropped, "/data").status == PASS
    nothing = lazyfs_held_data("power-loss", op_with({"dropped_bytes": 0, "written_bytes": 0}), "/data")
    assert nothing.status == FAIL and "outside data_dir" in nothing.hint


def test_the_lazy_filesystem_counts_what_was_written_through_it_across_syncs_and_cuts(tmp_path: Path) -> None:
    state = LazyState(str(tmp_path))
    try:
        fh = state.create("/journal", 0o644, os.getuid(), os.getgid())
        state.write(fh, b"x" * 100, 0)
        state.fsync(None, fh)
        state.fsync("/", None)
        state.write(fh, b"y" * 20, 100)
        state.fsync(None, fh)
        state.release(fh)
        report = state.crash()
        assert report["dropped_bytes"] == 0 and report["written_bytes"] == 120
    finally:
        state.close()


def test_a_queue_the_cluster_lost_whole_is_no_recovery_though_its_drain_completed() -> None:
    """A drain that completed because every node said the queue does not exist (``gone``) lost
    what it did not read, but the broker did not come back with the queue: the probe fails,
    where a drain that found the queue empty passes."""
    op = {"process": "d1", "queue": "chaos-1", "outcome": "ok", "gone": {"n1": "no such stream"}}
    gone = {"drain": {"completed": True, "ops": [op]}, "counts": {"lost": 3}}
    check = recovery_check("power-loss: recovers", "power-loss", gone, 0, may_lose=True, run_dir="run")
    assert check.status == FAIL and "found the queue gone" in check.detail
    empty = {"drain": {"completed": True, "ops": [{**op, "gone": {}}]}, "counts": {"lost": 3}}
    check = recovery_check("power-loss: recovers", "power-loss", empty, 9, may_lose=True, run_dir="run")
    assert check.status == PASS and "3 confirmed lost" in check.detail
    unfinished = {"drain": {"completed": False, "ops": [{**op, "outcome": "info", "gone": {}}]}}
    check = recovery_check("power-loss: recovers", "power-loss", unfinished, 0, may_lose=True, run_dir="run")
    assert check.status == FAIL and "did not complete" in check.detail
