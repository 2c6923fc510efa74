"""The harness's own detection score: how many planted broker bugs its checkers catch.

    python -m bench.detection [--bugs 01,06] [--runs 3] [--clean-runs 20] [--seed-base 100]
                              [--general] [--explore MINUTES] [--skip-targeted]

For each bug of ``bench/planted/catalogue.yaml`` the checkout's ``broker_impl/`` is
copied to a temporary directory, the bug's patch applied there (never to the
working tree), and the reference broker's image built from the copy
(``BROKERCHAOS_REFERENCE_SOURCE``, see ``plugins/reference``). The bug's shipped
scenario then runs through the ordinary CLI (``brokerchaos run``, one run at a
time) with seeds ``seed-base``, ``seed-base + 1``, ... until a verdict is not
``durable`` or ``--runs`` runs are spent. Time to detection is the wall time from
the start of the bug's first run to the verdict of the detecting run (the image
build is reported apart). Then the clean control: the unmodified broker, the same
scenarios and seeds, ``--clean-runs`` runs in all; any verdict but ``durable``
there is a false alarm.

With ``--general`` each bug is also run against the general suite (the catalogue's
``general`` list: shipped scenarios written for no bug in particular), one scenario after the
other with the same seeds, until one catches it; with ``--explore MINUTES`` it is also searched
for by ``brokerchaos explore`` from each general-suite scenario in turn (that budget each, a
fresh corpus, no shrink) until one search catches it. Planted bugs are written against features
and windows, not scenarios: the general numbers say whether the harness would find the bug
without being told where to look, beside the targeted number. ``--skip-targeted`` runs only
those.

A bug whose scenario does not load (it uses fields this harness does not have
yet) is reported as waiting, not run. One line per run as it goes; the results
(``bench/results/detection.{md,json}``) are rewritten after every run, so Ctrl-C
stops the current run cleanly (its cluster is torn down) and keeps what was
measured.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.facts import (
    Origin,
    add_store_and_out,
    facts_markdown,
    load_line,
    measure,
    run_cli,
    say,
    stamped_store,
    write_report,
)
from harness.errors import BrokerChaosError

REPO = Path(__file__).resolve().parents[1]
PLANTED = Path(__file__).resolve().parent / "planted"
CATALOGUE = PLANTED / "catalogue.yaml"
SOURCE_ENV = "BROKERCHAOS_REFERENCE_SOURCE"  # read by plugins/reference's image()
VERDICTS = ("LOST", "INTEGRITY", "RESURRECTED", "DUPLICATED", "unknown")
#: The counts shown per run, when the checkers report them.
SHOWN_COUNTS = (
    "confirmed",
    "lost",
    "unexpected",
    "corrupted",
    "integrity",
    "resurrected",
    "duplicated",
    "recovered",
    "split_brain",
)


#: How long a run may take to stop after Ctrl-C (it tears its cluster down first).
STOP_GRACE = 180.0


def shown_counts(counts: Mapping[str, Any]) -> str:
    """The non-zero ``SHOWN_COUNTS`` of a run, as every table and line of this benchmark writes them."""
    return ", ".join(f"{k} {counts[k]}" for k in SHOWN_COUNTS if counts.get(k))


@dataclass(frozen=True)
class Bug:
    id: str
    name: str
    patch: Path
    area: str
    description: str
    precedent: str
    scenario: Path
    expect: str

    @property
    def label(self) -> str:
        return f"{self.id}-{self.name}"


class PatchError(BrokerChaosError):
    """A planted patch does not apply to the current ``broker_impl/``."""


def load_catalogue(path: Path = CATALOGUE) -> list[Bug]:
    """The planted bugs, checked: every field present, files that exist, a known verdict."""
    data = yaml.safe_load(path.read_text())
    bugs: list[Bug] = []
    for i, raw in enumerate((data or {}).get("bugs") or []):
        where = f"{path.name}: bugs[{i}]"
        missing = [
            k
            for k in ("id", "name", "patch", "area", "description", "precedent", "scenario", "expect")
            if not raw.get(k)
        ]
        if missing:
            raise BrokerChaosError(f"{where}: missing {', '.join(missing)}")
        bug = Bug(
            id=str(raw["id"]),
            name=str(raw["name"]),
            patch=path.parent / raw["patch"],
            area=str(raw["area"]),
            description=" ".join(str(raw["description"]).split()),
            precedent=" ".join(str(raw["precedent"]).split()),
            scenario=REPO / raw["scenario"],
            expect=str(raw["expect"]),
        )
        if bug.expect not in VERDICTS:
            raise BrokerChaosError(f"{where}: expect {bug.expect!r}; allowed {', '.join(VERDICTS)}")
        for f in (bug.patch, bug.scenario):
            if not f.is_file():
                raise BrokerChaosError(f"{where}: {f.relative_to(REPO)} does not exist")
        if any(b.id == bug.id for b in bugs):
            raise BrokerChaosError(f"{where}: id {bug.id} is used twice")
        bugs.append(bug)
    if not bugs:
        raise BrokerChaosError(f"{path}: no bugs listed")
    return bugs


def load_general(path: Path = CATALOGUE) -> list[Path]:
    """The general suite: the catalogue's ``general`` scenarios, each shipped."""
    data = yaml.safe_load(path.read_text()) or {}
    out = [REPO / str(x) for x in data.get("general") or []]
    for f in out:
        if not f.is_file():
            raise BrokerChaosError(f"{path.name}: general: {f.relative_to(REPO)} does not exist")
    if not out:
        raise BrokerChaosError(f"{path.name}: no general scenarios listed (general: [...])")
    return out


