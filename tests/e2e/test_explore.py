"""``brokerchaos explore`` on real runs, with a tiny budget: a search keeps its first schedule,
a later search continues the same corpus with a mutant of it, and a search whose first run
loses confirmed messages stops there with the failing schedule written as a scenario, and hands
that run to shrink."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.scenario import load

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def test_a_search_keeps_continues_and_stops_at_the_first_failure(brokerchaos, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    corpus = tmp_path / "corpus"
    args = (
        "explore",
        "scenarios/crash.yaml",
        "--duration",
        "12",
        "--checker",
        "python",
        "--corpus",
        str(corpus),
    )
    first = brokerchaos(*args, "--runs", "1")
    assert first.code == 0, first.explain()
    assert "explore: --runs spent; 1 run(s) in all" in first.proc.stdout, first.explain()
    state = json.loads((corpus / "corpus.json").read_text())
    assert [r["how"] for r in state["runs"]] == ["the scenario's schedule"]
    assert state["runs"][0]["verdict"] == "durable" and state["runs"][0]["new"] == len(state["cells"]) > 0
    assert [e["id"] for e in state["entries"]] == ["e1"]
    kept = load(corpus / "kept" / "e1.yaml")
    assert [(s.fault, s.at) for s in kept.nemesis.schedule] == [("kill", 8.0)]
    assert (Path(state["runs"][0]["run_dir"]) / "results.json").exists()

    again = brokerchaos(*args, "--runs", "1")
    assert again.code == 0, again.explain()
    state = json.loads((corpus / "corpus.json").read_text())
    assert [r["iteration"] for r in state["runs"]] == [1, 2]
    assert state["runs"][1]["how"].startswith("e1: ")
    assert state["runs"][1]["schedule"] != state["runs"][0]["schedule"]

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
