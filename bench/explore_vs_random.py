"""``brokerchaos explore`` against the seeded random nemesis, on planted bugs, on the same budget.

    python -m bench.explore_vs_random --bugs 15 --scenario scenarios/reference-power-loss-random.yaml
        [--budget 12] [--random-runs 3] [--seed-base 100] [--explore-seeds 100,101] [--phase random|explore|both]
        [--checker python]

For each planted bug (``bench/planted/catalogue.yaml``, built into its own reference image the
way ``bench.detection`` does) the scenario runs two ways, one run at a time:

random
    ``brokerchaos run SCENARIO --seed S`` with seeds ``seed-base``, ``seed-base + 1``, ...: the
    scenario's own seeded random nemesis, up to ``--random-runs`` runs or ``--budget`` minutes,
    stopping at the first failing verdict.
explore
    ``brokerchaos explore SCENARIO --budget B --seed S --no-shrink`` into a fresh corpus, once per
    ``--explore-seeds`` seed: the coverage-guided search from the same scenario (its first run is
    the scenario's own schedule), stopping at its first failing run.

Recorded per bug and way: time to the first failure (wall time from the start of the first run
to the failing run's verdict; the image build excluded), the runs it took, every run's verdict,
and the coverage cells (``harness.explore_cells.run_cells``) reached, in total and per hour of
search. ``--phase`` runs one way and keeps the other's figures already in the JSON, so the two
can be run apart. Results: ``bench/results/explore_vs_random.{md,json}`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.detection import (
    REPO,
    SOURCE_ENV,
    Bug,
    Interrupted,
    apply_patch,
    build_image,
    load_catalogue,
    run_scenario,
    select,
)
from bench.facts import (
    RESULTS,
    command_line,
    facts_markdown,
    load_text,
    machine_facts,
    run_cli,
    say,
    write_report,
)
from harness.errors import BrokerChaosError


def _rel(p: Path | str) -> str:
    p = Path(p).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def cells_of_dir(run_dir: str | None) -> list[str]:
    """The coverage cells a stored run reached (none when it left no results)."""
    from harness.explore_cells import stored_run_cells

    if not run_dir:
        return []
    path = REPO / run_dir if not Path(run_dir).is_absolute() else Path(run_dir)
    return sorted(stored_run_cells(path)) if (path / "results.json").exists() else []


def random_phase(
    bug: Bug, tree: Path, args: argparse.Namespace, store: Path, before: dict[str, Any] | None
) -> dict[str, Any]:
    """Seeded runs; ``before`` (what an earlier invocation ran) is continued, not run again."""
    out: dict[str, Any] = {"runs": [], "load_before": list(os.getloadavg())}
    if before and not before.get("first_failure_s"):
        out = {**before, "runs": list(before["runs"])}
    seen: set[str] = set()
    for r in out["runs"]:
        seen |= set(cells_of_dir(r.get("run_dir")))
    t0 = time.monotonic() - (out["runs"][-1]["elapsed_s"] if out["runs"] else 0.0)
    for k in range(len(out["runs"]), args.random_runs):
        if time.monotonic() - t0 > args.budget * 60:
            break
        seed = args.seed_base + k
        rec = run_scenario(Path(args.scenario), seed, tree, store / f"seed-{seed}", args.checker or ())
        cells = cells_of_dir(rec.run_dir)
        seen |= set(cells)
        elapsed = round(time.monotonic() - t0, 1)
        out["runs"].append(
            {
                "seed": seed,
                "verdict": rec.verdict,
                "seconds": rec.seconds,
                "elapsed_s": elapsed,
                "lost": rec.counts.get("lost"),
                "cells": len(cells),
                "cells_total": len(seen),
                "run_dir": rec.run_dir,
            }
        )
        say(
            f"[random {bug.label}] seed {seed}: {rec.verdict} ({rec.seconds:.0f} s), "
            f"{len(cells)} cells, {len(seen)} in all"
        )
        if rec.valid is False:
            out["first_failure_s"] = elapsed
            out["runs_to_failure"] = k + 1
            break
    out["elapsed_s"] = round(time.monotonic() - t0, 1)
    out["cells_total"] = len(seen)
    out["load_after"] = list(os.getloadavg())
    return out


def explore_phase(bug: Bug, tree: Path, args: argparse.Namespace, seed: int, store: Path) -> dict[str, Any]:
    corpus = store / "corpus"
    env = dict(os.environ)
    env[SOURCE_ENV] = str(tree)
    cmd = [
        sys.executable,
        "-m",
        "harness.cli",
        "explore",
        args.scenario,
        "--budget",
        str(args.budget),
        "--seed",
        str(seed),
        "--corpus",
        str(corpus),
        "--store",
        str(store),
        "--no-shrink",
    ]
    for name in args.checker or ():
        cmd += ["--checker", name]
    out: dict[str, Any] = {"command": " ".join(cmd[1:]), "load_before": list(os.getloadavg())}
    store.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(store / "explore.log", "w") as log:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    out["exit_code"] = proc.returncode
    out["elapsed_s"] = round(time.monotonic() - t0, 1)
    out["load_after"] = list(os.getloadavg())
    state = json.loads((corpus / "corpus.json").read_text()) if (corpus / "corpus.json").exists() else {}
    out["runs"] = [
        {
            "iteration": r["iteration"],
            "how": r["how"],
            "verdict": r["verdict"],
            "seconds": r["seconds"],
            "elapsed_s": r["elapsed_s"],
            "cells": r["cells"],
            "new": r["new"],
            "cells_total": r["cells_total"],
            "run_dir": _rel(r["run_dir"]) if r.get("run_dir") else None,
        }
        for r in state.get("runs", [])
    ]
    out["corpus_entries"] = len(state.get("entries", []))
    out["cells_total"] = len(state.get("cells", {}))
    fail = state.get("failure")
    if fail:
        out["first_failure_s"] = fail["elapsed_s"]
        out["runs_to_failure"] = fail["iteration"]
        out["failing_schedule"] = fail["describe"]
    say(
        f"[explore {bug.label}] exit {proc.returncode}: {len(out['runs'])} run(s), "
        f"{out['cells_total']} cells, first failure {out.get('first_failure_s', '-')} s"
    )
    return out


def ways(bug: dict[str, Any]) -> list[str]:
    """The ways a bug was run: ``random``, then ``explore seed S`` per search seed."""
    return [k for k in ("random", *sorted(k for k in bug if k.startswith("explore"))) if k in bug]


def per_hour(phase: dict[str, Any]) -> float | None:
    spent = sum(r["seconds"] for r in phase.get("runs", []))
    return round(phase["cells_total"] * 3600 / spent, 1) if spent and "cells_total" in phase else None


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# explore against the seeded random nemesis, on planted bugs",
        "",
        f"Scenario `{data['scenario']}`; budgets, runs and seeds as the commands at the end set them: "
        "the random nemesis with seeds from the seed base, explore once per search seed, its first run "
        f"the scenario's own schedule (seed {data.get('scenario_seed', '?')}). Time to the first failure runs from the start of the first "
        "run to the failing run's verdict (image builds excluded); coverage is the distinct cells "
        "(`harness.explore_cells.run_cells`) over every run of the way, per hour of run time.",
        "",
    ]
    lines += [f"{n}\n" for n in data.get("notes", [])]
    lines += [
        "| bug | way | runs | first failure | verdict of the failing run | cells | cells per hour |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in data["bugs"]:
        for way in ways(b):
            ph = b[way]
            runs = ph.get("runs", [])
            failing = next((r for r in runs if r["verdict"] not in ("durable", "unknown", "error")), None)
            first = ph.get("first_failure_s")
            found = f"{first:.0f} s (run {ph.get('runs_to_failure')})" if first is not None else "none"
            lines.append(
                f"| {b['label']} | {way} | {len(runs)} | "
                f"{found} | "
                f"{failing['verdict'] if failing else '-'} | {ph.get('cells_total', '-')} | {per_hour(ph) or '-'} |"
            )
    lines += ["", "Every run:", ""]
    for b in data["bugs"]:
        for way in ways(b):
            ph = b[way]
            load = load_text(ph.get("load_before", []))
            lines.append(f"- {b['label']}, {way} (load average before: {load}):")
            for r in ph.get("runs", []):
                what = f"seed {r['seed']}" if way == "random" else f"run {r['iteration']} ({r['how']})"
                new = f", {r['new']} new" if "new" in r else ""
                held = ""
                if r.get("held_at_loss"):
                    held = (
                        " (lost messages by the kinds held at their confirm: "
                        + ", ".join(f"{k} {n}" for k, n in sorted(r["held_at_loss"].items()))
                        + ")"
                    )
                lines.append(
                    f"  - {what}: {r['verdict']}{held} in {r['seconds']:.0f} s (at {r['elapsed_s']:.0f} s), "
                    f"{r['cells']} cells{new}, {r['cells_total']} in all; `{r['run_dir']}`"
                )
            if ph.get("failing_schedule"):
                lines.append(f"  - failing schedule: {ph['failing_schedule']}")
    lines += ["", "## Machine and command", "", facts_markdown(data["facts"], data["command"]).rstrip(), ""]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.explore_vs_random", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--bugs", required=True, help="comma-separated planted bug ids or names")
    p.add_argument("--scenario", required=True, help="the scenario both ways start from")
    p.add_argument("--budget", type=float, default=12.0, help="minutes per way and bug (default 12)")
    p.add_argument("--random-runs", type=int, default=3, help="random-nemesis runs at most (default 3)")
    p.add_argument("--seed-base", type=int, default=100, help="first seed (default 100)")
    p.add_argument(
        "--explore-seeds", default="100", help="comma-separated search seeds, one search each (default 100)"
    )
    p.add_argument("--phase", choices=("random", "explore", "both"), default="both")
    p.add_argument("--checker", action="append", help="checker(s) every run uses instead of the scenario's")
    p.add_argument("--store", help="run store root (default store/explore_vs_random)")
    p.add_argument("--out", default=str(RESULTS / "explore_vs_random"), help="results path without suffix")
    args = p.parse_args(argv)
    args.explore_seeds = [int(x) for x in args.explore_seeds.split(",") if x.strip()]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bugs = select(load_catalogue(), args.bugs)
    out = Path(args.out)
    old = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else {}
    data: dict[str, Any] = {
        "commands": [*old.get("commands", []), command_line()],
        "notes": old.get("notes", []),
        "facts": machine_facts(),
        "scenario": args.scenario,
        "budget_min": args.budget,
        "random_runs": args.random_runs,
        "seed_base": args.seed_base,
        "scenario_seed": _scenario_seed(args.scenario),
        "bugs": old.get("bugs", []),
    }
    # Per scenario: an explore corpus belongs to one scenario, and a second scenario's runs must not continue it.
    store = Path(args.store or REPO / "store" / "explore_vs_random").resolve() / Path(args.scenario).stem
    for bug in bugs:
        entry = next((b for b in data["bugs"] if b["label"] == bug.label), None)
        if entry is None:
            entry = {"label": bug.label}
            data["bugs"].append(entry)
        with tempfile.TemporaryDirectory(prefix=f"brokerchaos-explore-{bug.id}-") as tmp:
            try:
                tree = apply_patch(bug, Path(tmp))
                build_image(tree)
            except BrokerChaosError as exc:
                entry["error"] = str(exc)
                continue
            try:
                if args.phase in ("random", "both"):
                    entry["random"] = random_phase(
                        bug, tree, args, store / bug.label / "random", entry.get("random")
                    )
                    _write(out, data)
                if args.phase in ("explore", "both"):
                    for seed in args.explore_seeds:
                        entry[f"explore seed {seed}"] = explore_phase(
                            bug, tree, args, seed, store / bug.label / f"explore-{seed}"
                        )
                        _write(out, data)
            except (Interrupted, KeyboardInterrupt):
                _write(out, data)
                return 130
    _write(out, data)
    return 0


def _scenario_seed(path: str) -> int:
    from harness.scenario import load

    return load(path).seed


def held_at_loss(run_dir: str | None) -> dict[str, int]:
    """Lost messages (the listed ones) by the fault kinds held when each was confirmed ("none": no fault)."""
    if not run_dir:
        return {}
    path = REPO / run_dir if not Path(run_dir).is_absolute() else Path(run_dir)
    if not (path / "results.json").exists():
        return {}
    res = json.loads((path / "results.json").read_text())
    out: dict[str, int] = {}
    for m in (res.get("attribution") or {}).get("messages") or []:
        t = m.get("confirm_ns")
        kinds = sorted({w["kind"] for w in res.get("faults") or [] if w["start_ns"] <= t <= w["end_ns"]})
        key = "+".join(kinds) or "none"
        out[key] = out.get(key, 0) + 1
    return out


def recount(phase: dict[str, Any]) -> None:
    """Cells of every run again, with the current signal, so both ways are counted alike; for a
    failing run, the fault kinds held when its lost messages were confirmed."""
    seen: set[str] = set()
    for r in phase.get("runs", []):
        cells = cells_of_dir(r.get("run_dir"))
        seen |= set(cells)
        r["cells"], r["cells_total"] = len(cells), len(seen)
        if r["verdict"] == "LOST":
            r["held_at_loss"] = held_at_loss(r.get("run_dir"))
    phase["cells_total"] = len(seen)


def _write(out: Path, data: dict[str, Any]) -> None:
    for b in data["bugs"]:
        for way in ways(b):
            recount(b[way])
    data["facts"]["load_average_at_end"] = os.getloadavg()
    data["command"] = " ; ".join(data["commands"])
    write_report(out, data, markdown)


if __name__ == "__main__":
    run_cli(main)
