"""A run's fixed cost, two checkouts alternated (A, B, A, B, ...) under the same conditions.

  python bench/fixed_cost.py --tree A=/path/to/base --tree B=. [--repeats 2]
      [--scenario scenarios/rabbitmq-smoke.yaml] [--run-arg=--duration --run-arg=20]
      [--out bench/results/run_fixed_cost]
  python bench/fixed_cost.py --summary RESULTS.json [RESULTS.json ...]

Each run is ``python3 -m harness.cli -p exec_probe run SCENARIO --seed 1 --checker python`` in the
tree, with a store of its own in a temporary directory and ``bench/exec_probe.py`` (this
checkout's) on the path. For every run: the wall time from spawn to exit, the load average before
and after, the run's phase times (``results.json`` ``timings``), spawn to the first progress line,
and what the probe saw: every command run in a container (count and seconds per command), the
harness's own CPU and the broker containers' CPU per phase. Counts and CPU seconds are what a
comparison on a loaded machine can rest on; wall times are given with the loads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def kind(cmd: list[str]) -> str:
    """A command as counted: ``timeout N`` dropped, the program and its first word that is not a flag."""
    rest = cmd[2:] if cmd[:1] == ["timeout"] else cmd
    words = [w for w in rest[1:] if not w.startswith("-")][:1]
    return " ".join([Path(rest[0]).name, *words]) if rest else "?"


def one(label: str, tree: Path, scenario: str, keep: Path, extra: list[str]) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=keep))
    shutil.copy(HERE / "exec_probe.py", tmp / "exec_probe.py")
    probe, store = tmp / "probe.json", tmp / "store"
    cmd = [sys.executable, "-m", "harness.cli", "-p", "exec_probe", "run", scenario]
    cmd += ["--seed", "1", "--checker", "python", "--store", str(store), *extra]
    env = {**os.environ, "PYTHONPATH": f"{tree}:{tmp}", "BROKERCHAOS_EXEC_PROBE": str(probe)}
    before = load()
    epoch0 = time.time()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = [(round(time.monotonic() - t0, 2), ln.rstrip("\n")) for ln in proc.stderr]
    stdout = proc.stdout.read() if proc.stdout else ""
    rc = proc.wait()
    wall = round(time.monotonic() - t0, 2)
    after = load()
    (tmp / "stderr.txt").write_text("\n".join(f"{t:8.2f} {ln}" for t, ln in lines))
    (tmp / "stdout.txt").write_text(stdout)
    results = next(store.rglob("results.json"), None)
    res = json.loads(results.read_text()) if results else {}
    got = json.loads(probe.read_text()) if probe.exists() else {"marks": [], "execs": []}
    marks = {(m["phase"], m["status"]): m for m in got["marks"]}
    per_phase = {}
    for phase in ("images", "cluster", "workload", "teardown", "remove", "check", "report", "run"):
        a, b = marks.get((phase, "start")), marks.get((phase, "done"))
        if a and b:
            per_phase[phase] = {
                "wall_s": round(b["t"] - a["t"], 2),
                "harness_cpu_s": round(b["cpu"] - a["cpu"], 2),
                "nodes_cpu_s": round(sum(b["containers"].values()) - sum(a["containers"].values()), 2),
            }
    cluster = marks.get(("cluster", "start")), marks.get(("cluster", "done"))
    in_cluster = [
        e for e in got["execs"] if cluster[0] and cluster[1] and cluster[0]["t"] <= e["t"] <= cluster[1]["t"]
    ]
    since_spawn = {f"{p} {s}": round(m["epoch"] - epoch0, 2) for (p, s), m in marks.items()}
    return {
        "tree": label,
        "since_spawn": since_spawn,
        "path": str(tmp),
        "rc": rc,
        "wall_s": wall,
        "load_before": before,
        "load_after": after,
        "first_line_s": lines[0][0] if lines else None,
        "verdict": res.get("verdict"),
        "timings": res.get("timings"),
        "phases": per_phase,
        "cluster_execs": dict(Counter(kind(e["cmd"]) for e in in_cluster)),
        "cluster_exec_s": dict(
            sorted(
                {
                    k: round(sum(e["s"] for e in in_cluster if kind(e["cmd"]) == k), 1)
                    for k in {kind(e["cmd"]) for e in in_cluster}
                }.items()
            )
        ),
        "all_execs": dict(Counter(kind(e["cmd"]) for e in got["execs"])),
        "progress": [f"{t:8.2f} {ln}" for t, ln in lines if ln.startswith("[")],
    }


ERLANG_CLIS = ("rabbitmqctl", "rabbitmq-diagnostics", "rabbitmq-plugins")


def _at(progress: list[str], text: str, last: bool = False) -> float | None:
    hits = [float(ln.split()[0]) for ln in progress if text in ln]
    return (hits[-1] if last else hits[0]) if hits else None


def summary(paths: list[Path]) -> str:
    """A markdown table of every run in the results files (``--summary``): seconds from the
    progress lines and the probe, CPU seconds, and the commands run in containers while the
    cluster started (Erlang VMs: each ``rabbitmqctl``/``rabbitmq-diagnostics`` boots one)."""
    head = (
        "| run | load before | load after | wall s | sidecars s | brokers to ready s | forming s | cluster s "
        "| nodes' CPU s (cluster) | harness CPU s (run) | Erlang VMs (cluster) | docker execs (cluster) "
        "| collect s | remove s | report s |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for path in paths:
        for r in json.loads(path.read_text())["runs"]:
            pr, ph = r["progress"], r["phases"]
            net, started = _at(pr, "cluster   network"), _at(pr, ": starting ", last=True)
            ready, formed = _at(pr, "forming the cluster"), _at(pr, "cluster   ready:")
            vms = sum(n for k, n in r["cluster_execs"].items() if k.split()[0] in ERLANG_CLIS)
            execs = sum(r["cluster_execs"].values())

            def span(a: float | None, b: float | None) -> str:
                return "-" if a is None or b is None else f"{b - a:.1f}"

            def wall(phase: str, ph: dict[str, Any] = ph) -> str:
                return f"{ph[phase]['wall_s']:.1f}" if phase in ph else "-"

            rows.append(
                f"| {r['tree']}{r['repeat']} | {r['load_before'][0]:.1f} | {r['load_after'][0]:.1f} | {r['wall_s']:.1f} "
                f"| {span(net, started)} | {span(started, ready)} | {span(ready, formed)} | {wall('cluster')} "
                f"| {ph['cluster']['nodes_cpu_s']:.1f} | {ph['run']['harness_cpu_s']:.1f} | {vms} | {execs} "
                f"| {wall('teardown')} | {wall('remove')} | {wall('report')} |"
            )
    return "\n".join(rows)


def main() -> int:
    if sys.argv[1:2] == ["--summary"]:
        print(summary([Path(a) for a in sys.argv[2:]]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="LABEL=PATH of a checkout to run")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--scenario", default="scenarios/rabbitmq-smoke.yaml")
    ap.add_argument("--out", default="bench/results/run_fixed_cost")
    ap.add_argument("--run-arg", action="append", default=[], help="one more argument for `run` (repeatable)")
    ap.add_argument(
        "--keep", default=None, help="where the runs' stores stay (default: a temporary directory)"
    )
    args = ap.parse_args()
    trees = [(s.partition("=")[0], Path(s.partition("=")[2]).resolve()) for s in args.tree]
    keep = Path(args.keep or tempfile.mkdtemp(prefix="bc-fixed-"))
    keep.mkdir(parents=True, exist_ok=True)
    out = Path(args.out).with_suffix(".json")
    runs: list[dict[str, Any]] = []
    for i in range(args.repeats):
        for label, tree in trees:
            r = one(label, tree, args.scenario, keep, args.run_arg)
            r["repeat"] = i + 1
            runs.append(r)
            c = r["phases"].get("cluster", {})
            print(
                f"{label}#{i + 1}: rc {r['rc']} {r['verdict']} wall {r['wall_s']} s load {r['load_before']} -> "
                f"{r['load_after']}; cluster {c}; execs {r['cluster_execs']}",
                flush=True,
            )
            out.write_text(json.dumps({"argv": sys.argv, "cores": os.cpu_count(), "runs": runs}, indent=1))
    for label, _tree in trees:
        mine = [r for r in runs if r["tree"] == label and r["phases"].get("cluster")]
        if mine:
            med = statistics.median(r["phases"]["cluster"]["wall_s"] for r in mine)
            print(f"{label}: median cluster phase {med} s over {len(mine)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