def apply_patch(bug: Bug, dest: Path) -> Path:
    """Copy ``broker_impl/`` into ``dest`` and apply the bug's patch to the copy; return the copy.

    No fuzz: a patch that only applies approximately no longer plants the bug it describes.
    """
    tree = dest / "broker_impl"
    shutil.copytree(REPO / "broker_impl", tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = subprocess.run(
        [
            "patch",
            "-p1",
            "--forward",
            "--batch",
            "--fuzz=0",
            "--no-backup-if-mismatch",
            "-d",
            str(dest),
            "-i",
            str(bug.patch),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        why = (proc.stdout + proc.stderr).strip().splitlines()
        raise PatchError(
            f"{bug.patch.name} does not apply to the current broker_impl/ "
            f"({why[-1] if why else 'patch failed'}): update the patch"
        )
    return tree


@contextlib.contextmanager
def source_override(tree: Path | None) -> Iterator[None]:
    """Point the reference plugin at ``tree`` (None: the checkout's broker) for the block."""
    old = os.environ.pop(SOURCE_ENV, None)
    if tree is not None:
        os.environ[SOURCE_ENV] = str(tree)
    try:
        yield
    finally:
        os.environ.pop(SOURCE_ENV, None)
        if old is not None:
            os.environ[SOURCE_ENV] = old


def build_image(tree: Path | None) -> str:
    """The reference image for ``tree``, built now so a run's time excludes the build."""
    from harness import progress
    from harness.cluster import docker_client
    from harness.images import ImageBuilder
    from plugins.reference import ReferenceBroker

    quiet, progress.quiet = progress.quiet, True
    try:
        with source_override(tree):
            return ImageBuilder(docker_client()).node_image(ReferenceBroker().image())
    finally:
        progress.quiet = quiet


def scenario_problem(path: Path) -> str | None:
    """Why this harness cannot run the scenario yet (fields it does not know), or None."""
    from harness.scenario import load

    try:
        load(path)
    except BrokerChaosError as exc:
        return str(exc)
    return None


# -- one run -----------------------------------------------------------------------------


@dataclass
class RunRecord:
    scenario: str
    seed: int
    verdict: str  # a checker verdict, or "error" (the run did not finish: see detail)
    exit_code: int
    seconds: float
    counts: dict[str, Any] = field(default_factory=dict)
    valid: bool | str | None = None  # the results' ``valid``: True, False or "unknown"
    run_dir: str | None = None
    detail: str | None = None

    @property
    def caught(self) -> bool:
        """Not durable: a failure verdict, or unknown (the harness would not call the broker durable)."""
        return self.verdict not in ("durable", "error", "interrupted")

    @property
    def failed(self) -> bool:
        """A definite failure verdict (``valid: false``): on the unmodified broker, a false alarm."""
        return self.valid is False

    def counts_text(self) -> str:
        return shown_counts(self.counts) or "-"


class Interrupted(Exception):
    """Ctrl-C (or SIGTERM) during a run; the run was stopped and torn down."""

    def __init__(self, record: RunRecord) -> None:
        super().__init__("interrupted")
        self.record = record


def cli_env(tree: Path | None) -> dict[str, str]:
    """This process's environment, with the reference broker's source set to ``tree`` (or unset)."""
    env = dict(os.environ)
    env.pop(SOURCE_ENV, None)
    if tree is not None:
        env[SOURCE_ENV] = str(tree)
    return env


def cli_session(args: Sequence[str], store: Path, tree: Path | None) -> tuple[int, str, bool]:
    """``python -m harness.cli ARGS`` in its own session, so Ctrl-C reaches it once, from here:
    (exit status, what it printed, whether Ctrl-C stopped it). Its stderr goes to ``run.log``."""
    store.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "harness.cli", *args]
    interrupted = False
    with open(store / "run.log", "w") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=cli_env(tree),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate()
        except KeyboardInterrupt:
            # SIGTERM, not SIGINT: a child started from a background shell inherits an ignored
            # SIGINT; the run takes SIGTERM as Ctrl-C and tears its cluster down.
            interrupted = True
            proc.send_signal(signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
    return proc.returncode, out, interrupted


def run_scenario(
    scenario: Path, seed: int, tree: Path | None, store: Path, checkers: Sequence[str] = ()
) -> RunRecord:
    """One ``brokerchaos run`` as a subprocess in its own session, so Ctrl-C reaches it once, from here."""
    args = ["run", str(scenario), "--seed", str(seed), "--store", str(store), "--json"]
    for name in checkers:
        args += ["--checker", name]
    t0 = time.monotonic()
    code, out, interrupted = cli_session(args, store, tree)
    record = _record(scenario, seed, store, code, out, round(time.monotonic() - t0, 1))
    if interrupted:
        raise Interrupted(record)
    return record


def explore_scenario(
    scenario: Path, minutes: float, seed: int, tree: Path | None, store: Path, checkers: Sequence[str] = ()
) -> dict[str, Any]:
    """One ``brokerchaos explore`` in a fresh corpus, as a subprocess; what its corpus says of it."""
    store.mkdir(parents=True, exist_ok=True)
    env = cli_env(tree)
    corpus = store / "corpus"
    cmd = [sys.executable, "-m", "harness.cli", "explore", str(scenario), "--budget", str(minutes)]
    cmd += ["--seed", str(seed), "--corpus", str(corpus), "--store", str(store), "--no-shrink"]
    for name in checkers:
        cmd += ["--checker", name]
    t0 = time.monotonic()
    with open(store / "explore.log", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=STOP_GRACE)
            raise
    state = json.loads((corpus / "corpus.json").read_text()) if (corpus / "corpus.json").exists() else {}
    failure = state.get("failure") or {}
    return {
        "scenario": _rel(scenario),
        "exit_code": proc.returncode,
        "seconds": round(time.monotonic() - t0, 1),
        "runs": len(state.get("runs") or []),
        "cells": len(state.get("cells") or {}),
        "verdict": failure.get("verdict"),
        "failing_schedule": failure.get("describe"),
        "run_dir": _rel(Path(failure["run_dir"])) if failure.get("run_dir") else None,
        "corpus": _rel(corpus),
    }


def _record(scenario: Path, seed: int, store: Path, code: int, out: str, seconds: float) -> RunRecord:
    """What a finished (or stopped) run left: its results, else the last line of its log."""
    run_dir = _run_dir(store)
    results: dict[str, Any] = {}
    if run_dir and (REPO / run_dir / "results.json").exists():
        results = json.loads((REPO / run_dir / "results.json").read_text())
    elif out.strip().startswith("{"):
        results = json.loads(out)
    if code not in (0, 1, 3) or not results:
        tail = (store / "run.log").read_text(errors="replace").strip().splitlines()
        return RunRecord(
            _rel(scenario),
            seed,
            "interrupted" if code in (130, -signal.SIGTERM) else "error",
            code,
            seconds,
            run_dir=run_dir,
            detail=tail[-1][:300] if tail else f"exit {code}",
        )
    verdict = str(results.get("verdict") or results.get("valid"))
    return RunRecord(
        _rel(scenario),
        seed,
        verdict,
        code,
        seconds,
        counts=dict(results.get("counts") or {}),
        valid=results.get("valid"),
        run_dir=run_dir,
        detail=results.get("error"),
    )


def _run_dir(store: Path) -> str | None:
    latest = store / "latest"  # the run store's pointer at its newest run: this store holds one
    return _rel(latest.resolve()) if latest.exists() else None


def _rel(path: Path) -> str:
    return str(path.resolve().relative_to(REPO)) if path.resolve().is_relative_to(REPO) else str(path)


# -- the bench ---------------------------------------------------------------------------------


@dataclass
class BugResult:
    bug: dict[str, Any]
    status: str  # caught | missed | waiting | error | interrupted
    runs: list[RunRecord] = field(default_factory=list)
    runs_to_detection: int | None = None
    seconds_to_detection: float | None = None
    build_seconds: float | None = None
    image: str | None = None
    detail: str | None = None
    general: dict[str, Any] | None = None  # the general suite: status, runs, seconds, by
    explore: dict[str, Any] | None = None  # explore from the general suite: status, searches, seconds, by

    @property
    def verdict(self) -> str | None:
        return self.runs[-1].verdict if self.runs else None


class Bench:
    def __init__(self, bugs: Sequence[Bug], args: argparse.Namespace, store: Path) -> None:
        self.bugs = list(bugs)
        self.args = args
        self.store = store
        self.origin = Origin()
        self.results: list[BugResult] = []
        self.clean: list[RunRecord] = []
        self.clean_detail: str | None = None
        self.interrupted = False
        self.general = load_general() if args.general or args.explore else []

    # -- bugs
    def run_bug(self, bug: Bug) -> BugResult:
        res = BugResult(bug=_bug_dict(bug), status="missed")
        self.results.append(res)
        try:
            return self._run_bug(bug, res)
        except (Interrupted, KeyboardInterrupt):
            if res.status != "caught":
                res.status = "interrupted"
            raise

    def _run_bug(self, bug: Bug, res: BugResult) -> BugResult:
        problem = scenario_problem(bug.scenario)
        if problem is not None:
            res.status, res.detail = "waiting", problem
            say(f"[bug {bug.label}] waiting: {problem}")
            return res
        with tempfile.TemporaryDirectory(prefix=f"brokerchaos-planted-{bug.id}-") as tmp:
            try:
                tree = apply_patch(bug, Path(tmp))
                t = time.monotonic()
                res.image = build_image(tree)
                res.build_seconds = round(time.monotonic() - t, 1)
            except BrokerChaosError as exc:
                res.status, res.detail = "error", str(exc)
                say(f"[bug {bug.label}] error: {exc}")
                return res
            say(
                f"[bug {bug.label}] image {res.image} ({res.build_seconds:.0f} s); {_rel(bug.scenario)}, "
                f"up to {self.args.runs} run(s), expecting {bug.expect}"
            )
            if self.args.skip_targeted:
                res.status = "not run"
            else:
                self._targeted(bug, res, tree)
            if self.args.general:
                res.general = self._general(bug, tree)
                self.write()
            if self.args.explore:
                res.explore = self._explore(bug, tree)
                self.write()
        return res

    def _targeted(self, bug: Bug, res: BugResult, tree: Path) -> None:
        t0 = time.monotonic()
        for k in range(self.args.runs):
            seed = self.args.seed_base + k
            stopped: Interrupted | None = None
            try:
                rec = run_scenario(
                    bug.scenario, seed, tree, self.store / bug.label / f"seed-{seed}", self.args.checker or ()
                )
            except Interrupted as stop:
                rec, stopped = stop.record, stop
            res.runs.append(rec)
            line = (
                f"[bug {bug.label}] run {k + 1}/{self.args.runs} seed {seed}: {rec.verdict} "
                f"({rec.counts_text()}) {rec.seconds:.0f} s"
            )
            if rec.caught:
                res.status = "caught"
                res.runs_to_detection = k + 1
                res.seconds_to_detection = round(time.monotonic() - t0, 1)
                say(f"{line} -> caught after {k + 1} run(s), {res.seconds_to_detection:.0f} s")
            else:
                say(line + (f" [{rec.detail}]" if rec.detail else ""))
            if stopped is not None:
                raise stopped
            if rec.caught:
                break
            self.write()

    def _general(self, bug: Bug, tree: Path) -> dict[str, Any]:
        """The general suite, scenario after scenario and seed after seed, until a run catches the bug."""
        out: dict[str, Any] = {"status": "missed", "runs": [], "seconds": None, "by": None}
        t0 = time.monotonic()
        for k in range(self.args.runs):
            seed = self.args.seed_base + k
            for scenario in self.general:
                stopped: Interrupted | None = None
                try:
                    rec = run_scenario(
                        scenario,
                        seed,
                        tree,
                        self.store / bug.label / "general" / f"{scenario.stem}-seed-{seed}",
                        self.args.checker or (),
                    )
                except Interrupted as stop:
                    rec, stopped = stop.record, stop
                out["runs"].append(asdict(rec))
                say(
                    f"[bug {bug.label}] general {scenario.stem} seed {seed}: {rec.verdict} "
                    f"({rec.counts_text()}) {rec.seconds:.0f} s" + (" -> caught" if rec.caught else "")
                )
                if stopped is not None:
                    raise stopped
                if rec.caught:
                    out.update(status="caught", seconds=round(time.monotonic() - t0, 1), by=rec.scenario)
                    return out
                self.write()
        return out

    def _explore(self, bug: Bug, tree: Path) -> dict[str, Any]:
        """``brokerchaos explore`` from each general scenario in turn, ``--explore`` minutes each."""
        out: dict[str, Any] = {"status": "missed", "searches": [], "seconds": None, "by": None}
        t0 = time.monotonic()
        for scenario in self.general:
            search = explore_scenario(
                scenario,
                self.args.explore,
                self.args.seed_base,
                tree,
                self.store / bug.label / "explore" / scenario.stem,
                self.args.checker or (),
            )
            out["searches"].append(search)
            say(
                f"[bug {bug.label}] explore {scenario.stem}: {search['runs']} run(s), "
                f"{search['verdict'] or 'no failure'} in {search['seconds']:.0f} s"
            )
            if search["verdict"] is not None:
                out.update(status="caught", seconds=round(time.monotonic() - t0, 1), by=_rel(scenario))
                return out
            self.write()
        return out

    # -- clean control
    def clean_plan(self) -> list[tuple[Path, int]]:
        """``--clean-runs`` runs over the bugs' scenarios in turn, with the seeds the bugs ran with."""
        scenarios: list[Path] = []
        for b in self.bugs:
            if b.scenario not in scenarios and scenario_problem(b.scenario) is None:
                scenarios.append(b.scenario)
        if not scenarios:
            return []
        return [
            (scenarios[j % len(scenarios)], self.args.seed_base + j // len(scenarios))
            for j in range(self.args.clean_runs)
        ]

    def run_clean(self) -> None:
        plan = self.clean_plan()
        if not plan:
            return
        t = time.monotonic()
        image = build_image(None)
        say(
            f"[clean] image {image} ({time.monotonic() - t:.0f} s); {len(plan)} run(s) of the unmodified broker"
        )
        for j, (scenario, seed) in enumerate(plan, start=1):
            stopped: Interrupted | None = None
            try:
                rec = run_scenario(
                    scenario, seed, None, self.store / "clean" / f"{scenario.stem}-seed-{seed}"
                )
            except Interrupted as stop:
                rec, stopped = stop.record, stop
            self.clean.append(rec)
            alarm = " <- FALSE ALARM" if rec.failed else ""
            say(
                f"[clean] run {j}/{len(plan)} {scenario.stem} seed {seed}: {rec.verdict} "
                f"({rec.counts_text()}) {rec.seconds:.0f} s{alarm}"
                + (f" [{rec.detail}]" if rec.detail else "")
            )
            if stopped is not None:
                raise stopped
            self.write()

    # -- output
    def summary(self) -> dict[str, Any]:
        ran = [r for r in self.results if r.status in ("caught", "missed")]
        caught = [r for r in ran if r.status == "caught"]
        ttd = [r.seconds_to_detection for r in caught if r.seconds_to_detection is not None]
        return {
            "bugs_run": len(ran),
            "bugs_caught": len(caught),
            "bugs_caught_as_expected": sum(1 for r in caught if r.verdict == r.bug["expect"]),
            "bugs_waiting": [r.bug["label"] for r in self.results if r.status == "waiting"],
            "bugs_error": [r.bug["label"] for r in self.results if r.status == "error"],
            "median_seconds_to_detection": round(statistics.median(ttd), 1) if ttd else None,
            "max_runs_to_detection": max((r.runs_to_detection or 0) for r in caught) if caught else None,
            "clean_runs": sum(1 for c in self.clean if c.verdict != "interrupted"),
            "clean_durable": sum(1 for c in self.clean if c.verdict == "durable"),
            "false_alarms": sum(1 for c in self.clean if c.failed),
            "clean_inconclusive": sum(1 for c in self.clean if c.verdict in ("error", "unknown")),
            "general_run": sum(1 for r in self.results if r.general),
            "general_caught": sum(1 for r in self.results if r.general and r.general["status"] == "caught"),
            "explore_run": sum(1 for r in self.results if r.explore),
            "explore_caught": sum(1 for r in self.results if r.explore and r.explore["status"] == "caught"),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.origin.record(),
            "settings": {
                "runs": self.args.runs,
                "clean_runs": self.args.clean_runs,
                "seed_base": self.args.seed_base,
                "scenario": self.args.scenario,
                "store": _rel(self.store),
                "general": [_rel(p) for p in self.general] if self.args.general else None,
                "explore_minutes": self.args.explore,
                "checkers": self.args.checker,
            },
            "interrupted": self.interrupted,
            "summary": self.summary(),
            "bugs": [{**asdict(r), "runs": [asdict(x) for x in r.runs]} for r in self.results],
            "clean": [asdict(c) for c in self.clean],
        }

    def write(self) -> None:
        write_report(self.args.out, self.to_json(), markdown)


def _bug_dict(bug: Bug) -> dict[str, Any]:
    return {
        "id": bug.id,
        "name": bug.name,
        "label": bug.label,
        "area": bug.area,
        "patch": _rel(bug.patch),
        "scenario": _rel(bug.scenario),
        "expect": bug.expect,
        "description": bug.description,
        "precedent": bug.precedent,
    }


def markdown(data: dict[str, Any]) -> str:
    s = data["summary"]
    facts = data["facts"]
    lines = ["# Detection score: planted bugs in the reference broker", ""]
    if data["interrupted"]:
        lines += ["**Interrupted**: what was measured until Ctrl-C.", ""]
    ttd = s["median_seconds_to_detection"]
    lines += [
        f"- caught: **{s['bugs_caught']} of {s['bugs_run']}** planted bugs run "
        f"(within {data['settings']['runs']} seeded run(s) each; {s['bugs_caught_as_expected']} with the "
        f"expected verdict), worst case {s['max_runs_to_detection'] or '-'} run(s)",
        f"- median time to detection: {f'{ttd:.0f} s' if ttd is not None else '-'} (from the start of a bug's "
        "first run to the verdict of the run that caught it; image builds excluded)",
        f"- clean control (unmodified broker, same scenarios and seeds): {s['clean_durable']} of "
        f"{s['clean_runs']} runs durable, **{s['false_alarms']} false alarm(s)**, "
        f"{s['clean_inconclusive']} inconclusive (unknown or harness error)",
    ]
    if s["bugs_waiting"]:
        lines.append(
            f"- waiting (scenario needs harness features not in this checkout): "
            f"{', '.join(s['bugs_waiting'])}"
        )
    if s["bugs_error"]:
        lines.append(f"- not run (patch or image error): {', '.join(s['bugs_error'])}")
    lines += [
        "",
        "| bug | area | scenario | expected | result | runs | time to detection | verdict | counts |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in data["bugs"]:
        runs = b["runs"]
        last = runs[-1] if runs else None
        counts = shown_counts(last["counts"]) if last else ""
        t = b["seconds_to_detection"]
        lines.append(
            f"| {b['bug']['label']} | {b['bug']['area']} | `{Path(b['bug']['scenario']).name}` | "
            f"{b['bug']['expect']} | {b['status']} | {len(runs)} | {f'{t:.0f} s' if t is not None else '-'} "
            f"| {last['verdict'] if last else '-'} | {counts or '-'} |"
        )
    lines += general_markdown(data)
    lines += clean_markdown(data["clean"])
    lines += ["", "Every run (run directories under the store named in the JSON):", ""]
    for b in data["bugs"]:
        for r in b["runs"]:
            lines.append(
                f"- {b['bug']['label']} seed {r['seed']}: {r['verdict']} in {r['seconds']:.0f} s "
                f"(`{r['run_dir']}`)" + (f": {r['detail']}" if r["detail"] else "")
            )
        if b["status"] in ("waiting", "error"):
            lines.append(f"- {b['bug']['label']}: {b['status']}: {b['detail']}")
    lines += ["", "The bugs (`bench/planted/catalogue.yaml`):", ""]
    for b in data["bugs"]:
        bug = b["bug"]
        lines.append(
            f"- **{bug['label']}** ({bug['area']}): {bug['description']} *Precedent:* {bug['precedent']}"
        )
    lines += [
        "",
        "## Machine and command",
        "",
        facts_markdown(facts, data["command"]).rstrip(),
        f"- wall time: {data['wall_seconds']:.0f} s",
        "",
    ]
    return "\n".join(lines)


def clean_markdown(clean: list[dict[str, Any]]) -> list[str]:
    """The clean control runs' table, and a line for each that was not durable."""
    if not clean:
        return []
    lines = [
        "",
        "Clean control runs:",
        "",
        "| scenario | seed | verdict | counts | seconds |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in clean:
        counts = shown_counts(c["counts"])
        lines.append(
            f"| `{Path(c['scenario']).name}` | {c['seed']} | {c['verdict']} | {counts or '-'} | "
            f"{c['seconds']:.0f} |"
        )
    for c in clean:
        if c["verdict"] != "durable":
            lines.append(
                f"\nNot durable on the unmodified broker: `{Path(c['scenario']).name}` seed {c['seed']}, "
                f"{c['verdict']}, run directory `{c['run_dir']}`"
                + (f": {c['detail']}" if c["detail"] else "")
            )
    return lines


def general_markdown(data: dict[str, Any]) -> list[str]:
    """Targeted, general-suite and explore detection side by side, when either of the last two ran."""
    bugs = [b for b in data["bugs"] if b.get("general") or b.get("explore")]
    if not bugs:
        return []
    st = data["settings"]
    suite = ", ".join(f"`{Path(p).name}`" for p in st.get("general") or []) or "-"
    s = data["summary"]
    lines = [
        "",
        "## Beyond the targeted scenario",
        "",
        f"General suite: {suite} (in this order, seeds from {st['seed_base']}, {st['runs']} each, until a run "
        f"is not durable{', checked by ' + ', '.join(st['checkers']) if st.get('checkers') else ''}): "
        f"caught **{s['general_caught']} of {s['general_run']}**."
        + (
            f" Explore: `brokerchaos explore` from each general scenario in turn, {st['explore_minutes']:g} min "
            f"each, a fresh corpus: caught **{s['explore_caught']} of {s['explore_run']}**."
            if st.get("explore_minutes")
            else ""
        ),
    ]
    if any(b["status"] == "not run" for b in bugs):
        lines += [
            "",
            "The targeted runs were skipped here (`--skip-targeted`); each bug's targeted detection is in "
            "the full self-test's results (`bench/results/detection.md`).",
        ]
    lines += [
        "",
        "| bug | targeted scenario | targeted | general suite | explore |",
        "| --- | --- | --- | --- | --- |",
    ]
    for b in bugs:
        t = b["seconds_to_detection"]
        targeted = f"{b['status']}" + (f" in {t:.0f} s" if t is not None else "")
        cells = []
        for key, unit in (("general", "runs"), ("explore", "searches")):
            g = b.get(key)
            if not g:
                cells.append("-")
                continue
            n = len(g[unit])
            by = f" by `{Path(g['by']).name}`" if g.get("by") else ""
            took = f" in {g['seconds']:.0f} s" if g.get("seconds") is not None else ""
            cells.append(f"{g['status']}{by}{took} ({n} {unit})")
        lines.append(
            f"| {b['bug']['label']} | `{Path(b['bug']['scenario']).name}` | {targeted} | {cells[0]} | {cells[1]} |"
        )
    lines += ["", "General-suite runs and explore searches:", ""]
    for b in bugs:
        for r in (b.get("general") or {}).get("runs", []):
            lines.append(
                f"- {b['bug']['label']} general `{Path(r['scenario']).name}` seed {r['seed']}: {r['verdict']} "
                f"in {r['seconds']:.0f} s (`{r['run_dir']}`)"
            )
        for e in (b.get("explore") or {}).get("searches", []):
            found = (
                f"{e['verdict']}: {e['failing_schedule']} (`{e['run_dir']}`)"
                if e["verdict"]
                else "no failure"
            )
            lines.append(
                f"- {b['bug']['label']} explore from `{Path(e['scenario']).name}`: {e['runs']} run(s), "
                f"{e['cells']} cells, {e['seconds']:.0f} s, {found}"
            )
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.detection",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bugs", help="comma-separated bug ids or names (default: every bug in the catalogue)")
    p.add_argument("--runs", type=int, default=3, help="seeded runs per bug at most (default 3)")
    p.add_argument(
        "--clean-runs", type=int, default=20, help="runs of the unmodified broker (default 20; 0: none)"
    )
    p.add_argument("--seed-base", type=int, default=100, help="seed of each bug's first run (default 100)")
    p.add_argument(
        "--scenario",
        help="run the bugs (and the clean control) on this scenario instead of each bug's own, "
        "e.g. the same faults under another filesystem model",
    )
    p.add_argument(
        "--general",
        action="store_true",
        help="also run each bug against the general suite (the catalogue's general scenarios)",
    )
    p.add_argument(
        "--explore",
        type=float,
        metavar="MINUTES",
        help="also search for each bug with brokerchaos explore from each general scenario, MINUTES each",
    )
    p.add_argument("--skip-targeted", action="store_true", help="skip the runs of each bug's own scenario")
    p.add_argument(
        "--checker",
        action="append",
        help="checker(s) every run uses instead of its scenario's (e.g. python, the Spark checker's twin)",
    )
    add_store_and_out(p, "detection", "detection")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    if args.clean_runs < 0:
        p.error("--clean-runs must be 0 or more")
    if args.seed_base < 0:
        p.error("--seed-base must be 0 or more")
    if args.explore is not None and args.explore <= 0:
        p.error("--explore must be a positive number of minutes")
    return args


def select(bugs: list[Bug], wanted: str | None) -> list[Bug]:
    if not wanted:
        return bugs
    out: list[Bug] = []
    for w in (x.strip() for x in wanted.split(",") if x.strip()):
        match = [b for b in bugs if w in (b.id, b.name, b.label)]
        if not match:
            raise BrokerChaosError(f"--bugs: no bug {w!r}; known: {', '.join(b.label for b in bugs)}")
        out.extend(b for b in match if b not in out)
    return out


def on_scenario(bugs: list[Bug], scenario: str | None) -> list[Bug]:
    """The bugs, each run on ``scenario`` instead of its own (None: unchanged)."""
    if not scenario:
        return bugs
    path = Path(scenario).resolve()
    if not path.is_file():
        raise BrokerChaosError(f"--scenario: {scenario} does not exist")
    return [dataclasses.replace(b, scenario=path) for b in bugs]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bugs = on_scenario(select(load_catalogue(), args.bugs), args.scenario)
    store = stamped_store(args.store, "detection")
    bench = Bench(bugs, args, store)
    say(
        f"{len(bugs)} planted bug(s), up to {args.runs} run(s) each, then {args.clean_runs} clean run(s); "
        f"{load_line()}; store {store}"
    )

    def work() -> None:
        for bug in bugs:
            bench.run_bug(bug)
            bench.write()
        bench.run_clean()

    bench.interrupted = measure(work, bench.write, (Interrupted, KeyboardInterrupt))
    s = bench.summary()
    say(
        f"caught {s['bugs_caught']} of {s['bugs_run']} bugs run; median time to detection "
        f"{s['median_seconds_to_detection']} s; clean {s['clean_durable']}/{s['clean_runs']} durable, "
        f"{s['false_alarms']} false alarm(s) -> {Path(args.out).with_suffix('.md')}"
    )
    if bench.interrupted:
        return 130
    return 0 if s["bugs_caught"] == s["bugs_run"] and not s["false_alarms"] else 1


if __name__ == "__main__":
    run_cli(main)
