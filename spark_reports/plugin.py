"""Registers both checkers, the report renderer and the grader with the brokerchaos host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pluggy

from ._python import check_python
from ._spark import check_spark, start_session_in_background
from .atomicity import check_atomicity_python, check_atomicity_spark
from .delay import check_delay_python, check_delay_spark
from .stream import check_stream_python

hookimpl = pluggy.HookimplMarker("brokerchaos")

#: What ``brokerchaos_configure`` said (``spark_master`` is the one setting read here).
settings: dict[str, Any] = {}


@hookimpl
def brokerchaos_configure(config: dict[str, Any]) -> None:
    from ._spark_session import check_master

    check_master(config.get("spark_master"))
    settings.update(config)


def _spark(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    return dict(check_spark(run_dir, scenario, spark_master=settings.get("spark_master")))


def _delay_spark(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    from ._spark_session import spark_session

    return check_delay_spark(run_dir, scenario, spark=spark_session(settings.get("spark_master")))


def _atomicity_spark(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    return check_atomicity_spark(run_dir, scenario, spark_master=settings.get("spark_master"))


@hookimpl
def brokerchaos_register_checkers(register: Any) -> None:
    register.add_checker("spark", _spark, default=True)
    register.add_checker("python", check_python)
    register.add_checker("stream", check_stream_python)
    register.add_checker("delay", check_delay_python)
    register.add_checker("delay-spark", _delay_spark)
    register.add_checker("atomicity", check_atomicity_python)
    register.add_checker("atomicity-spark", _atomicity_spark)


@hookimpl
def brokerchaos_run_started(run: Any) -> None:
    """The JVM starts while the cluster comes up and the workload runs, not after the drain."""
    if {"spark", "delay-spark", "atomicity-spark"} & set(getattr(run, "checkers", ())):
        start_session_in_background(settings.get("spark_master"))


@hookimpl
def brokerchaos_render_report(run_dir: Path, results: dict[str, Any]) -> str | None:
    from .report import render_report

    return str(render_report(run_dir, results))  # type: ignore[arg-type]  # a checker's Results, as a dict


@hookimpl
def brokerchaos_grade(run_dirs: list[Path], engine: str, out: Path) -> dict[str, Any]:
    from . import describe_grade, grade_runs, render_grade_report

    grade = grade_runs(run_dirs, spark_master=settings.get("spark_master"), engine=engine)
    (out / "grade.json").write_text(json.dumps(grade, indent=2, sort_keys=True, default=str))
    return {
        "verdict": grade.get("verdict"),
        "lines": describe_grade(grade),
        "report": str(render_grade_report(out, grade)),
        "grade": grade,
    }
