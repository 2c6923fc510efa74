"""``bench.explore_new_share``: a search's runs recounted from the stored runs, in the order they ran."""

from __future__ import annotations

import json
from pathlib import Path

from bench.explore_new_share import main, new_cells, new_counts, new_pairs, run_dirs
from harness.explore_cells import stored_run_cells

NS = 1_000_000_000


def stored(root: Path, name: str, share: float, lost: bool = False) -> Path:
    """A stored run: n1 isolated from 1 to 11 s, ``share`` of the publishes inside it confirmed."""
    d = root / name
    d.mkdir(parents=True)
    scenario = {"workload": {"consumers": 0}, "broker": {"nodes": 3}}
    (d / "scenario.json").write_text(json.dumps({"scenario": scenario}))
    window = {
        "fault_id": "f1",
        "kind": "partition",
        "start_ns": NS,
        "end_ns": 11 * NS,
        "applied": True,
        "healed": True,
        "params": {"params": {"shape": "isolate", "groups": [["n1"], ["n2", "n3"]]}},
    }
    results = {
        "verdict": "LOST" if lost else "durable",
        "faults": [window],
        "availability": [{"window": "f1", "share": share}],
        "attribution": {"messages": [{"id": "p1:1", "fault_ids": ["f1"]}] if lost else []},
    }
    (d / "results.json").write_text(json.dumps(results))
    return d


def test_runs_are_recounted_in_the_order_the_search_ran_them(tmp_path: Path) -> None:
    runs = [stored(tmp_path, "c", 1.0), stored(tmp_path, "a", 0.5), stored(tmp_path, "b", 0.7, lost=True)]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "corpus.json").write_text(json.dumps({"runs": [{"run_dir": str(d)} for d in runs]}))
    assert run_dirs(corpus) == runs
    assert run_dirs(tmp_path) == sorted(runs)  # a directory of runs: in name order
    counts = new_counts([stored_run_cells(d) for d in runs])
    assert counts[0] > 0 and counts[1] == 0  # only how much was served differs: nothing new
    assert counts[2] > 0  # messages lost in the window: new


def test_show_names_what_made_each_new_run_new(tmp_path: Path, capsys) -> None:
    """``--show``: under the table, each new run's first-reached (fault, event) pairs, once each
    (not once per workload feature), with the mutation that made it."""
    runs = [stored(tmp_path, "a", 1.0), stored(tmp_path, "b", 0.5), stored(tmp_path, "c", 0.7, lost=True)]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    hows = ["the scenario's schedule", "e1: hold f1 10s->5s", "e1: shift f1 1s->2s"]
    (corpus / "corpus.json").write_text(
        json.dumps({"runs": [{"run_dir": str(d), "how": h} for d, h in zip(runs, hows, strict=True)]})
    )
    firsts = new_cells([stored_run_cells(d) for d in runs])
    assert not firsts[1] and "partition@one/clients | lost" in new_pairs(firsts[2])
    assert main([str(corpus), "--show"]) == 0
    out = capsys.readouterr().out
    assert "run 2 (" not in out  # not new: not listed
    line = next(x for x in out.splitlines() if " run 3 (e1: shift f1 1s->2s): " in x)
    assert "partition@one/clients | lost" in line and line.count("partition@one/clients | lost") == 1
