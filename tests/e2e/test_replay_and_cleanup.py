"""Replay repeats a recorded fault schedule exactly; a harness killed mid-fault leaves
nothing that ``brokerchaos down`` does not remove (no proxies, toxics or FUSE mounts
survive their containers)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import labelled, start_cli

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def nemesis_actions(run_dir: Path) -> list[tuple[str, str]]:
    """(fault kind, concrete parameters) of every fault a run applied, in order."""
    out = []
    for line in (run_dir / "history.jsonl").read_text().splitlines():
        op = json.loads(line)
        if op["process"] == "nemesis" and op["type"] == "invoke" and op["f"] != "heal":
            value = json.loads(op["value"])
            out.append((value["kind"], json.dumps(value["params"], sort_keys=True)))
    return out


def test_same_seed_same_schedule_and_replay_applies_the_same_actions(brokerchaos) -> None:
    first = brokerchaos("run", "scenarios/crash.yaml", "--duration", "14", "--checker", "python")
    assert first.code == 0, first.explain()
    original = nemesis_actions(first.run_dir)
    assert [k for k, _ in original] == ["kill"], original  # the step at 18 s is past the shortened run

    replay = brokerchaos("run", "scenarios/crash.yaml", "--replay", str(first.run_dir), "--checker", "python")
    assert replay.code == 0, replay.explain()
    assert replay.run_dir != first.run_dir
    assert nemesis_actions(replay.run_dir) == original
    planned = json.loads((first.run_dir / "scenario.json").read_text())["plan"]
    replanned = json.loads((replay.run_dir / "scenario.json").read_text())["plan"]
    assert [(p["kind"], p["params"]) for p in replanned] == [(p["kind"], p["params"]) for p in planned[:1]]


def test_harness_killed_mid_fault_then_down_removes_everything(tmp_path: Path) -> None:
    # --checker python: the run never gets to a check, so no Spark JVM is started only to be killed.
    proc = start_cli(
        tmp_path / "store",
        *("run", "scenarios/power-loss.yaml", "--duration", "60", "--checker", "python"),
        stdout=subprocess.DEVNULL,
    )
    run_id = None
    seen: list[str] = []
    reached_fault = False
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        m = re.search(r"network (bc-[0-9a-f]+)", line)
        if m:
            run_id = m.group(1)
        if "nemesis" in line and "power-loss" in line:
            reached_fault = True
            break  # the broker is down, its lazy filesystem holds a dropped cache
    assert run_id is not None and reached_fault, "the run ended before its first fault:\n" + "".join(
        seen[-20:]
    )
    proc.send_signal(signal.SIGKILL)  # no teardown at all
    proc.wait(timeout=30)
    left = labelled(run_id)
    assert left["containers"] and left["volumes"], "a killed harness leaves its cluster behind"
    down = subprocess.run(
        ["brokerchaos", "down", "--run", run_id], capture_output=True, text=True, timeout=120
    )
    assert down.returncode == 0, down.stderr
    assert labelled(run_id) == {"containers": [], "networks": [], "volumes": []}
    mounts = Path("/proc/mounts").read_text()
    assert "lazyfs" not in mounts and run_id not in mounts
