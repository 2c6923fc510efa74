"""Benchmark: the Spark reconciliation against the pure-Python checker and a DuckDB yardstick
(the core reconciliation query only) on the same histories, in the same run.

Usage:
  python bench/spark_bench.py --sizes 1M,10M [--python-max 10M] [--driver-memory 1g]
                              [--data /tmp/brokerchaos-bench] [--results bench/results]

For each size it generates a history (bench/spark_gen.py, reused if present), then
runs each engine in its own subprocess so peak memory is that engine's alone: the
parent samples the resident memory of the child's whole process tree (Python plus,
for Spark, the JVM) every 0.2 s. Wall time includes the JVM's start and the warm-up check
a run does while its workload goes; the child also reports the check alone. Both engines get the generated run's scenario.json (seed
and message size, so bodies are verified). The load average is recorded before and after
each engine: other work shares this machine. Results: bench/results/spark_<size>.json,
with whether each engine found exactly what the generator planted, one line each
in bench/results/spark_summary.md, with the command that produced them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.cpu_probe import tree_cpu  # noqa: E402 - CPU seconds of a process and its descendants


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1_000, "M": 1_000_000, "G": 1_000_000_000}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "KMG" else s) * mult)


def tree_rss(pid: int) -> int:
    """Resident bytes of pid and all its descendants."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def measure(cmd: list[str], log: Path) -> tuple[float, int, int, str]:
    start = time.monotonic()
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.2)
        out = proc.stdout.read() if proc.stdout else ""
    return time.monotonic() - start, peak, proc.returncode, out


DUCKDB_CORE = """
WITH h AS (SELECT * FROM read_parquet('{path}') WHERE process <> 'nemesis' AND value IS NOT NULL),
p AS (SELECT value AS id, max(CASE WHEN type = 'ok' THEN 1 ELSE 0 END) AS confirmed
      FROM h WHERE f = 'publish' GROUP BY value),
a AS (SELECT value AS id, count(*) AS acked FROM h WHERE f = 'ack' AND type = 'ok' GROUP BY value)
SELECT count(*) FILTER (WHERE p.confirmed = 1) AS confirmed,
       count(*) FILTER (WHERE p.confirmed = 1 AND coalesce(a.acked, 0) = 0) AS unconsumed,
       count(*) FILTER (WHERE a.acked > 1) AS duplicated,
       count(*) FILTER (WHERE p.id IS NULL) AS unexpected
FROM p FULL OUTER JOIN a ON p.id = a.id
"""
"""The core reconciliation only (group by id, full outer join, counts): what one machine's
plain-SQL engine does in the time; the checkers do much more (pairing, attribution, lists,
latency percentiles, order, bodies, availability)."""


def one_duckdb(run_dir: Path) -> None:
    import duckdb

    t = time.monotonic()
    row = duckdb.connect().execute(DUCKDB_CORE.format(path=run_dir / "history.parquet")).fetchone()
    assert row is not None
    counts = dict(zip(("confirmed", "unconsumed", "duplicated", "unexpected"), map(int, row), strict=True))
    print(json.dumps({"check_s": round(time.monotonic() - t, 2), "counts": counts}))


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def one(engine: str, run_dir: Path, driver_memory: str) -> None:
    """Child side: run one engine, print a JSON summary on stdout."""
    if engine == "duckdb":
        one_duckdb(run_dir)
        return
    import spark_reports

    scenario_file = run_dir / "scenario.json"
    scenario = json.loads(scenario_file.read_text()) if scenario_file.is_file() else {}
    t0 = time.monotonic()
    session_s = 0.0
    if engine == "spark":
        from spark_reports.engines.spark.check import start_session_in_background
        from spark_reports.service import warmup

        # As a run does while its workload goes: start the JVM and check the tiny warm-up history.
        # A run's warm-up yields the cores to the brokers under test (nice 19); here there are none,
        # and on a loaded machine a nice-19 warm-up waited for here would take most of the time.
        warmup.WARM_UP_NICE = os.getpriority(os.PRIO_PROCESS, 0)
        start_session_in_background(None, driver_memory).join()
        session_s = time.monotonic() - t0
        t1, cpu1 = time.monotonic(), tree_cpu(os.getpid())
        res = spark_reports.check_spark(run_dir, scenario, driver_memory=driver_memory)
        jvm_heap = spark_reports.spark_session()._jvm.java.lang.Runtime.getRuntime().maxMemory()
    else:
        t1, cpu1 = time.monotonic(), tree_cpu(os.getpid())
        res = spark_reports.check_python(run_dir, scenario)
        jvm_heap = None
    check_s = time.monotonic() - t1
    check_cpu_s = tree_cpu(os.getpid()) - cpu1
    (run_dir / f"results.{engine}.json").write_text(json.dumps(res))
    planted = json.loads((run_dir / "generated.json").read_text()).get("planted") or {}
    counts: dict = dict(res["counts"])
    found = {k: counts.get(k) for k in planted}
    print(
        json.dumps(
            {
                "session_s": round(session_s, 1),
                "check_s": round(check_s, 1),
                "check_cpu_s": round(check_cpu_s, 1),
                "jvm_max_heap": jvm_heap,
                "verdict": res["verdict"],
                "counts": res["counts"],
                "planted_found": found == planted,
                "notes": res["notes"],
            }
        )
    )


