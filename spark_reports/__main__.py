"""Re-check stored runs without the harness.

  python -m spark_reports RUN_DIR [--engine spark|python] [--spark-master URL] [--driver-memory 2g]
  python -m spark_reports --grade OUT_DIR RUN_DIR RUN_DIR ...

Writes results.json and report.html (with plots/) into each run directory, or
grade.json and grade.html into OUT_DIR. Exits 1 when a run is not durable, 2 on a
usage error (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.spec.rundir import GRADE_JSON, RESULTS_JSON, SCENARIO_JSON
from spark_reports.engines.common import HistoryError, ScenarioError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m spark_reports", description="Reconcile stored brokerchaos runs."
    )
    ap.add_argument("run_dirs", nargs="+", type=Path)
    ap.add_argument("--engine", choices=["spark", "python"], default="spark")
    ap.add_argument("--spark-master", default=None, help="default local[*]")
    ap.add_argument("--driver-memory", default=None, help="spark.driver.memory, default 1g")
    ap.add_argument("--grade", type=Path, metavar="OUT_DIR", help="grade the runs together into OUT_DIR")
    args = ap.parse_args(argv)
    from spark_reports import check_python, check_spark, grade_runs, render_grade_report, render_report

    try:
        if args.grade:
            grade = grade_runs(args.run_dirs, spark_master=args.spark_master, engine=args.engine)
            args.grade.mkdir(parents=True, exist_ok=True)
            (args.grade / GRADE_JSON).write_text(json.dumps(grade, indent=1))
            print(f"{grade['verdict']}: {grade['statement']}\n{render_grade_report(args.grade, grade)}")
            return 0 if grade["verdict"] == "durable" else 1
        worst = 0
        for d in args.run_dirs:
            scenario_file = d / SCENARIO_JSON
            scenario = json.loads(scenario_file.read_text()) if scenario_file.is_file() else {}
            if args.engine == "spark":
                res = check_spark(
                    d, scenario, spark_master=args.spark_master, driver_memory=args.driver_memory
                )
            else:
                res = check_python(d, scenario)
            (d / RESULTS_JSON).write_text(json.dumps(res, indent=1))
            print(f"{d}: {res['verdict']}: {res['reason']}\n{render_report(d, res)}")
            worst = max(worst, 0 if res["verdict"] == "durable" else 1)
        return worst
    except (HistoryError, ScenarioError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
