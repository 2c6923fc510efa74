"""Disk fault kinds end to end without Docker: real node inits over lazyfs, rules added through nodectl."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from faults.disk import DiskError, DiskFull, FsyncLie, SlowFsync
from harness.errors import ScenarioError
from harness.spec import FaultContext
from tests.factories import reference_scenario
from tests.faults.local_nodes import LocalCluster
from tests.faults.test_nodeinit import Init, wait_for

N3 = ["n1", "n2", "n3"]


def test_resolve_is_concrete_and_checked() -> None:
    p = DiskError.resolve({}, N3, random.Random(2))
    assert len(p["nodes"]) == 1 and p["files"] == "*" and p["ops"] == ["write", "fsync"]
    assert DiskError.resolve(p, N3, random.Random(9)) == p
    assert DiskError.resolve({"ops": ["fsync", "read"]}, N3, random.Random(2))["ops"] == ["read", "fsync"]
    assert DiskFull.resolve({"nodes": "all"}, N3, random.Random(1)) == {
        "nodes": N3,
        "files": "*",
        "after_bytes": 0,
        "df": True,
    }
    assert SlowFsync.resolve({"delay_ms": 50}, N3, random.Random(1))["delay_ms"] == 50.0
    assert FsyncLie.resolve({"nodes": ["n2"], "files": "store/*"}, N3, random.Random(1)) == {
        "nodes": ["n2"],
        "files": "store/*",
    }
    for cls, bad, match in (
        (DiskError, {"ops": ["chmod"]}, "ops"),
        (DiskError, {"ops": []}, "ops"),
        (DiskFull, {"after_bytes": -1}, "negative"),
        (SlowFsync, {"delay_ms": 0}, "delay_ms"),
        (FsyncLie, {"delay_ms": 5}, "unknown parameter"),
    ):
        with pytest.raises(ScenarioError, match=match):
            cls.resolve(bad, N3, random.Random(1))


def test_eio_reaches_the_broker_and_the_heal_records_what_it_refused(one_init: dict[str, Init]) -> None:
    init = one_init["n1"]
    wait_for(lambda: init.log().count(b"tick") >= 3, "ticks")
    ctx = FaultContext(LocalCluster(one_init))
    fault = DiskError(ctx, {"nodes": ["n1"], "files": "log", "ops": ["write"]}, "f1")
    done = fault.apply()
    assert done["rule"] == {"id": "f1", "kind": "eio", "glob": "log", "ops": ["write"]}
    # The stand-in broker writes a tick every 10 ms: its next write fails and it dies of it.
    wait_for(lambda: init.ctl("status")["state"] == "stopped", "the broker to die of EIO")
    assert "Errno 5" in Path(init.log_file).read_text()
    healed = fault.heal()["nodes"]["n1"]
    assert healed["id"] == "f1" and healed["hits"] >= 1 and healed["paths"] == ["/log"]
    assert DiskError.heal_all(ctx) is None  # nothing left to clear


def test_lie_then_power_loss_drops_what_fsync_acknowledged(one_init: dict[str, Init]) -> None:
    init = one_init["n1"]
    wait_for(lambda: init.log().count(b"tick") >= 3, "ticks")
    ctx = FaultContext(LocalCluster(one_init))
    FsyncLie(ctx, {"nodes": ["n1"], "files": "*"}, "f2").apply()
    init.ctl("power-loss")  # the stand-in never fsyncs its ticks; only its boot record is durable
    init.ctl("start")
    wait_for(lambda: init.log().count(b"boot") == 2, "reboot")
    # The boot record of the second start was fsynced under the lie: a second cut loses it.
    init.ctl("power-loss")
    assert init.log().count(b"boot") == 1
    cleared = FsyncLie.heal_all(ctx)
    assert cleared is not None and cleared["n1"][0]["id"] == "f2" and cleared["n1"][0]["hits"] >= 1
    assert cleared["n1"][0]["unsynced_bytes_lied_about"] >= len(b"boot\n")
    init.ctl("start")


def test_sync_writes_everything_back(one_init: dict[str, Init]) -> None:
    init = one_init["n1"]
    wait_for(lambda: init.log().count(b"tick") >= 3, "ticks")
    assert init.ctl("sync")["lazyfs"]["persisted_bytes"] > 0
    init.ctl("crash")
    before = init.log()
    assert init.ctl("power-loss")["lazyfs"]["dropped_bytes"] < len(before)  # only what came after the sync
    assert before.startswith(init.log()) and init.log().count(b"tick") >= 3
    init.ctl("start")


def test_the_random_nemesis_draws_every_storage_kind_concretely() -> None:
    from faults.corrupt import CorruptFile
    from faults.power import PowerLossCoordinated
    from faults.process import Kill
    from harness.nemesis import plan

    kinds = {
        c.name: c for c in (PowerLossCoordinated, CorruptFile, DiskError, DiskFull, SlowFsync, FsyncLie, Kill)
    }
    sc = reference_scenario(
        {"random": {"faults": sorted(kinds), "every": [3, 6], "hold": [2, 5], "overlap": 2}},
        seed=4,
        duration=300,
    )
    steps = plan(sc, kinds, N3).steps
    assert {s.kind for s in steps} == set(kinds)
    for s in steps:
        # What the history records is what a replay applies: resolving it again changes nothing.
        assert kinds[s.kind].resolve(s.params, N3, random.Random(0)) == s.params, s