def _comparable(res: dict) -> dict:
    return {k: v for k, v in res.items() if k != "engine"}


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1M,10M")
    ap.add_argument("--python-max", default="10M", help="largest size the pure-Python checker is run on")
    ap.add_argument("--driver-memory", default="1g")
    ap.add_argument("--data", type=Path, default=Path("/tmp/brokerchaos-bench"))
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--one", choices=["spark", "python", "duckdb"], help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = _args()
    if args.one:
        one(args.one, args.run_dir, args.driver_memory)
        return
    command = "python bench/spark_bench.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    args.results.mkdir(parents=True, exist_ok=True)
    for label in args.sizes.split(","):
        record = bench_size(label, args, command)
        (args.results / f"spark_{label}.json").write_text(json.dumps(record, indent=1) + "\n")
        _summary_line(args.results / "spark_summary.md", label, record, command)


def _history(label: str, data: Path) -> tuple[Path, float | None]:
    """The generated history of that size (generated now unless present), and seconds generating it."""
    run_dir = data / f"ops-{label}"
    if (run_dir / "history.parquet").is_file():
        return run_dir, None
    t = time.monotonic()
    subprocess.run(
        [sys.executable, str(HERE / "spark_gen.py"), "--ops", str(parse_size(label)), "--out", str(run_dir)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return run_dir, round(time.monotonic() - t, 1)


def _engines(ops: int, python_max: str) -> list[str]:
    engines = ["spark"] + (["python"] if ops <= parse_size(python_max) else [])
    try:
        import duckdb  # noqa: F401 - only to know whether the yardstick can run

        engines.append("duckdb")
    except ImportError:
        print(
            "spark_bench: duckdb not installed (pip install '.[bench]'): no plain-SQL yardstick",
            file=sys.stderr,
        )
    return engines


def bench_size(label: str, args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Each engine on the history of that size, in its own process: the size's record."""
    run_dir, gen_s = _history(label, args.data)
    record: dict = {
        "size": label,
        "ops": json.loads((run_dir / "generated.json").read_text())["ops"],
        "parquet_bytes": (run_dir / "history.parquet").stat().st_size,
        "generate_s": gen_s,
        "driver_memory": args.driver_memory,
        "cores": os.cpu_count(),
        "command": command,
    }
    engines = _engines(parse_size(label), args.python_max)
    record["loadavg_before"] = loadavg()
    for engine in engines:
        cmd = [sys.executable, __file__, "--one", engine, "--run-dir", str(run_dir)]
        cmd += ["--driver-memory", args.driver_memory]
        print(f"spark_bench: {label} {engine} ...", file=sys.stderr, flush=True)
        wall, peak, rc, out = measure(cmd, args.results / f"spark_{label}_{engine}.log")
        entry: dict[str, Any] = {"wall_s": round(wall, 1), "peak_rss_mb": round(peak / 2**20), "exit": rc}
        if rc == 0:
            entry |= json.loads(out.strip().splitlines()[-1])
        entry["loadavg_after"] = loadavg()
        record[engine] = entry
        print(
            f"spark_bench: {label} {engine} wall={wall:.1f}s peak={peak / 2**20:.0f}MB exit={rc}",
            file=sys.stderr,
            flush=True,
        )
    if "python" not in engines:
        record["python"] = {"skipped": f"not run above --python-max {args.python_max}"}
    elif record["spark"].get("exit") == 0 and record["python"].get("exit") == 0:
        a = json.loads((run_dir / "results.spark.json").read_text())
        b = json.loads((run_dir / "results.python.json").read_text())
        record["engines_agree"] = _comparable(a) == _comparable(b)
    return record


def _summary_line(summary: Path, label: str, record: dict[str, Any], command: str) -> None:
    """The size's line in spark_summary.md (its header first, if new)."""
    sp, py, dk = record["spark"], record["python"], record.get("duckdb", {})
    ratio = f"{py['check_s'] / sp['check_s']:.2g}x" if sp.get("check_s") and py.get("check_s") else "-"

    def cpu(e: dict) -> str:
        return f", {e['check_cpu_s']} CPU-s" if "check_cpu_s" in e else ""

    line = (
        f"| {label} | {record['ops']:,} | {sp.get('wall_s')} s ({sp.get('check_s')} s check{cpu(sp)}) | "
        f"{sp.get('peak_rss_mb')} MB | "
        + (
            f"{py.get('wall_s')} s ({py.get('check_s')} s check{cpu(py)}) | {py.get('peak_rss_mb')} MB | {ratio} | "
            f"{record.get('engines_agree')} |"
            if "wall_s" in py
            else f"{py.get('skipped', 'failed')} | - | - | - |"
        )
        + f" {dk.get('check_s', '-')} s | {sp.get('planted_found')} | {sp.get('verdict')} | "
        f"{record['loadavg_before']} | `{command}` |\n"
    )
    if not summary.exists():
        summary.write_text(
            "| size | ops | spark wall | spark peak RSS | python wall | python peak RSS | "
            "python/spark check | agree | duckdb core query | spark = planted | verdict | "
            "load before | command |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        )
    with summary.open("a") as fh:
        fh.write(line)


if __name__ == "__main__":
    main()
