"""`brokerchaos grade`: several stored runs graded together; a run is one trial, and one run gives no bound."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from spark_reports.synth import HistoryBuilder, write_history


def _run(root: Path, name: str, lost: int, *, drained: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    h = HistoryBuilder()
    for i in range(1, 21):
        h.publish(f"p1:{i}", "ok")
    for i in range(1 + lost, 21):
        h.consume(f"p1:{i}")
    h.drain(consumed=20 - lost, complete=drained)
    write_history(d, h.rows)
    (d / "scenario.json").write_text(
        json.dumps({"scenario": {"name": name, "checkers": ["python"]}, "seed": 1})
    )
    return d


def _grade(*dirs: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["brokerchaos", "grade", *map(str, dirs), "--engine", "python", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_grade_pools_runs_and_fails_on_any_loss(tmp_path: Path) -> None:
    r = _grade(_run(tmp_path, "a", 0), _run(tmp_path, "b", 2), out=tmp_path / "g")
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert "grade over 2 runs: LOST" in lines
    assert (
        "  1 of 2 runs lost messages: the share of runs that lose messages is between 1.3% and 98.7% "
        "(95% two-sided exact binomial interval over runs)"
    ) in lines
    assert "  verdicts: 1 durable, 1 LOST" in lines
    assert (
        "  messages: 2 lost of 40 confirmed over the 2 runs with a known outcome (pooled rate 0.05 per "
        "confirmed message)" in lines
    )
    assert any("bootstrap percentile interval, resampling whole runs, B=10,000, seed 0" in ln for ln in lines)
    grade = json.loads((tmp_path / "g" / "grade.json").read_text())
    assert (grade["runs_lost"], grade["graded_runs"], grade["lost"]) == (1, 2, 2)
    assert (tmp_path / "g" / "grade.html").exists()


def test_grade_of_durable_runs_is_a_one_sided_bound_over_runs(tmp_path: Path) -> None:
    r = _grade(*(_run(tmp_path, name, 0) for name in "abc"), out=tmp_path / "g")
    assert r.returncode == 0, r.stderr
    assert (
        "0 of 3 runs lost a message: the share of runs that lose messages is below 63.2% "
        "(95% one-sided exact binomial upper bound over runs; not a proof of zero)"
    ) in r.stdout
    assert "no run lost a message, so resampling runs gives no interval above zero" in r.stdout


def test_one_run_gives_counts_and_asks_for_more_runs(tmp_path: Path) -> None:
    r = _grade(_run(tmp_path, "a", 0), out=tmp_path / "g")
    assert r.returncode == 0, r.stderr
    assert "0 of 20 confirmed messages lost in the one run with a known outcome; no bound" in r.stdout
    assert "a bound needs several seeded runs" in r.stdout
    assert "upper bound" not in r.stdout and "interval" not in r.stdout


def test_an_unfinished_drain_is_left_out_and_said_so(tmp_path: Path) -> None:
    r = _grade(
        _run(tmp_path, "a", 0),
        _run(tmp_path, "b", 0),
        _run(tmp_path, "c", 3, drained=False),
        out=tmp_path / "g",
    )
    assert r.returncode == 3, r.stderr
    assert "grade over 3 runs: unknown" in r.stdout and "verdicts: 2 durable, 1 unknown" in r.stdout
    assert "0 of 2 runs lost a message" in r.stdout
    assert "1 run left out of every rate" in r.stdout
