from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spark_reports import Results, check_python, grade_runs, render_grade_report, render_report
from spark_reports.synth import HistoryBuilder


def _run_dir(tmp_path: Path) -> Path:
    b = HistoryBuilder(step_ns=20_000_000)
    for i in range(1, 60):
        b.publish(f"p1:{i}", "ok" if i % 7 else "info", node=f"n{i % 3 + 1}")
        if i == 15:
            b.fault("f1", "partition", node="n2")
        if i == 35:
            b.heal("f1")
        if i > 2 and i != 20:
            b.consume(f"p1:{i - 2}")
    b.drain()
    return b.write(tmp_path / "run", jsonl=False)


def test_run_report_is_self_contained(tmp_path: Path) -> None:
    d = _run_dir(tmp_path)
    results = check_python(d, {})
    assert results["verdict"] == "LOST"
    page = render_report(d, results)
    assert page == d / "report.html"
    assert (d / "plots" / "timeline.png").stat().st_size > 5000
    assert (d / "plots" / "latency.png").stat().st_size > 5000
    text = page.read_text()
    assert "LOST" in text and "p1:18" in text and "partition" in text
    assert len(re.findall(r"src='data:image/png;base64,", text)) == 2
    assert not re.search(r"(src|href)=['\"]https?:", text)


def _every_class(tmp_path: Path) -> tuple[Path, Results]:
    """One run with a message of every class the results name."""
    b = HistoryBuilder(step_ns=20_000_000, seed=3, message_size=120)
    for i in range(1, 9):
        b.publish(f"p1:{i}")
    b.deliver("p1:2")
    b.abandon("p1:2", "crash")
    b.consume("p1:3", ack=None)
    b.consume("p1:4", ack="info")
    bad = bytearray(b.body("p1:5"))
    bad[30:34] = b"<&>X"
    b.consume("p1:5", body=bytes(bad))
    b.deliver("p1:6")
    b.abandon("p1:6", "requeue")
    b.consume("p1:6", consumer="c2", node="n2")
    b.consume("p1:7")
    b.consume("p1:7", consumer="c2", node="n3", redelivered=True)
    b.drain_invoke()
    t0 = b.t
    b.consume("p1:8", consumer="d1", node="n3")
    b.drain_done(
        consumed=1,
        nodes={
            "n1": {"consumed": 0, "ready": 0, "unacked": 0, "empty_at_ns": t0 + 1, "error": None},
            "n3": {"consumed": 1, "ready": 0, "unacked": 0, "empty_at_ns": b.t + 1, "error": None},
        },
    )
    d = b.write(tmp_path / "every", jsonl=False)
    return d, check_python(d, {"seed": 3, "workload": {"message_size": 120}, "budgets": {"duplicated": 5}})


def test_report_shows_every_class_and_each_lost_cause(tmp_path: Path) -> None:
    d, results = _every_class(tmp_path)
    c = results["counts"]
    assert (
        c["lost"],
        c["ack_unknown"],
        c["corrupted"],
        c["resurrected"],
        c["split_brain"],
        c["unflagged_redeliveries"],
    ) == (3, 1, 1, 1, 1, 1)
    text = render_report(d, results).read_text()
    for heading in (
        "Lost messages (3)",
        "Acked with an unknown outcome",
        "Corrupted bodies",
        "Resurrected",
        "Split-brain copies",
        "Redeliveries without the redelivered flag",
        "Delivered more than once",
        "Final drain",
    ):
        assert f"<h2>{heading}" in text, heading
    for cause in (
        "<td class='l'>p1:1</td><td class='l'>never delivered</td>",
        "<td class='l'>p1:2</td><td class='l'>abandoned delivery never redelivered (crash)</td>",
        "<td class='l'>p1:3</td><td class='l'>delivered, never acked</td>",
    ):
        assert cause in text
    # The corrupted characters are escaped and marked; the sent body is shown beside them.
    assert "<span class='diff'>&lt;&amp;&gt;X</span>" in text
    assert html.escape(results["corrupted"][0]["expected"]) in text
    assert "budgets: duplicated &le; 5" in text and "schema-2 history" in text


