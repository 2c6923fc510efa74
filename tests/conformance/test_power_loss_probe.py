"""``validate``'s power-loss probe judges by whether the broker ever held unsynced data under its
data directory, not by the instant of the cut: a broker that fsyncs every write may hold nothing
unsynced then (ActiveMQ with ``journalDiskSyncs``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from faults.lazyfs.model import LazyState
from harness.conformance import FAIL, PASS, lazyfs_held_data


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
