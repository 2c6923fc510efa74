"""Where the time around a default run's workload goes, two trees side by side.

  python bench/run_overhead.py --tree A=/path/to/base --tree B=. [--repeats 3] [--duration 60]
      [--out bench/results/run_overhead]

Each repeat runs ``python3 -m harness.cli -p bench.cpu_probe run scenarios/partitions.yaml`` once
in every tree, alternating (A, B, A, B, ...), each with a store of its own in a temporary
directory. For every run: the wall time from spawning the command to its exit, the machine's
load (``/proc/loadavg``) before and after, the verdict and counts, the run's own phase times
(``results.json`` ``timings``), the phases read from its progress lines (each line carries the
seconds since the harness was imported; the bench also stamps when it read each line), and the
CPU seconds the harness's own processes took during the workload (``bench/cpu_probe.py``).

Phases from the progress lines (seconds):

- ``startup``: spawn to the first progress line (the interpreter, the imports, the plugins);
- ``containers``: the first ``cluster`` line to the last broker container started;
- ``readiness``: from there to the last node reported ready;
- ``forming``: from there to ``cluster ready``;
- ``traffic``: the workload line to the ``settling`` line (the workload's duration, the
  producers' stop and the final heal);
- ``settle``: the ``settling`` line to the first line after it (the settle and the drain's start);
- ``drain``: from the settle's end to the ``drained`` line (read off the ``drain`` line's time
  minus the settle, see ``settle_s``);
- ``check``: the ``drained`` line to the checker's verdict line; of it ``check_until_job`` (to the
  Spark job's first line: the JVM's start or a warm-up check still under way) and ``check_job``;
- ``exit``: the last progress line to the process's exit (the table, the report, the JVM's exit).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.cpu_probe import probed_run
from bench.facts import load_average

REPO = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^\[\s*([\d.]+)s\] (\S+)\s+(.*)$")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def timed_run(tree: Path, store: Path, probe: Path, duration: float, extra: list[str]) -> dict[str, Any]:
    """Spawn the run, stamp every stderr line as it arrives, return the lines and the wall time."""
    cmd = [sys.executable, "-m", "harness.cli", *probed_run(store, duration, extra)]
    env = {**os.environ, "BROKERCHAOS_CPU_PROBE": str(probe), "PYTHONPATH": str(tree)}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""))
    reader.start()
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append((time.monotonic() - t0, line.rstrip("\n")))
    rc = proc.wait()
    reader.join()
    wall = round(time.monotonic() - t0, 2)
    return {"cmd": cmd, "rc": rc, "t0": t0, "wall_s": wall, "lines": lines, "stdout": out[0]}


def phases(lines: list[tuple[float, str]], wall: float, settle: float) -> dict[str, float | None]:
    """The phases named in the module's doc, from the bench's own stamps (seconds since spawn)."""
    parsed = [(t, m.group(2), m.group(3)) for t, raw in lines if (m := LINE.match(raw))]

    def first(phase: str, text: str = "", after: float = -1.0) -> float | None:
        return next((t for t, p, msg in parsed if p == phase and text in msg and t > after), None)

    def last(phase: str, text: str = "") -> float | None:
        hits = [t for t, p, msg in parsed if p == phase and text in msg]
        return hits[-1] if hits else None

    start = parsed[0][0] if parsed else None
    cluster0 = first("cluster")
    started = last("cluster", ": starting ")
    formed = first("cluster", "ready: ")
    # the last node ready before the cluster formed (a restart's "ready" comes later)
    ready_nodes = max(
        (t for t, p, msg in parsed if p == "cluster" and msg.endswith(": ready") and t <= (formed or 0)),
        default=None,
    )
    work0 = first("workload", "producers")
    settling = first("heal", "settling")
    drained = first("drain", "drained")
    verdict = first("check", "in ")
    # the Spark checker's first line of its own job (unprefixed: it is the checker's, not the run's)
    prelude = next(
        (t for t, raw in lines if raw.startswith("spark_reports[spark]: prelude") and t > (drained or 0)),
        None,
    )
    end = parsed[-1][0] if parsed else None

    def span(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(b - a, 2)

    return {
        "startup": start,
        "containers": span(cluster0, started),
        "readiness": span(started, ready_nodes),
        "forming": span(ready_nodes, formed),
        "traffic": span(work0, settling),
        "settle_and_drain": span(settling, drained),
        "check": span(drained, verdict),
        "check_until_job": span(drained, prelude),
        "check_job": span(prelude, verdict),
        "verdict_to_last_line": span(verdict, end),
        "exit": span(end, wall),
        "settle_s": settle,
    }


def one(label: str, tree: Path, duration: float, extra: list[str], keep: Path) -> dict[str, Any]:
    """One run in ``tree``; its store (the run directory) is kept under ``keep``."""
    keep.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"{label}-", dir=keep)
    store, probe = Path(tmp) / "store", Path(tmp) / "cpu.json"
    before, up = load_average(), uptime()
    r = timed_run(tree, store, probe, duration, extra)
    after = load_average()
    if r["rc"] not in (0, 1, 3):
        tail = "\n".join(line for _t, line in r["lines"][-30:])
        raise SystemExit(f"{label}: run failed ({r['rc']}):\n{tail}")
    run_dir = next(p.parent for p in store.rglob("results.json"))
    results = json.loads((run_dir / "results.json").read_text())
    scenario = json.loads((run_dir / "scenario.json").read_text())["scenario"]
    marks = json.loads(probe.read_text())["marks"]
    at = {(m["phase"], m["status"]): m for m in marks}
    w0, w1 = at[("workload", "start")], at[("workload", "done")]
    counts = results.get("counts") or {}
    return {
        "tree": label,
        "uptime_before": up,
        "load_before": before,
        "load_after": after,
        "wall_s": r["wall_s"],
        "rc": r["rc"],
        "verdict": results.get("verdict"),
        "ops": counts.get("history_ops"),
        "lost": counts.get("lost"),
        "timings": results.get("timings"),
        "phases": phases(r["lines"], r["wall_s"], float(scenario["nemesis"]["settle"])),
        "harness_cpu_workload": {
            "wall_s": round(w1["t"] - w0["t"], 1),
            "cpu_s": round(w1["cpu"] - w0["cpu"], 1),
            "share_of_one_core": round((w1["cpu"] - w0["cpu"]) / (w1["t"] - w0["t"]), 3),
        },
        "run_dir": str(run_dir),
        # every phase mark of the run (cpu_probe), in seconds since the command was spawned
        "marks": [f"{m['t'] - r['t0']:7.2f} {m['phase']} {m['status']} cpu={m['cpu']}" for m in marks],
        "progress": [f"{t:7.2f} {line}" for t, line in r["lines"]],
    }


PHASES = (
    "startup",
    "containers",
    "readiness",
    "forming",
    "traffic",
    "settle_and_drain",
    "check",
    "check_until_job",
    "check_job",
    "verdict_to_last_line",
    "exit",
)


def summary(path: Path) -> str:
    """A markdown table of every run in a results file (``--summary``), then each tree's medians."""
    runs = json.loads(path.read_text())["runs"]
    head = [
        "run",
        "load before",
        "load after",
        "wall s",
        "verdict",
        "ops",
        "images",
        *PHASES,
        "report s",
        "harness CPU",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        # from the stamped lines kept in the file, so a file written by an earlier version reads alike
        stamped = [(float(x[:7]), x[8:]) for x in r["progress"]]
        p = phases(stamped, r["wall_s"], r["phases"]["settle_s"])
        at = {" ".join(m.split()[1:3]): float(m.split()[0]) for m in r.get("marks", [])}
        report = at["report done"] - at["report start"] if "report done" in at else None
        images = at["images done"] - at["images start"] if "images done" in at else None
        rows.append(
            "| "
            + " | ".join(
                [
                    f"{r['tree']}{r['repeat']}",
                    f"{r['load_before'][0]:.1f}",
                    f"{r['load_after'][0]:.1f}",
                    f"{r['wall_s']:.1f}",
                    str(r["verdict"]),
                    str(r["ops"]),
                    "-" if images is None else f"{images:.1f}",
                    *("-" if p[k] is None else f"{p[k]:.1f}" for k in PHASES),
                    "-" if report is None else f"{report:.1f}",
                    f"{r['harness_cpu_workload']['cpu_s']} s / {r['harness_cpu_workload']['wall_s']} s",
                ]
            )
            + " |"
        )
    trees = sorted({r["tree"] for r in runs})
    keys = ["wall_s", "load_before", *PHASES]
    rows += [
        "",
        "| tree | runs | " + " | ".join(f"median {k}" for k in keys) + " |",
        "|" + "---|" * (len(keys) + 2),
    ]
    for tree in trees:
        mine = [r for r in runs if r["tree"] == tree]
        med = []
        for k in keys:
            if k in ("wall_s", "load_before"):
                vals = [r[k] if k == "wall_s" else r[k][0] for r in mine]
            else:
                vals = [
                    phases([(float(x[:7]), x[8:]) for x in r["progress"]], r["wall_s"], 0.0)[k] for r in mine
                ]
            vals = [v for v in vals if v is not None]
            med.append(f"{statistics.median(vals):.1f}" if vals else "-")
        rows.append(f"| {tree} | {len(mine)} | " + " | ".join(med) + " |")
    return "\n".join(rows)


def main() -> int:
    if sys.argv[1:2] == ["--summary"]:
        print(summary(Path(sys.argv[2])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="LABEL=PATH of a checkout to run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--out", default="bench/results/run_overhead")
    ap.add_argument(
        "--keep", default=None, help="where the runs' stores stay (default: a new temporary directory)"
    )
    ap.add_argument("extra", nargs="*", help="more arguments for `run` (after --)")
    args = ap.parse_args()
    trees = [(s.partition("=")[0], Path(s.partition("=")[2]).resolve()) for s in args.tree]
    out = Path(args.out).with_suffix(".json")
    runs: list[dict[str, Any]] = []
    keep = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bc-overhead-"))
    for i in range(args.repeats):
        for label, tree in trees:
            r = one(label, tree, args.duration, args.extra, keep)
            r["repeat"] = i + 1
            runs.append(r)
            p = r["phases"]
            print(
                f"{label} #{i + 1}: {r['wall_s']} s, {r['verdict']}, load {r['load_before'][0]}, "
                f"check {p['check']} s, harness CPU {r['harness_cpu_workload']['share_of_one_core']}",
                flush=True,
            )
            out.write_text(json.dumps({"argv": sys.argv, "cores": os.cpu_count(), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
