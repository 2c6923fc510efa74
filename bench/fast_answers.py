"""Where the time of a default run and of re-checking it goes, side by side in one invocation.

  python bench/fast_answers.py [--duration 60] [--out bench/results/fast_answers]

1. A default run (``scenarios/partitions.yaml``) with the Spark checker in process, as without a
   service: wall time end to end, each phase's time, the check after the drain, and the CPU the
   harness's own processes took during cluster start and workload (``bench/cpu_probe.py``: its
   Spark warm-up is in there).
2. A Spark Connect server started and warmed (``_spark_service``, state in a temporary directory,
   so no other command finds it), then the same scenario checking through it
   (``--spark-remote``), the server's CPU counted as the harness's.
3. ``brokerchaos analyze`` of run 1 in fresh processes, interleaved: the Python engine, Spark
   through the server, Spark in process; each one's wall time and whether the results agree.

The machine's load (``/proc/loadavg``) is recorded before and after every step.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cpu_probe import probed_run, tree_cpu
from bench.facts import load_average

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

COMPARED = ("verdict", "valid", "counts", "lost", "drain", "faults")


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    return round(time.monotonic() - t0, 2), proc


def cpu_between(
    marks: list[dict[str, Any]], start: tuple[str, str], stop: tuple[str, str]
) -> dict[str, float]:
    a = next(m for m in marks if (m["phase"], m["status"]) == start)
    b = next(m for m in marks if (m["phase"], m["status"]) == stop)
    wall = b["t"] - a["t"]
    cpu = b["cpu"] - a["cpu"]
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cores_used": round(cpu / wall, 2)}


def one_run(
    store: Path, duration: float, probe: Path, extra: list[str], env: dict[str, str]
) -> dict[str, Any]:
    before = load_average()
    wall, proc = cli(*probed_run(store, duration, extra), env={"BROKERCHAOS_CPU_PROBE": str(probe), **env})
    if proc.returncode not in (0, 1, 3):
        raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    run_dir = max(
        (p for p in store.iterdir() if p.is_dir() and (p / "results.json").exists()),
        key=lambda p: p.stat().st_mtime,
    )
    results = json.loads((run_dir / "results.json").read_text())
    marks = json.loads(probe.read_text())["marks"]
    after_drain = re.findall(r"checker spark: \S+ in ([\d.]+)s \(([\d.]+)s after the drain\)", proc.stderr)
    return {
        "run_dir": str(run_dir),
        "wall_s": wall,
        "verdict": results.get("verdict"),
        "ops": (results.get("counts") or {}).get("history_ops"),
        "timings": results.get("timings"),
        "check_s": float(after_drain[0][0]) if after_drain else None,
        "check_done_after_drain_s": float(after_drain[0][1]) if after_drain else None,
        "harness_cpu_cluster_start": cpu_between(marks, ("cluster", "start"), ("cluster", "done")),
        "harness_cpu_workload": cpu_between(marks, ("workload", "start"), ("workload", "done")),
        "harness_cpu_run_start_to_drain": cpu_between(marks, ("run", "start"), ("workload", "done")),
        "load_before": before,
        "load_after": load_average(),
        "extra_args": extra,
    }


def cli_cpu(*args: str, server: int | None = None) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """``cli`` with the CPU seconds it took: the command's process and its descendants (the
    in-process JVM), sampled while it runs, and the Connect server's (``server``) over the same
    time. On a loaded machine the wall time is mostly waiting for a core; the CPU is the work."""
    before = tree_cpu(server) if server else 0.0
    t0 = time.monotonic()
    with subprocess.Popen(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        cpu = 0.0
        while child.poll() is None:
            cpu = max(cpu, tree_cpu(child.pid))
            time.sleep(0.2)
        out, err = child.communicate()
    wall = round(time.monotonic() - t0, 2)
    cpu += (tree_cpu(server) - before) if server else 0.0
    return wall, round(cpu, 1), subprocess.CompletedProcess(child.args, child.returncode, out, err)


def analyze(run_dir: str, label: str, args: list[str], server: int | None = None) -> dict[str, Any]:
    before = load_average()
    wall, cpu, proc = cli_cpu("analyze", run_dir, "--json", *args, server=server)
    if proc.returncode not in (0, 1, 3):
        raise SystemExit(f"analyze {label} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout)
    return {
        "engine": label,
        "wall_s": wall,
        "cpu_s": cpu,
        "verdict": out.get("verdict"),
        "compared": {k: out.get(k) for k in COMPARED},
        "load_before": before,
        "load_after": load_average(),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def analyze_interleaved(run_dir: str, url: str, server: int | None = None) -> list[dict[str, Any]]:
    """``analyze`` of one stored run by each engine in turn, twice over, so load drifts evenly;
    ``server``: the Connect server's pid, whose CPU counts for the checks through it."""
    order = [
        ("python", ["--checker", "python"]),
        ("spark-connect", ["--checker", "spark", "--spark-remote", url]),
        ("spark-in-process", ["--checker", "spark", "--spark-master", "local[*]"]),
        ("python", ["--checker", "python"]),
        ("spark-connect", ["--checker", "spark", "--spark-remote", url]),
    ]
    out = []
    for label, a in order:
        r = analyze(run_dir, label, a, server if label == "spark-connect" else None)
        print(json.dumps({k: v for k, v in r.items() if k != "compared"}), flush=True)
        out.append(r)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "fast_answers")
    ap.add_argument(
        "--analyze-only",
        metavar="RUN_DIR",
        help="skip the two runs: start the server, then analyze this stored run (a copy: analyze rewrites it)",
    )
    args = ap.parse_args()
    from spark_reports import stop_session
    from spark_reports.engines.spark import check as _spark
    from spark_reports.service import connect as _spark_service

    out: dict[str, Any] = {
        "command": " ".join(["python", "bench/fast_answers.py", *sys.argv[1:]]),
        "cores": os.cpu_count(),
    }
    with tempfile.TemporaryDirectory(prefix="brokerchaos-fast-") as tmp:
        home = Path(tmp) / "spark-home"
        # 1. In process, as without a service (an explicit master: no server is looked for).
        if args.analyze_only:
            out["run_in_process"] = {"run_dir": args.analyze_only}
        else:
            out["run_in_process"] = one_run(
                Path(tmp) / "store1",
                args.duration,
                Path(tmp) / "probe1.json",
                ["--spark-master", "local[*]"],
                {},
            )
            print(json.dumps(out["run_in_process"], indent=1), flush=True)
        # 2. The service, started and warmed, then a run that checks through it.
        before = load_average()
        t0 = time.monotonic()
        state = _spark_service.start(free_port(), home=home)
        started = round(time.monotonic() - t0, 1)
        warm = _spark.warm_up_server(str(state["url"]))
        stop_session()  # this process's client of it: the runs are other processes
        out["service_start"] = {
            "jvm_start_s": started,
            "warm_up_s": warm,
            "load_before": before,
            "load_after": load_average(),
        }
        print(json.dumps(out["service_start"]), flush=True)
        try:
            url = str(state["url"])
            if not args.analyze_only:
                out["run_connect"] = one_run(
                    Path(tmp) / "store2",
                    args.duration,
                    Path(tmp) / "probe2.json",
                    ["--spark-remote", url],
                    {"BROKERCHAOS_CPU_PROBE_PIDS": str(state["pid"])},
                )
                print(json.dumps(out["run_connect"], indent=1), flush=True)
            # 3. analyze of run 1, interleaved.
            out["analyze"] = analyze_interleaved(out["run_in_process"]["run_dir"], url, int(state["pid"]))
        finally:
            _spark_service.stop(home=home)
    first = out["analyze"][0]["compared"]
    out["analyze_agree"] = all(r["compared"] == first for r in out["analyze"])
    for r in out["analyze"]:
        r.pop("compared")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out.with_suffix('.json')}; analyze results agree: {out['analyze_agree']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
