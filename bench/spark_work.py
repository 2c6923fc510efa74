"""The work of a Spark check in Spark's own units (jobs, stages, tasks), with the Python engine's
wall time beside it in the same process and minutes.

  python bench/spark_work.py RUN_DIR [RUN_DIR ...] [--checks 2] [--tree CHECKOUT] [--out FILE.json]

For each run directory (e.g. ``bench/spark_gen.py`` histories): the Python engine's check, then
``--checks`` in-process Spark checks in one session (no warm-up: the first check is a new history's
first, as after a drain), then the Python engine again. Jobs, stages and tasks of each Spark check
are read from Spark's status store (``bench/spark_profile.py``'s ``Actions``); they are the plan's,
not the load's, so two trees' counts compare at any load, where wall times compare only as ratios
to the Python engine measured in the same minutes. The load average is recorded at each step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.facts import load_average  # noqa: E402
from bench.spark_profile import Actions, summarize  # noqa: E402


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dirs", type=Path, nargs="+")
    ap.add_argument("--checks", type=int, default=2)
    ap.add_argument("--tree", type=Path, help="check with the code of this checkout (default: this one)")
    ap.add_argument("--out", type=Path)
    return ap.parse_args()


def _commit(tree: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()


def _python(run_dir: Path, scenario: dict) -> tuple[float, Any]:
    import spark_reports.progress as _progress
    from spark_reports.engines.python import check_python

    t0 = time.monotonic()
    with _progress.quiet():
        res = check_python(run_dir, scenario)
    return round(time.monotonic() - t0, 3), res


def _spark(run_dir: Path, scenario: dict, actions: Actions) -> tuple[dict[str, Any], Any]:
    import spark_reports.progress as _progress
    from spark_reports.engines.spark.check import check_spark

    actions.log.clear()
    t0 = time.monotonic()
    with _progress.quiet():
        res = check_spark(run_dir, scenario, spark_master="local[*]")
    wall = time.monotonic() - t0
    rows = summarize(actions, list(actions.log))
    out = {
        "wall_s": round(wall, 3),
        "actions": len(rows),
        "jobs": sum(r["jobs"] for r in rows),
        "stages": sum(r["stages"] for r in rows),
        "skipped_stages": sum(r["skipped_stages"] for r in rows),
        "tasks": sum(r["tasks"] for r in rows),
        "task_run_s": round(sum(r["task_run_s"] for r in rows), 3),
        "task_cpu_s": round(sum(r["task_cpu_s"] for r in rows), 3),
        "by_action": [{k: r[k] for k in ("action", "wall_s", "jobs", "stages", "tasks")} for r in rows],
        "load": load_average(),
    }
    return out, res


def _differ(a: dict, b: dict) -> list[str]:
    """The keys of two results whose values differ, the engine's name and timings left out."""
    keys = (set(a) | set(b)) - {"engine", "timings"}
    return sorted(
        k
        for k in keys
        if json.dumps(a.get(k), sort_keys=True, default=str)
        != json.dumps(b.get(k), sort_keys=True, default=str)
    )


def main() -> int:
    args = _args()
    tree = (args.tree or REPO).resolve()
    if args.tree:
        sys.path.insert(0, str(tree))
    from spark_reports.service.session import spark_session

    out: dict[str, Any] = {
        "tree": str(tree),
        "commit": _commit(tree),
        "load_start": load_average(),
        "runs": [],
    }
    t0 = time.monotonic()
    spark = spark_session("local[*]")
    out["session_s"] = round(time.monotonic() - t0, 1)
    actions = Actions(spark)
    actions.wrap()
    for run_dir in args.run_dirs:
        scenario = json.loads((run_dir / "scenario.json").read_text())
        one: dict[str, Any] = {"run_dir": str(run_dir), "python": [], "spark": []}
        py_s, py = _python(run_dir, scenario)
        one["python"].append({"wall_s": py_s, "load": load_average()})
        for _ in range(args.checks):
            got, res = _spark(run_dir, scenario, actions)
            got["differs_from_python"] = _differ(py, res)
            one["spark"].append(got)
            print(f"{run_dir.name}: spark {got}", file=sys.stderr)
        py_s, _py = _python(run_dir, scenario)
        one["python"].append({"wall_s": py_s, "load": load_average()})
        print(f"{run_dir.name}: python {one['python']}", file=sys.stderr)
        out["runs"].append(one)
    out["load_end"] = load_average()
    text = json.dumps(out, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
