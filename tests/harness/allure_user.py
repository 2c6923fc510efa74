"""A user's pytest run with ``--alluredir`` whose one test reports a stored run's results through
the Allure plugin, as a chaos suite would: the Allure result it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

USER_TEST = """
import json
from pathlib import Path

from harness.allure_report import AllureReporter


class Dir:
    path = Path({run!r})


class Run:
    dir = Dir()


def test_stored_run():
    results = json.loads((Dir.path / "results.json").read_text())
    AllureReporter().brokerchaos_run_finished(Run(), results)
"""


def user_pytest(
    *args: str, cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """pytest run in a process of its own over a user's test files, as a user's CI runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def allure_result(tmp_path: Path, run: Path) -> tuple[dict[str, Any], Path]:
    """The one Allure result of reporting ``run/results.json``, and the results directory."""
    (tmp_path / "test_user.py").write_text(USER_TEST.format(run=str(run)))
    out = tmp_path / "allure-results"
    p = user_pytest(
        f"--alluredir={out}", "test_user.py", cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert p.returncode == 0, p.stdout + p.stderr
    [result] = [json.loads(f.read_text()) for f in out.glob("*-result.json")]
    return result, out
