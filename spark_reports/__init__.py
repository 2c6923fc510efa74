"""Reconciliation, attribution, grading and reports over stored histories.

Two engines return the same results schema (``schema.Results``): ``check_spark``
scales to hundreds of millions of operations, ``check_python`` is the small
reference it is cross-checked against.
"""

from __future__ import annotations

from harness.spec.results import SCHEMA_VERSION, Grade, Results
from spark_reports.engines.common import HistoryError, ScenarioError
from spark_reports.engines.grade import (
    clopper_pearson_interval,
    clopper_pearson_upper,
    describe_grade,
    grade_runs,
)
from spark_reports.engines.python import check_python
from spark_reports.engines.spark.check import check_spark
from spark_reports.reports.report import render_grade_report, render_report
from spark_reports.service.session import spark_session, stop_session

__all__ = [
    "SCHEMA_VERSION",
    "Grade",
    "HistoryError",
    "Results",
    "ScenarioError",
    "check_python",
    "check_spark",
    "clopper_pearson_interval",
    "clopper_pearson_upper",
    "describe_grade",
    "grade_runs",
    "render_grade_report",
    "render_report",
    "spark_session",
    "stop_session",
]
