"""The reports as a brokerchaos plugin: a run's HTML page, and the grade's over many runs."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pluggy

from harness.spec.rundir import GRADE_JSON
from spark_reports.service.session import target

hookimpl = pluggy.HookimplMarker("brokerchaos")

_plotting: threading.Thread | None = None


@hookimpl
def brokerchaos_phase(run: Any, phase: str, status: str, detail: dict[str, Any]) -> None:
    """Once the workload (and its drain) is done, the report's plotting library is imported beside
    the check and the teardown (``_import_plotting``): not during the workload, where its CPU would
    be taken from the brokers under test."""
    global _plotting
    if (phase, status) == ("workload", "done"):
        _plotting = threading.Thread(target=_import_plotting, name="report-imports", daemon=True)
        _plotting.start()


def _import_plotting() -> None:
    """matplotlib, which only the report renders with, imported ahead: the report is the last step
    of a run, after the check, and at a load of 20 on 2 cores this import alone took 7-19 s of
    wall time (about 1 s of CPU). A report that starts meanwhile waits for the import under way
    (Python's import lock), and one that fails here fails again, with its error, in the report."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception:  # noqa: BLE001 - reported by the report's own import
        pass


@hookimpl
def brokerchaos_render_report(run_dir: Path, results: dict[str, Any]) -> str | None:
    from spark_reports.reports.report import render_report

    return str(render_report(run_dir, results))  # type: ignore[arg-type]  # a checker's Results, as a dict


@hookimpl
def brokerchaos_grade(run_dirs: list[Path], engine: str, out: Path) -> dict[str, Any]:
    from spark_reports.engines.grade import describe_grade, grade_runs
    from spark_reports.reports.report import render_grade_report

    grade = grade_runs(run_dirs, spark_master=target(), engine=engine)
    (out / GRADE_JSON).write_text(json.dumps(grade, indent=2, sort_keys=True, default=str))
    return {
        "verdict": grade.get("verdict"),
        "lines": describe_grade(grade),
        "report": str(render_grade_report(out, grade)),
        "grade": grade,
    }
