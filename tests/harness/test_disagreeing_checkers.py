"""A run whose checkers disagree (issue 32): the queue checker finds every message, the stream
checker finds replicas that differ after the final drain. The run is INTEGRITY everywhere a user
looks: the first line, the table under it, results.json, report.html, the exit status, a grade
and Allure, and each checker's own verdict is listed under it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spark_reports.synth import HistoryBuilder, write_history
from tests.harness.allure_user import allure_result

REPO = Path(__file__).resolve().parents[2]
Q = "chaos-1"
REPLICAS = {
    "n1": {"messages": 3, "first_seq": 1, "last_seq": 3},
    "n2": {"messages": 2, "first_seq": 1, "last_seq": 2},
    "n3": {"messages": 3, "first_seq": 1, "last_seq": 3},
}


def diverged_run(root: Path, name: str = "diverged") -> Path:
    """Three messages published, consumed and acked; the drain's replica views disagree on n2."""
    d = root / name
    d.mkdir(parents=True)
    h = HistoryBuilder()
    for i in range(1, 4):
        h.op("p1", "invoke", "publish", f"p1:{i}", queue=Q)
        h.op("p1", "ok", "publish", f"p1:{i}", queue=Q, detail={"stream_seq": i})
    for i in range(1, 4):
        h.op("c1", "invoke", "consume", None, queue=Q)
        h.op(
            "c1",
            "ok",
            "consume",
            f"p1:{i}",
            queue=Q,
            redelivered=False,
            detail={"stream_seq": i, "consumer_seq": i, "delivered": 1},
        )
        h.ack(f"p1:{i}", queue=Q)
    h.drain_invoke(queue=Q)
    h.op("d1", "ok", "drain", {"consumed": 0, "nodes": {}, "replicas": REPLICAS}, node=None, queue=Q)
    write_history(d, h.rows)
    (d / "scenario.json").write_text(
        json.dumps({"scenario": {"name": name, "checkers": ["python", "stream"]}, "seed": 5})
    )
    return d


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """This checkout's command (not an installed console script's)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "-q", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_terminal_results_report_and_exit_status_agree(tmp_path: Path) -> None:
    run = diverged_run(tmp_path)
    r = cli("analyze", str(run), cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert lines[0] == f"{run}: INTEGRITY"
    out = r.stdout
    assert "durable" not in lines[0] and "verdict                 INTEGRITY" in out
    assert "checker python" in out and "checker stream" in out
    [py] = [ln for ln in lines if "checker python" in ln]
    [st] = [ln for ln in lines if "checker stream" in ln]
    assert "durable: every one of 3 confirmed messages was consumed" in py
    assert "INTEGRITY: 1 stream(s) whose replicas disagree after the final drain" in st
    assert "diverged streams (1):" in out
    assert "n2={messages=2, first_seq=1, last_seq=2}" in out

    res = json.loads((run / "results.json").read_text())
    assert (res["verdict"], res["valid"]) == ("INTEGRITY", False)
    assert res["reason"].startswith("stream: 1 stream(s) whose replicas disagree")
    assert res["reason"].endswith("(also checked: python durable)")
    assert res["checkers"]["python"]["verdict"] == "durable"
    assert res["checkers"]["stream"]["verdict"] == "INTEGRITY"
    [diverged] = res["checkers"]["stream"]["anomalies"]["diverged_streams"]
    assert diverged == {"queue": Q, "replicas": REPLICAS}
    assert res["body_checker"] == "python" and res["counts"]["lost"] == 0

    page = (run / "report.html").read_text()
    assert "<div class='verdict INTEGRITY'>INTEGRITY" in page
    assert "<h2>Checkers</h2>" in page
    assert "<td class='l'>python</td><td class='l'><b class='v-durable'>durable</b>" in page
    assert "<td class='l'>stream</td><td class='l'><b class='v-INTEGRITY'>INTEGRITY</b>" in page
    assert "Findings of the stream checker: INTEGRITY" in page
    assert f"<tr><td class='l'>{Q}</td><td class='l'>n2</td><td>2</td><td>1</td><td>2</td></tr>" in page


def test_a_grade_keeps_the_stored_verdict_of_a_checker_it_does_not_rerun(tmp_path: Path) -> None:
    run = diverged_run(tmp_path)
    assert cli("analyze", str(run), cwd=tmp_path).returncode == 1
    r = cli("grade", str(run), "--engine", "python", "--out", str(tmp_path / "g"), cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "grade over 1 run: INTEGRITY" in r.stdout
    assert "python 1 durable; stream 1 INTEGRITY" in r.stdout
    grade = json.loads((tmp_path / "g" / "grade.json").read_text())
    [one] = grade["runs"]
    assert one["checkers"] == {"python": "durable", "stream": "INTEGRITY"}
    assert one["graded"] is True  # the loss outcome (the queue checker's) is known: 0 lost
    assert "python durable, stream INTEGRITY" in (tmp_path / "g" / "grade.html").read_text()


def test_allure_lists_each_checker_and_fails_on_the_worst(tmp_path: Path) -> None:
    run = diverged_run(tmp_path)
    assert cli("analyze", str(run), cwd=tmp_path).returncode == 1
    result, out = allure_result(tmp_path, run)
    steps: dict[str, Any] = {s["name"]: s for s in result["steps"]}
    assert steps["checker python: durable"]["status"] == "passed"
    assert steps["checker stream: INTEGRITY"]["status"] == "failed"
    params = {x["name"]: x["value"] for x in steps["checker stream: INTEGRITY"]["parameters"]}
    assert params["diverged_streams"] == "1"
    [att] = [a for a in result["attachments"] if a["name"] == "verdicts and findings"]
    text = (out / att["source"]).read_text()
    assert text.splitlines()[0].startswith("verdict: INTEGRITY  (stream: 1 stream(s) whose replicas disagree")
    assert "  checker stream  INTEGRITY: 1 stream(s) whose replicas disagree" in text
    assert "n2={first_seq=1, last_seq=2, messages=2}" in text  # results.json's keys are sorted


@pytest.mark.parametrize("checkers", [["stream"], ["stream", "python"]])
def test_the_report_reads_whichever_checkers_ran(tmp_path: Path, checkers: list[str]) -> None:
    """With the stream checker alone there is no queue body: the page still shows the verdict,
    the checker and its findings; with the stream checker first the queue result is still the body."""
    run = diverged_run(tmp_path)
    r = cli("analyze", str(run), *[a for c in checkers for a in ("--checker", c)], cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    res = json.loads((run / "results.json").read_text())
    assert res["verdict"] == "INTEGRITY"
    assert res["body_checker"] == ("python" if "python" in checkers else "stream")
    page = (run / "report.html").read_text()
    assert "Findings of the stream checker: INTEGRITY" in page
    assert "<div class='verdict INTEGRITY'>INTEGRITY" in page
