"""`brokerchaos grade`: several stored runs pooled into one loss rate with a 95% bound."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from spark_reports.synth import HistoryBuilder, write_history


def _run(root: Path, name: str, lost: int) -> Path:
    d = root / name
    d.mkdir(parents=True)
    h = HistoryBuilder()
    for i in range(1, 21):
        h.publish(f"p1:{i}", "ok")
    for i in range(1 + lost, 21):
        h.consume(f"p1:{i}")
    h.drain(consumed=20 - lost)
    write_history(d, h.rows)
    (d / "scenario.json").write_text(json.dumps({"scenario": {"name": name, "checkers": ["python"]}}))
    return d


def _grade(*dirs: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["brokerchaos", "grade", *map(str, dirs), "--engine", "python", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)


def test_grade_pools_runs_and_fails_on_any_loss(tmp_path: Path) -> None:
    r = _grade(_run(tmp_path, "a", 0), _run(tmp_path, "b", 2), out=tmp_path / "g")
    assert r.returncode == 1, r.stderr
    assert "LOST: 2 lost in 40 confirmed over 2 runs" in r.stdout
    assert (tmp_path / "g" / "grade.json").exists() and (tmp_path / "g" / "grade.html").exists()


def test_grade_of_durable_runs_reads_as_a_bound(tmp_path: Path) -> None:
    r = _grade(_run(tmp_path, "a", 0), _run(tmp_path, "b", 0), out=tmp_path / "g")
    assert r.returncode == 0, r.stderr
    assert "0 lost in 40 confirmed" in r.stdout and "95% upper bound" in r.stdout