def test_report_labels_unreachable_messages_unreachable(tmp_path: Path) -> None:
    """A drain that did not complete: 0 lost, 2 unreachable. The report's attribution, exposure and
    listing say unreachable, never lost (they said 2 lost)."""
    b = HistoryBuilder(step_ns=20_000_000)
    b.publish("p1:1", node="n1")
    b.fault("f1", "power-loss", node="n2")
    b.publish("p1:2", node="n2")
    b.publish("p1:3", node="n2")
    b.heal("f1")
    b.consume("p1:1")
    b.drain(complete=False)
    d = b.write(tmp_path / "run", jsonl=False)
    results = check_python(d, {})
    assert (results["counts"]["lost"], results["counts"]["unreachable"]) == (0, 2)
    text = render_report(d, results).read_text()
    attribution = text[text.index("<h2>Loss attribution") : text.index("<h2>Fault windows")]
    assert "<th class='l'>class</th>" in attribution and "<td class='l'>unreachable</td>" in attribution
    assert "<th>unreachable</th>" in attribution
    assert "<h2>Unreachable messages (2)</h2>" in text and "Lost messages" not in text


def test_report_of_a_run_whose_checkers_all_failed(tmp_path: Path) -> None:
    failed: Any = {"verdict": "unknown", "error": "ValueError: column missing"}  # what check_run combines
    page = render_report(tmp_path, failed)
    assert "ValueError: column missing" in page.read_text()


def test_grade_report(tmp_path: Path) -> None:
    d = _run_dir(tmp_path)
    g = grade_runs([d], engine="python")
    page = render_grade_report(tmp_path / "grade", g)
    text = page.read_text()
    assert html.escape(g["statement"]) in text and "resamples whole runs" in text
    assert (tmp_path / "grade" / "plots" / "grade.png").is_file()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium for a headless render")
@pytest.mark.parametrize("make", ["_run_dir", "_every_class"])
def test_report_renders_in_headless_chromium(tmp_path: Path, make: str) -> None:
    import matplotlib.image as mpimg

    if make == "_run_dir":
        d = _run_dir(tmp_path)
        results = check_python(d, {})
    else:
        d, results = _every_class(tmp_path)
    page = render_report(d, results)
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={shot}",
            "--window-size=1200,1600",
            page.as_uri(),
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    pixels = mpimg.imread(shot)
    assert pixels.shape[0] == 1600 and pixels.shape[1] == 1200
    # The verdict banner is red for LOST: some pixels near (198, 40, 40).
    red = (abs(pixels[..., 0] - 198 / 255) < 0.05) & (pixels[..., 1] < 0.25) & (pixels[..., 2] < 0.25)
    assert red.sum() > 1000


def test_a_queue_that_never_came_back_has_its_recovery_table_and_windows_in_the_report(
    tmp_path: Path,
) -> None:
    b = HistoryBuilder(step_ns=50_000_000)
    for i in range(1, 300):
        b.publish(f"p1:{i}", "ok" if i < 110 else "info")
        if i < 90:
            b.consume(f"p1:{i}", node="n2")
        if i == 90:
            b.fault("f1", "partition", node="n1")
        if i == 120:
            b.heal("f1")
    b.drain(outcome="info", nodes={"n1": {"error": "queue depth: timed out"}})
    run = b.write(tmp_path / "run", jsonl=False)
    r = check_python(run, {"budgets": {"recovery_s": 30}})
    assert r["verdict"] == "UNAVAILABLE" and r["counts"]["unreachable"] > 0 and r["counts"]["lost"] == 0
    assert "(and" not in r["reason"]  # the step over its budget is the queue that never came back: said once
    page = html.unescape(render_report(run, r).read_text())
    assert "Liveness: did it come back?" in page
    assert (
        "queue q never recovered: no publish or consume ok since" in page
        and "n1: queue depth: timed out" in page
    )
    row = re.search(r"<tr><td class='l'>f1</td>.*?</tr>", page)
    assert row is not None and ">NO<" in row.group(0) and "30 (over)" in row.group(0)
    assert "no (never came back)" in page
