"""The checking engines as a brokerchaos plugin: the checkers they register, and the JVM they want
warm before a run's check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pluggy

from spark_reports.engines.atomicity import check_atomicity_python, check_atomicity_spark
from spark_reports.engines.delay import check_delay_python, check_delay_spark
from spark_reports.engines.python import check_python
from spark_reports.engines.spark.check import check_spark, start_session_in_background
from spark_reports.engines.stream import check_stream_python
from spark_reports.service.session import spark_session, target

hookimpl = pluggy.HookimplMarker("brokerchaos")

SPARK_CHECKERS = frozenset({"spark", "delay-spark", "atomicity-spark"})
"""The checkers that run on Spark: a run with any of them starts the JVM early."""


def _spark(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    return dict(check_spark(run_dir, scenario, spark_master=target()))


def _delay_spark(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    return check_delay_spark(run_dir, scenario, spark=spark_session(target()))


def _atomicity_spark(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    return check_atomicity_spark(run_dir, scenario, spark=spark_session(target()))


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
    if SPARK_CHECKERS & set(getattr(run, "checkers", ())):
        start_session_in_background(target())
