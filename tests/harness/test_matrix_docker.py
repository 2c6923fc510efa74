"""`brokerchaos matrix` end to end on Docker: a two-by-two matrix of the reference broker (flush
sync and async, a kill and a pause of its one node), interrupted and resumed, rerun with nothing
changed (nothing runs), then with a seed added (only that seed's cells are planned)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.polling import until

pytestmark = [pytest.mark.docker, pytest.mark.chaos, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, seeds: list[int]) -> None:
    step = {"at": 2, "hold": 1, "params": {"node": "n1"}}
    path.write_text(
        yaml.safe_dump(
            {
                "name": "two-by-two",
                "seeds": seeds,
                "nodes": 1,
                "workload": {"producers": 1, "consumers": 1, "rate": 50, "duration": 5, "drain_timeout": 60},
                "checkers": ["python"],
                "fault_classes": {
                    "killed": {"description": "kill", "schedule": [{**step, "fault": "kill"}], "settle": 1},
                    "paused": {"description": "pause", "schedule": [{**step, "fault": "pause"}], "settle": 1},
                },
                "faults": ["killed", "paused"],
                "configurations": [
                    {"id": "sync", "broker": "reference", "settings": {"flush": "sync"}},
                    {"id": "async", "broker": "reference", "settings": {"flush": "async"}},
                ],
                "page": "page.md",
            }
        )
    )


def _cmd(matrix: Path, store: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "harness.cli",
        "matrix",
        str(matrix),
        "--store",
        str(store),
        "--jobs",
        "1",
        *extra,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _records(results: Path) -> dict[str, str]:
    return {str(p.relative_to(results)): p.read_text() for p in sorted(results.glob("*/seed-*.json"))}


def _matrix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, env=_env(), cwd=REPO)


def test_a_two_by_two_matrix_resumes_reruns_nothing_and_adds_a_seed(tmp_path: Path) -> None:
    matrix, store, results = tmp_path / "m.yaml", tmp_path / "store", tmp_path / "results" / "two-by-two"
    _write(matrix, [1])

    # Interrupted once the first cell-seed is recorded: what is recorded stays, the rest is not.
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(_cmd(matrix, store), stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=REPO)
    until(
        lambda: _records(results),
        "the first cell-seed's record",
        every=0.5,
        gone=lambda: None if first.poll() is None else f"the matrix exited {first.returncode}",
    )
    first.send_signal(signal.SIGINT)
    assert first.wait() == 130, (tmp_path / "first.log").read_text()
    kept = _records(results)
    assert 1 <= len(kept) < 4

    resumed = _matrix(*_cmd(matrix, store))
    assert resumed.returncode == 0, resumed.stderr
    assert f"{4 - len(kept)} cell-seed(s) to run, {len(kept)} up to date" in resumed.stderr
    after = _records(results)
    assert len(after) == 4 and all(after[k] == v for k, v in kept.items())
    page = (tmp_path / "page.md").read_text()
    assert page.count("0/1 runs lost") + page.count("1/1 runs lost") == 4

    runs = sorted(store.glob("matrix/two-by-two/runs/*/seed-*/*/2*"))
    again = _matrix(*_cmd(matrix, store))
    assert again.returncode == 0, again.stderr
    assert "0 cell-seed(s) to run, 4 up to date" in again.stderr
    assert _records(results) == after
    assert sorted(store.glob("matrix/two-by-two/runs/*/seed-*/*/2*")) == runs  # no run started

    _write(matrix, [1, 2])
    planned = _matrix(*_cmd(matrix, store, "--plan"))
    assert planned.returncode == 0, planned.stderr
    to_run = [
        ln.split("to run: ")[1].split(" (key")[0] for ln in planned.stderr.splitlines() if "to run: " in ln
    ]
    assert sorted(to_run) == sorted(
        f"{c}--{f} seed 2" for c in ("sync", "async") for f in ("killed", "paused")
    )
    one = _matrix(*_cmd(matrix, store, "--cell", "sync--killed"))
    assert one.returncode == 0, one.stderr
    assert "1 cell-seed(s) to run, 1 up to date" in one.stderr
    assert set(_records(results)) == set(after) | {"sync--killed/seed-2.json"}
