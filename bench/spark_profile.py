"""Profile of a warm in-process session's Spark check of a stored run, action by action.

  python bench/spark_profile.py RUN_DIR [RUN_DIR ...] [--checks 3] [--warm-ups 6] [--out FILE.json]
                                [--tree CHECKOUT] [--conf KEY=VALUE,KEY=VALUE ...]

A session is started and warmed as a run warms it during its workload (the warm-up checks of
``_warmup``), then ``check_spark`` checks the run ``--checks`` times. Every Spark action of the
checks (``collect``, ``count``, ``first``, ``localCheckpoint``) is timed from Python, and Spark's
own status store (the JVM's, in process) gives each action's jobs, stages and tasks with their
times: what is planning before the first job (analysis, optimisation, code generation), what is
the jobs' running, and the tasks' own run time. The progress lines' phases are timed as well.
The load average is recorded before and after.

With several run directories, check i reads run i modulo their number: copies of one history
with its times shifted (so its fault windows' literals differ) show the first check of a new
history, which compiles the code that a repeated check of the same one finds cached. ``--conf``:
session settings per check (cycled), e.g. to compare two settings within one session.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.facts import load_average  # noqa: E402 - importable once the repository is on the path


class Actions:
    """Each action's wall time from Python, and the jobs Spark ran for it."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.log: list[dict[str, Any]] = []
        self.sc = spark.sparkContext
        self.store = self.sc._jsc.sc().statusStore()

    def wrap(self) -> None:
        from pyspark.sql.classic.dataframe import DataFrame

        for name in ("collect", "count", "first", "localCheckpoint"):
            orig = getattr(DataFrame, name)

            def timed(df: Any, *a: Any, _orig: Any = orig, _name: str = name, **kw: Any) -> Any:
                before = set(self.sc.statusTracker().getJobIdsForGroup(None))
                t0 = time.time()
                out = _orig(df, *a, **kw)
                t1 = time.time()
                after = set(self.sc.statusTracker().getJobIdsForGroup(None))
                self.log.append({"action": _name, "t0": t0, "t1": t1, "jobs": sorted(after - before)})
                return out

            setattr(DataFrame, name, timed)

    def jobs(self, ids: list[int]) -> list[dict[str, Any]]:
        out = []
        for i in ids:
            j = self.store.job(i)
            stages = []
            seq = j.stageIds()  # a Scala Seq
            for s in (seq.apply(k) for k in range(seq.size())):
                info = self.store.lastStageAttempt(s)
                sub = info.submissionTime()
                done = info.completionTime()
                stages.append(
                    {
                        "stage": int(s),
                        "tasks": int(info.numTasks()),
                        "status": str(info.status()),
                        "submitted": sub.get().getTime() / 1000 if sub.isDefined() else None,
                        "completed": done.get().getTime() / 1000 if done.isDefined() else None,
                        "run_ms": int(info.executorRunTime()),
                        "cpu_ms": int(info.executorCpuTime()) // 1_000_000,
                        "name": str(info.name()),
                    }
                )
            sub, done = j.submissionTime(), j.completionTime()
            out.append(
                {
                    "job": i,
                    "submitted": sub.get().getTime() / 1000 if sub.isDefined() else None,
                    "completed": done.get().getTime() / 1000 if done.isDefined() else None,
                    "stages": stages,
                    "skipped_stages": int(j.numSkippedStages()),
                    "tasks": int(j.numTasks()),
                    "skipped_tasks": int(j.numSkippedTasks()),
                }
            )
        return out


