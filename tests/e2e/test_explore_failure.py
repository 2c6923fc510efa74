"""``brokerchaos explore`` on a real run, with a tiny budget: a search whose first run loses
confirmed messages stops there with the failing schedule written as a scenario, and hands that
run to shrink. (A search that keeps and continues is test_explore.py's.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.scenario import load

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def test_a_search_stops_at_the_first_failure_and_hands_it_to_shrink(brokerchaos, tmp_path: Path) -> None:
    lossy = tmp_path / "lossy"
    found = brokerchaos(
        "explore",
        "scenarios/power-loss-async.yaml",
        "--duration",
        "12",
        "--checker",
        "python",
        "--corpus",
        str(lossy),
        "--runs",
        "3",
        "--shrink-budget",
        "0.001",  # the hand-over only: shrink starts from the failing run and its time is spent at once
    )
    assert found.code == 1, found.explain()
    assert "failure    LOST at run 1" in found.proc.stdout, found.explain()
    state = json.loads((lossy / "corpus.json").read_text())
    assert len(state["runs"]) == 1 and state["failure"]["verdict"] == "LOST"
    failure = load(lossy / "failure.yaml")
    assert [s.fault for s in failure.nemesis.schedule] == ["power-loss"]
    assert failure.broker.settings["flush"] == "async"
    shrink = json.loads((lossy / "shrink" / "shrink.json").read_text())
    assert shrink["source"] == state["failure"]["run_dir"] and shrink["loss_class"] == "LOST"
    assert shrink["finished"] == "budget" and load(lossy / "shrink" / "shrunk.yaml").nemesis.schedule
