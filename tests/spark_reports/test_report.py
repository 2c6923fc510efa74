from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from spark_reports import check_python, grade_runs, render_grade_report, render_report
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


def test_grade_report(tmp_path: Path) -> None:
    d = _run_dir(tmp_path)
    g = grade_runs([d], engine="python")
    page = render_grade_report(tmp_path / "grade", g)
    text = page.read_text()
    assert html.escape(g["statement"]) in text and "resamples whole runs" in text
    assert (tmp_path / "grade" / "plots" / "grade.png").is_file()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium for a headless render")
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    d = _run_dir(tmp_path)
    page = render_report(d, check_python(d, {}))
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1200,1600", page.as_uri()], check=True, timeout=120, capture_output=True)
    pixels = mpimg.imread(shot)
    assert pixels.shape[0] == 1600 and pixels.shape[1] == 1200
    # The verdict banner is red for LOST: some pixels near (198, 40, 40).
    red = (abs(pixels[..., 0] - 198 / 255) < 0.05) & (pixels[..., 1] < 0.25) & (pixels[..., 2] < 0.25)
    assert red.sum() > 1000
