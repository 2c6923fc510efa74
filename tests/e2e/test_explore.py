"""``brokerchaos explore`` on real runs, with a tiny budget: a search keeps its first schedule,
and a later search continues the same corpus with a mutant of it. A search whose first run loses
confirmed messages is test_explore_failure.py's: a file of its own, so that the two searches run
at once on the two test workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.scenario import load

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def test_a_search_keeps_its_first_schedule_and_a_later_one_continues(brokerchaos, tmp_path: Path) -> None:
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
