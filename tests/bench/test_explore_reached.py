"""bench.explore_reached: a run reached the restart-in-minority defect only when what was lost was
confirmed by a node after it served alone, and that node then dropped its copy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.explore_reached import main, reached, store_runs

S = 1_000_000_000


def results(
    verdict: str = "LOST", confirm_node: str = "n1", confirm_s: float = 15.0, drop: bool = True
) -> dict[str, Any]:
    events = [
        {"node": "n1", "name": "paused-minority", "time_ns": 6 * S},
        {"node": "n1", "name": "served-alone", "time_ns": 14 * S},
    ]
    if drop:
        events.append({"node": "n1", "name": "copy-dropped", "time_ns": 21 * S})
    lost = [
        {"id": "p1-7", "confirm_node": confirm_node, "confirm_ns": int(confirm_s * S), "fault_ids": ["f1"]}
    ]
    return {"verdict": verdict, "events": events, "attribution": {"messages": lost, "rows": []}}


def test_lost_confirmed_by_the_node_that_served_alone_then_dropped_its_copy() -> None:
    assert reached(results()) == "n1"


def test_other_losses_are_not_the_defect() -> None:
    assert reached(results(verdict="durable")) is None
    assert reached(results(confirm_node="n2")) is None  # lost, but confirmed through another node
    assert reached(results(confirm_s=10.0)) is None  # confirmed before n1 served alone
    assert reached(results(drop=False)) is None  # n1 never dropped its copy


def test_a_run_store_lists_its_runs_oldest_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "random"
    for name, res in (("20261129T2201", results()), ("20261129T2200", results(verdict="durable"))):
        run = store / "scenario-random" / name
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(res))
        (run / "scenario.json").write_text(json.dumps({"seed": int(name[-1]) + 400}))
    (store / "latest").symlink_to(store / "scenario-random" / "20261129T2201")
    assert [d.name for d in store_runs(store)] == ["20261129T2200", "20261129T2201"]
    assert main([str(store)]) == 0
    out = capsys.readouterr().out
    assert "20261129T2201 (seed 401): LOST" in out and "REACHED by n1" in out
    assert "runs that reached the defect: 1 of 2" in out
