"""Time to detection: how many seeded runs, and how much wall time, until a run fails.

    python -m bench.time_to_detection [--bugs 01,05] [--scenarios scenarios/rabbitmq-unsynced-mirror.yaml]
                                      [--runs 5] [--seed-base 100]

For each planted bug (``bench/planted/catalogue.yaml``, built into its own reference image
the way ``bench.detection`` does) and each real-broker scenario given with
``--scenarios`` (run on the broker as shipped), one ``brokerchaos run SCENARIO
--until-fail --runs N --seed S``: seeded runs until the first failing verdict. Recorded
per target: the runs it took, the CLI's own time to detection (wall time from the start of
the first run to the failing verdict; image builds excluded), every run's verdict and
directory, and the machine's load before and after, in
``bench/results/time_to_detection.{md,json}`` (rewritten after every target).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.detection import (
    REPO,
    Bug,
    apply_patch,
    build_image,
    cli_session,
    load_catalogue,
    select,
)
from bench.facts import (
    Origin,
    add_store_and_out,
    facts_markdown,
    load_line,
    load_text,
    measure,
    run_cli,
    say,
    stamped_store,
    write_report,
)
from harness.errors import BrokerChaosError

FOUND = re.compile(r"until-fail: first failure at run (\d+) \(seed (\d+)\) after ([0-9.]+) s")
NONE = re.compile(r"until-fail: no failure in (\d+) run\(s\).*?, ([0-9.]+) s of wall time")


@dataclass
class Target:
    label: str
    kind: str  # planted | real
    scenario: str
    detail: str
    status: str = "pending"  # detected | not detected | error | interrupted
    runs_to_detection: int | None = None
    seconds_to_detection: float | None = None  # the CLI's: first run start to the failing verdict
    wall_seconds: float | None = None  # this process's, around the whole CLI invocation
    build_seconds: float | None = None
    load_before: list[float] = field(default_factory=list)
    load_after: list[float] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def until_fail(scenario: Path, runs: int, seed: int, store: Path, tree: Path | None, target: Target) -> None:
    """``brokerchaos run --until-fail`` in its own session (Ctrl-C stops it once, cleanly)."""
    args = ["run", str(scenario), "--until-fail", "--runs", str(runs)]
    args += ["--seed", str(seed), "--store", str(store)]
    target.load_before = list(os.getloadavg())
    t0 = time.monotonic()
    code, out, interrupted = cli_session(args, store, tree)
    if interrupted:
        target.status = "interrupted"
        raise KeyboardInterrupt
    target.wall_seconds = round(time.monotonic() - t0, 1)
    target.load_after = list(os.getloadavg())
    (store / "run.out").write_text(out)
    target.runs = _runs(store)
    if m := FOUND.search(out):
        target.status = "detected"
        target.runs_to_detection, target.seconds_to_detection = int(m.group(1)), float(m.group(3))
    elif NONE.search(out):
        target.status = "not detected"
    else:
        tail = (store / "run.log").read_text(errors="replace").strip().splitlines()
        target.status, target.error = "error", (tail[-1][:300] if tail else f"exit {code}")


def _runs(store: Path) -> list[dict[str, Any]]:
    """Every run the invocation stored, oldest first: seed, verdict, lost, seconds, directory."""
    out = []
    for sc in sorted(store.glob("*/*/scenario.json"), key=lambda p: p.parent.name):
        d = sc.parent
        res = json.loads((d / "results.json").read_text()) if (d / "results.json").exists() else {}
        timings = res.get("timings") or {}
        out.append(
            {
                "seed": json.loads(sc.read_text()).get("seed"),
                "verdict": res.get("verdict", "error"),
                "lost": (res.get("counts") or {}).get("lost"),
                "seconds": round(sum(timings.values()), 1),
                "run_dir": _rel(d),
            }
        )
    return out


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


class Bench:
    def __init__(self, args: argparse.Namespace, store: Path) -> None:
        self.args = args
        self.store = store
        self.origin = Origin()
        self.targets: list[Target] = []
        self.interrupted = False

    def bug(self, bug: Bug) -> None:
        t = Target(bug.label, "planted", _rel(bug.scenario), bug.description)
        self.targets.append(t)
        with tempfile.TemporaryDirectory(prefix=f"brokerchaos-ttd-{bug.id}-") as tmp:
            try:
                tree = apply_patch(bug, Path(tmp))
                t0 = time.monotonic()
                build_image(tree)
                t.build_seconds = round(time.monotonic() - t0, 1)
            except BrokerChaosError as exc:
                t.status, t.error = "error", str(exc)
                self._said(t)
                return
            say(
                f"[{t.label}] image built ({t.build_seconds:.0f} s); {t.scenario} until it fails, "
                f"up to {self.args.runs} run(s)"
            )
            until_fail(bug.scenario, self.args.runs, self.args.seed_base, self.store / t.label, tree, t)
        self._said(t)

    def real(self, scenario: Path) -> None:
        t = Target(scenario.stem, "real", _rel(scenario), "the broker as shipped")
        self.targets.append(t)
        say(f"[{t.label}] {t.scenario} until it fails, up to {self.args.runs} run(s)")
        until_fail(scenario, self.args.runs, self.args.seed_base, self.store / t.label, None, t)
        self._said(t)

    def _said(self, t: Target) -> None:
        verdicts = ", ".join(str(r["verdict"]) for r in t.runs)
        if t.status == "detected":
            say(
                f"[{t.label}] detected at run {t.runs_to_detection} after {t.seconds_to_detection:.0f} s ({verdicts})"
            )
        else:
            say(f"[{t.label}] {t.status} ({verdicts})" + (f": {t.error}" if t.error else ""))
        self.write()

    def to_json(self) -> dict[str, Any]:
        return {
            **self.origin.record(),
            "interrupted": self.interrupted,
            "settings": {"runs": self.args.runs, "seed_base": self.args.seed_base, "store": _rel(self.store)},
            "targets": [asdict(t) for t in self.targets],
        }

    def write(self) -> None:
        write_report(self.args.out, self.to_json(), markdown)


def markdown(data: dict[str, Any]) -> str:
    s = data["settings"]
    lines = ["# Time to detection", ""]
    if data["interrupted"]:
        lines += ["**Interrupted**: what was measured until Ctrl-C.", ""]
    lines += [
        f"`brokerchaos run SCENARIO --until-fail --runs {s['runs']} --seed {s['seed_base']}` per target: "
        "seeded runs until the first failing verdict. Time to detection is the CLI's wall time from the start "
        "of the first run to that verdict (image builds excluded); load is the 1/5/15-minute load average "
        "before and after the target's runs on this machine.",
        "",
        "| target | kind | scenario | result | runs | time to detection | verdicts | load before -> after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in data["targets"]:
        ttd = t["seconds_to_detection"]
        load = f"{load_text(t['load_before'])} -> {load_text(t['load_after'])}" if t["load_after"] else "-"
        lines.append(
            f"| {t['label']} | {t['kind']} | `{Path(t['scenario']).name}` | {t['status']} | "
            f"{t['runs_to_detection'] or len(t['runs'])} | {f'{ttd:.0f} s' if ttd is not None else '-'} | "
            f"{', '.join(str(r['verdict']) for r in t['runs']) or '-'} | {load} |"
        )
    lines += ["", "Runs:", ""]
    for t in data["targets"]:
        for r in t["runs"]:
            lines.append(
                f"- {t['label']} seed {r['seed']}: {r['verdict']}"
                + (f", lost {r['lost']}" if r["lost"] else "")
                + f" (`{r['run_dir']}`)"
            )
        if t["error"]:
            lines.append(f"- {t['label']}: {t['status']}: {t['error']}")
    lines += [
        "",
        "## Machine and command",
        "",
        facts_markdown(data["facts"], data["command"]).rstrip(),
        f"- wall time: {data['wall_seconds']:.0f} s",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.time_to_detection", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--bugs", help="comma-separated planted bug ids or names (default: every bug; 'none': no bug)"
    )
    p.add_argument(
        "--scenarios",
        default="scenarios/rabbitmq-unsynced-mirror.yaml",
        help="comma-separated real-broker scenarios run as shipped ('' for none)",
    )
    p.add_argument("--runs", type=int, default=5, help="seeded runs per target at most (default 5)")
    p.add_argument("--seed-base", type=int, default=100, help="seed of each target's first run (default 100)")
    add_store_and_out(p, "time-to-detection", "time_to_detection")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bugs = [] if args.bugs == "none" else select(load_catalogue(), args.bugs)
    scenarios = [REPO / s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in scenarios:
        if not s.is_file():
            raise BrokerChaosError(f"--scenarios: {s} does not exist")
    store = stamped_store(args.store, "time-to-detection")
    bench = Bench(args, store)
    say(
        f"{len(bugs)} planted bug(s), {len(scenarios)} real-broker scenario(s), up to {args.runs} run(s) each; "
        f"{load_line()}; store {store}"
    )

    def work() -> None:
        for bug in bugs:
            bench.bug(bug)
        for s in scenarios:
            bench.real(s)

    bench.interrupted = measure(work, bench.write)
    found = [t for t in bench.targets if t.status == "detected"]
    say(f"detected {len(found)} of {len(bench.targets)} -> {Path(args.out).with_suffix('.md')}")
    return 130 if bench.interrupted else (0 if len(found) == len(bench.targets) else 1)


if __name__ == "__main__":
    run_cli(main)
