#!/usr/bin/env python3
"""Write the coverage records of the shipped scenarios and the coverage map page.

    python3 scripts/gen_coverage.py --record RUN_DIR [--command CMD --load UPTIME]
                                      # store a run's record (bench/results/coverage/<scenario>.json)
    python3 scripts/gen_coverage.py --plan
                                      # a plan record for each scenario with no run record
    python3 scripts/gen_coverage.py   # (re)write docs/explanation/coverage.md from the records
    python3 scripts/gen_coverage.py --check
                                      # exit 1 if the page differs from what the records give

A run's record is its ``results.json``'s ``coverage`` (``harness.coverage``) with the scenario,
seed, verdict, the command that ran it and the machine's load then. A plan record is computed
from the scenario file alone (``harness.coverage_map.planned_record``) and never fills a hole.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.coverage_map import PAGE, RECORDS, load_records, planned_record, render  # noqa: E402
from harness.host import Host  # noqa: E402


def write(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def run_record(host: Host, run_dir: Path, command: str | None, load: str | None) -> dict[str, Any]:
    """A run's record, its coverage computed again from the run directory (logs, history, the
    checker's fault windows) with the plugin's current declarations."""
    from harness.runner import annotate_coverage

    run_dir = run_dir.resolve()
    stored = json.loads((run_dir / "scenario.json").read_text())
    results = json.loads((run_dir / "results.json").read_text())
    annotate_coverage(
        host.broker(stored["broker"]["plugin"], stored["broker"].get("broker_version")), run_dir, results
    )
    if "cells" not in results["coverage"]:
        raise SystemExit(f"{run_dir}: coverage not computed: {results['coverage'].get('error')}")
    name = stored["scenario"]["name"]
    return {
        "scenario": name,
        "scenario_file": f"scenarios/{name}.yaml",
        "broker": stored["broker"]["plugin"],
        "source": "run",
        "run": {
            "seed": stored["seed"],
            "verdict": results.get("verdict"),
            "run_dir": run_dir.name,
            "command": command,
            "load": load,
        },
        "coverage": results["coverage"],
    }


def plan_records(host: Host) -> dict[str, dict[str, Any]]:
    from harness.cluster import fault_nodes, node_roles
    from harness.nemesis import plan
    from harness.scenario import load

    out = {}
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        sc = load(path)
        plugin = host.broker(sc.broker.plugin, sc.broker.version)
        settings = plugin.validate_settings(sc.broker.settings)
        nodes = fault_nodes(node_roles(plugin, sc.broker.nodes, settings))
        steps = plan(sc, host.registry.faults, nodes).to_list()
        out[sc.name] = {
            "scenario": sc.name,
            "scenario_file": f"scenarios/{path.name}",
            "broker": plugin.name,
            "source": "plan",
            "run": {"seed": sc.seed},
            "coverage": planned_record(plugin, sc.to_dict(), settings, steps),
        }
    return out


SUMMARY = ROOT / "bench" / "results" / "coverage.md"


def summary(records: list[dict[str, Any]]) -> str:
    """bench/results/coverage.md: every run behind a record, with its command and the load then."""
    runs = sorted((r for r in records if r.get("source") == "run"), key=lambda r: r["scenario"])
    out = [
        "# Coverage runs",
        "",
        "Each run below was made with the command in its row, one at a time, then recorded with",
        "`python3 scripts/gen_coverage.py --record RUN_DIR --command CMD --load UPTIME`; the records are",
        "in `bench/results/coverage/`, the map they give in `docs/explanation/coverage.md`. Load: the",
        "load averages of `uptime` just before the run, after the time it was recorded (a shared 2-core machine).",
        "",
        "| scenario | seed | verdict | load | events | command |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        run = r["run"]
        seen = ", ".join(f"{k} ×{v}" for k, v in (r["coverage"].get("events") or {}).items()) or "-"
        load = (run.get("load") or "").replace("load average: ", "")
        out.append(
            f"| `{r['scenario']}` | {run.get('seed')} | {run.get('verdict')} | {load} | {seen} | `{run.get('command')}` |"
        )
    return "\n".join(out) + "\n"


def page(host: Host) -> str:
    plugins = [host.broker(n) for n in sorted(host.registry.brokers)]
    return render(plugins, host.registry.faults, load_records()) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", nargs="+", type=Path, metavar="RUN_DIR", help="store these runs' records")
    ap.add_argument("--command", help="the command that ran them (kept in the record)")
    ap.add_argument("--load", help="the machine's load when they ran (`uptime`), kept in the record")
    ap.add_argument(
        "--plan", action="store_true", help="a plan record for each scenario without a run record"
    )
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = ap.parse_args(argv)
    host = Host.load()
    for run_dir in args.record or []:
        rec = run_record(host, run_dir, args.command, args.load)
        write(RECORDS / f"{rec['scenario']}.json", rec)
        print(f"recorded {rec['scenario']} ({len(rec['coverage']['cells'])} cells)")
    if args.plan:
        have = {r["scenario"] for r in load_records() if r.get("source") == "run"}
        for name, rec in plan_records(host).items():
            if name not in have:
                write(RECORDS / f"{name}.json", rec)
    want = page(host)
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != want:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python3 scripts/gen_coverage.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(want)
    SUMMARY.write_text(summary(load_records()))
    print(f"wrote {PAGE.relative_to(ROOT)} and {SUMMARY.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
