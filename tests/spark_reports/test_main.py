from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from spark_reports.__main__ import main
from spark_reports.synth import HistoryBuilder


def test_cli_writes_results_and_report_and_exits_1_on_loss(tmp_path: Path) -> None:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.drain()
    b.write(tmp_path / "run")
    assert main([str(tmp_path / "run"), "--engine", "python"]) == 1
    assert json.loads((tmp_path / "run" / "results.json").read_text())["verdict"] == "LOST"
    assert (tmp_path / "run" / "report.html").is_file()
    assert main([str(tmp_path / "run"), "--engine", "python", "--grade", str(tmp_path / "g")]) == 1
    assert json.loads((tmp_path / "g" / "grade.json").read_text())["lost"] == 1


def test_cli_missing_history_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "spark_reports", str(tmp_path), "--engine", "python"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: no history.parquet or history.jsonl in {tmp_path}: pass a run directory "
        "(store/<scenario>/<timestamp>)"
    ]


def test_spark_masters_spark_can_start_with_pass_and_others_say_what_to_give() -> None:
    import pytest

    from spark_reports.service.session import check_master

    for ok in (
        None,
        "local",
        "local[*]",
        "local[2]",
        "spark://127.0.0.1:7077",
        "yarn",
        "k8s://https://h:6443",
    ):
        check_master(ok)
    for bad in ("bogus://x", "127.0.0.1:7077", "", "spark:/h"):
        with pytest.raises(ValueError, match="spark://HOST:PORT"):
            check_master(bad)