def summarize(actions: Actions, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for e in entries:
        jobs = actions.jobs(e["jobs"])
        run = [s for j in jobs for s in j["stages"] if s["status"] != "SKIPPED"]
        first = min((j["submitted"] for j in jobs if j["submitted"]), default=None)
        last = max((j["completed"] for j in jobs if j["completed"]), default=None)
        rows.append(
            {
                "action": e["action"],
                "wall_s": round(e["t1"] - e["t0"], 3),
                "before_first_job_s": round(first - e["t0"], 3) if first else None,
                "jobs_s": round(last - first, 3) if first and last else None,
                "after_last_job_s": round(e["t1"] - last, 3) if last else None,
                "jobs": len(jobs),
                "stages": len(run),
                "skipped_stages": sum(j["skipped_stages"] for j in jobs),
                "tasks": sum(s["tasks"] for s in run),
                "task_run_s": round(sum(s["run_ms"] for s in run) / 1000, 3),
                "task_cpu_s": round(sum(s["cpu_ms"] for s in run) / 1000, 3),
                "stage_detail": [
                    {k: s[k] for k in ("stage", "tasks", "run_ms", "name")}
                    | {"s": round(s["completed"] - s["submitted"], 3) if s["completed"] else None}
                    for s in run
                ],
            }
        )
    return rows


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dirs", type=Path, nargs="+")
    ap.add_argument("--checks", type=int, default=3)
    ap.add_argument("--warm-ups", type=int, default=6)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--conf", nargs="*", default=[""], help="per check, cycled: KEY=VALUE[,KEY=VALUE]")
    ap.add_argument("--results", type=Path, help="write each check's results here as CHECK.json")
    ap.add_argument("--tree", type=Path, help="check with the code of this checkout (default: this one)")
    return ap.parse_args()


def main() -> int:
    args = _args()
    if args.tree:
        sys.path.insert(0, str(args.tree.resolve()))

    import spark_reports.progress as _progress
    from spark_reports.engines.spark.check import check_spark
    from spark_reports.service.session import spark_session
    from spark_reports.service.warmup import warm_up

    out: dict[str, Any] = {
        "run_dirs": [str(d) for d in args.run_dirs],
        "code": _progress.__file__,
        "load_before": load_average(),
    }
    t0 = time.monotonic()
    spark = spark_session("local[*]")
    out["session_s"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    with _progress.quiet():
        warm_up(lambda d, s, big: check_spark(d, s, spark_master="local[*]"), times=args.warm_ups)
    out["warm_up_s"] = round(time.monotonic() - t0, 1)
    out["load_after_warm_up"] = load_average()
    actions = Actions(spark)
    actions.wrap()
    out["checks"] = [one_check(i, args, spark, actions) for i in range(args.checks)]
    out["load_after"] = load_average()
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


def one_check(i: int, args: argparse.Namespace, spark: Any, actions: Actions) -> dict[str, Any]:
    """Check i of the profile, timed by phase and by action, with its jobs, stages and tasks."""
    import spark_reports.engines.spark.check as sp
    import spark_reports.progress as _progress
    from spark_reports.engines.spark.check import check_spark

    run_dir = args.run_dirs[i % len(args.run_dirs)]
    scenario = json.loads((run_dir / "scenario.json").read_text())
    conf = args.conf[i % len(args.conf)]
    for kv in filter(None, conf.split(",")):
        key, value = kv.split("=", 1)
        spark.conf.set(key, value)
    phases: list[tuple[str, float]] = []
    actions.log.clear()
    orig_progress = _progress.progress

    def progress(engine: str, stage: str, **numbers: Any) -> None:
        phases.append((stage, time.monotonic()))

    sp.progress = progress
    t0 = time.monotonic()
    phases.append(("start", t0))
    try:
        results = check_spark(run_dir, scenario, spark_master="local[*]")
    finally:
        sp.progress = orig_progress
    wall = time.monotonic() - t0
    if args.results:
        args.results.mkdir(parents=True, exist_ok=True)
        text = json.dumps(results, sort_keys=True, indent=1, default=str)
        (args.results / f"{i + 1}-{run_dir.name}.json").write_text(text + "\n")
    steps = [(b[0], round(b[1] - a[1], 3)) for a, b in zip(phases, phases[1:], strict=False)]
    try:
        rows = summarize(actions, list(actions.log))
    except Exception as e:  # noqa: BLE001 - keep the timings of a check whose job details failed
        rows = [{"error": repr(e)}]
        print(f"job details: {e!r}", file=sys.stderr)
    _print_check(i, run_dir, conf, wall, steps, rows)
    return {
        "check": i + 1,
        "run_dir": str(run_dir),
        "conf": conf,
        "wall_s": round(wall, 3),
        "phases": steps,
        "actions": rows,
        "stages": sum(r.get("stages", 0) for r in rows),
        "tasks": sum(r.get("tasks", 0) for r in rows),
        "lost": results["counts"]["lost"],
        "load": load_average(),
    }


def _print_check(
    i: int, run_dir: Path, conf: str, wall: float, steps: list[tuple[str, float]], rows: list[dict[str, Any]]
) -> None:
    print(
        f"check {i + 1} {run_dir.name} {conf}: {wall:.2f} s  {steps}  load {load_average()}", file=sys.stderr
    )
    for r in rows:
        if "error" in r:
            continue
        print(
            f"  {r['action']:16} wall {r['wall_s']:6.2f}  before jobs {r['before_first_job_s']}  "
            f"jobs {r['jobs_s']}  after {r['after_last_job_s']}  jobs={r['jobs']} stages={r['stages']} "
            f"(skipped {r['skipped_stages']}) tasks={r['tasks']} task_run={r['task_run_s']} "
            f"task_cpu={r['task_cpu_s']}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    raise SystemExit(main())
