"""``brokerchaos shrink``: from a stored failing run to the smallest schedule that still fails.

The schedule starts as the fault actions the run recorded (``plan_from_history``: what
was applied, when, for how long, on what) with the run's workload and cluster. Each
candidate the search (``harness.shrink``) proposes becomes a scenario with those actions
as its explicit schedule and runs as an ordinary run, replaying the actions exactly,
with the original seed, up to ``trials`` times: it fails if any trial ends in the
original's loss class. Every trial is a normal run directory under the shrink's own
directory, so any of them can be analysed, graded or replayed like any run.

The shrink directory holds ``shrunk.yaml`` (the minimal schedule as a ready scenario),
``shrink.json`` (every candidate, its trials and outcome) and ``shrink.html`` (both
schedules on one timeline, the trials of each step, the failure the minimal one
reproduced). They are rewritten whenever the best schedule improves, so Ctrl-C or the
budget leave the best so far on disk.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from harness import scenario as scenario_mod
from harness.errors import BrokerChaosError, ScenarioError
from harness.host import Host
from harness.nemesis import Plan, PlannedFault, plan_from_history
from harness.progress import say
from harness.scenario import Scenario, Step
from harness.shrink import PASSES, OutOfBudget, Schedule, StopSearch, search
from harness.spec.fault import Fault
from harness.spec.results import missing_class, row_class
from harness.spec.rundir import RESULTS_JSON, SCENARIO_JSON
from harness.store import RunDir

LOSS_CLASSES = ("LOST", "INTEGRITY")


@dataclasses.dataclass
class Trial:
    run_dir: str | None
    verdict: str
    seconds: float
    error: str | None = None


@dataclasses.dataclass
class Candidate:
    """One schedule the search asked about, and what its trials said."""

    number: int
    what: str
    schedule: Schedule
    trials: list[Trial] = dataclasses.field(default_factory=list)
    fails: bool = False
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "what": self.what,
            "schedule": schedule_dict(self.schedule),
            "trials": [vars(t) for t in self.trials],
            "fails": self.fails,
            "cached": self.cached,
        }


def scenario_params(p: PlannedFault, faults: Mapping[str, type[Fault]]) -> dict[str, Any]:
    """The action's parameters a scenario may give (its kind's ``params_schema``)."""
    schema = faults[p.kind].params_schema
    return {k: v for k, v in p.params.items() if k in schema}


def schedule_scenario(base: Scenario, s: Schedule, faults: Mapping[str, type[Fault]]) -> Scenario:
    """``base`` with ``s``'s actions as its explicit steps (no random draws), its workload and cluster."""
    steps = tuple(
        Step(at=p.at, fault=p.kind, hold=p.hold, params=scenario_params(p, faults)) for p in s.steps
    )
    return dataclasses.replace(
        base,
        broker=dataclasses.replace(base.broker, nodes=s.nodes),
        workload=dataclasses.replace(base.workload, duration=s.duration, rate=s.rate),
        nemesis=dataclasses.replace(base.nemesis, schedule=steps, random=None),
        source=None,
    )


def compact_scenario(sc: Scenario, name: str) -> dict[str, Any]:
    """``sc`` with explicit steps as a short scenario file's data: what differs from the defaults."""
    d = sc.to_dict()
    defaults = scenario_mod.WorkloadSection()
    workload = {
        k: v
        for k, v in d["workload"].items()
        if k in ("duration", "rate") or v != getattr(defaults, k) and k != "consumer"
    }
    consumer = {
        k: v for k, v in d["workload"]["consumer"].items() if v != getattr(scenario_mod.ConsumerSection(), k)
    }
    if consumer:
        workload["consumer"] = consumer
    schedule = [
        {"at": s["at"], "fault": s["fault"], "hold": s["hold"], "params": s["params"]}
        for s in d["nemesis"]["schedule"]
    ]
    out: dict[str, Any] = {
        "name": name,
        "seed": sc.seed,
        "broker": {k: v for k, v in d["broker"].items() if k != "lazyfs" or v},
        "workload": workload,
        "nemesis": {"schedule": schedule, "settle": d["nemesis"]["settle"]},
    }
    if d["checkers"]:
        out["checkers"] = d["checkers"]
    budgets = {k: v for k, v in d["budgets"].items() if v is not None}
    if budgets:
        out["budgets"] = budgets
    return out


def schedule_dict(s: Schedule) -> dict[str, Any]:
    return s.to_dict()


def open_failing(run_dir: str | Path) -> tuple[RunDir, dict[str, Any], dict[str, Any]]:
    """The stored run, its scenario.json and results.json; a run that did not fail is refused in one line."""
    rd = RunDir.open(run_dir)
    if not (rd.path / RESULTS_JSON).exists():
        raise BrokerChaosError(
            f"{run_dir} has no results.json: check it first with `brokerchaos analyze {run_dir}`"
        )
    results = rd.read_json(RESULTS_JSON)
    verdict = str(results.get("verdict", results.get("valid")))
    if verdict not in LOSS_CLASSES:
        raise BrokerChaosError(
            f"{run_dir} is {verdict}, not a failure: shrink takes a run whose verdict is "
            f"{' or '.join(LOSS_CLASSES)}"
        )
    return rd, rd.read_json(SCENARIO_JSON), results


class Shrink:
    def __init__(
        self,
        host: Host,
        run_dir: str | Path,
        out: Path,
        *,
        trials: int = 2,
        budget_s: float = 1800.0,
        passes: tuple[str, ...] = PASSES,
    ) -> None:
        if trials < 1:
            raise BrokerChaosError("--trials must be at least 1")
        if budget_s <= 0:
            raise BrokerChaosError("--budget must be a positive number of minutes")
        self.host = host
        self.source, stored, self.original_results = open_failing(run_dir)
        self.loss_class = str(self.original_results["verdict"])
        self.base = scenario_mod.from_dict(stored["scenario"], source=str(self.source.path / SCENARIO_JSON))
        self.faults: Mapping[str, type[Fault]] = host.registry.faults
        recorded = plan_from_history(self.source.history_jsonl)
        missing = sorted({p.kind for p in recorded.steps} - set(self.faults))
        if missing:
            raise BrokerChaosError(
                f"the run used fault kinds {missing} that no loaded plugin provides (-p MODULE)"
            )
        w = self.base.workload
        self.original = Schedule(
            steps=tuple(recorded.steps), duration=w.duration, rate=w.rate, nodes=self.base.broker.nodes
        )
        # The checkers that judged the original (``--checker`` may have overridden the scenario's).
        self.checkers = tuple((self.original_results.get("checkers") or {}).keys()) or None
        self.trials = trials
        self.budget_s = budget_s
        self.passes = passes
        self.out = out
        self.best = self.original
        self.best_run: str | None = str(self.source.path)
        self.candidates: list[Candidate] = []
        self.cache: dict[str, Candidate] = {}
        self.started = 0.0
        self.finished: str | None = None  # complete | budget | stopped | interrupted
        self.stopped: str | None = None  # why the search stopped early, when a candidate could not run

    # -- one candidate -------------------------------------------------------------------------

    def scenario_for(self, s: Schedule) -> Scenario:
        """The candidate as a scenario: its actions as explicit steps (the trials replay them exactly)."""
        return schedule_scenario(self.base, s, self.faults)

    def scenario_params(self, p: PlannedFault) -> dict[str, Any]:
        return scenario_params(p, self.faults)

    def exact(self, s: Schedule) -> list[bool]:
        """Per action: whether planning ``shrunk.yaml`` gives back exactly the recorded parameters."""
        nodes = [f"n{i}" for i in range(1, s.nodes + 1)]
        out = []
        for i, p in enumerate(s.steps, start=1):
            try:
                got = self.faults[p.kind].resolve(
                    self.scenario_params(p), nodes, random.Random(f"{self.base.seed}:fault:{i}")
                )
            except ScenarioError:
                got = None
            out.append(got == p.params)
        return out

    def test(self, s: Schedule, what: str) -> bool:
        key = s.key()
        if key in self.cache:
            return self.cache[key].fails
        if time.monotonic() - self.started > self.budget_s:
            raise OutOfBudget
        from harness.runner import Run

        cand = Candidate(len(self.candidates) + 1, what, s)
        self.candidates.append(cand)
        self.cache[key] = cand
        sc = self.scenario_for(s)
        say("shrink", f"candidate {cand.number}: {what}: {s.describe()}")
        for k in range(1, self.trials + 1):
            t0 = time.monotonic()
            try:
                run = Run(
                    self.host, sc, self.out / "trials", replay=Plan(list(s.steps)), checkers=self.checkers
                )
                results = run.execute()
                assert run.dir is not None
                trial = Trial(
                    str(run.dir.path),
                    str(results.get("verdict", results.get("valid"))),
                    round(time.monotonic() - t0, 1),
                )
            except BrokerChaosError as exc:  # this candidate could not run: it did not show the failure
                trial = Trial(None, "error", round(time.monotonic() - t0, 1), str(exc))
            cand.trials.append(trial)
            cand.fails = trial.verdict == self.loss_class
            say(
                "shrink",
                f"candidate {cand.number} trial {k}/{self.trials}: {trial.verdict} ({trial.seconds:.0f} s)"
                + (f" [{trial.error}]" if trial.error else ""),
            )
            if cand.fails:
                self.best_run = trial.run_dir
                break
        self.write()
        if all(t.verdict == "error" for t in cand.trials):
            # Not evidence either way (an image that does not build, Docker gone): stop rather
            # than read "could not run" as "does not fail".
            self.stopped = f"candidate {cand.number} could not run: {cand.trials[-1].error}"
            raise StopSearch(self.stopped)
        return cand.fails

    def on_best(self, s: Schedule) -> None:
        self.best = s
        say(
            "shrink",
            f"best so far ({len(self.candidates)} candidates, "
            f"{sum(len(c.trials) for c in self.candidates)} trials): {s.describe()}",
        )
        self.write()

    # -- the whole search ----------------------------------------------------------------------

    def run(self) -> Schedule:
        from harness.cluster import docker_client

        docker_client()  # Docker down: one line now, not an error per trial
        self.out.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        say(
            "shrink",
            f"{self.source.path}: {self.loss_class}; {len(self.original.steps)} fault action(s); "
            f"up to {self.trials} trial(s) per candidate, budget {self.budget_s / 60:g} min -> {self.out}",
        )
        say("shrink", f"original: {self.original.describe()}")
        previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM between trials too: keep the best
        try:
            best, complete = search(
                self.original,
                self.test,
                passes=self.passes,
                settings=self.base.broker.settings,
                on_best=self.on_best,
            )
            self.best = best
            self.finished = "complete" if complete else ("stopped" if self.stopped else "budget")
        except KeyboardInterrupt:
            self.finished = "interrupted"
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.write()
        return self.best

    # -- outputs -------------------------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        return round(time.monotonic() - self.started, 1) if self.started else 0.0

    def shrunk_scenario(self) -> dict[str, Any]:
        return compact_scenario(self.scenario_for(self.best), f"{self.base.name}-shrunk")

    def write(self) -> None:
        if not self.out.exists():
            return
        from harness.shrink_report import render

        data = self.shrunk_scenario()
        exact = self.exact(self.best)
        lines = [
            f"# The smallest schedule found that still ends in {self.loss_class}, shrunk from",
            f"# {self.source.path} ({len(self.original.steps)} fault actions, {self.original.duration:g} s).",
            f"# Search: {self.finished or 'in progress'}; {len(self.candidates)} candidates, "
            f"{sum(len(c.trials) for c in self.candidates)} trials, {self.elapsed:.0f} s.",
            f"# Run it:        brokerchaos run {self.out / 'shrunk.yaml'}",
        ]
        if self.best_run:
            lines.append(
                f"# Exact replay:  brokerchaos run {self.out / 'shrunk.yaml'} --replay {self.best_run}"
            )
        for p, ok in zip(self.best.steps, exact, strict=True):
            if not ok:
                lines.append(
                    f"# {p.fault_id}: planning these params may not give back exactly what the run applied "
                    f"({p.params}); --replay repeats it exactly"
                )
        text = "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
        scenario_mod.from_dict(yaml.safe_load(text))  # what is written must load
        (self.out / "shrunk.yaml").write_text(text)
        RunDir(self.out).write_json("shrink.json", self.to_dict())
        render(self.out, self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        best_results = None
        if self.best_run and (Path(self.best_run) / RESULTS_JSON).exists():
            best_results = RunDir(Path(self.best_run)).read_json(RESULTS_JSON)
        return {
            "source": str(self.source.path),
            "loss_class": self.loss_class,
            "seed": self.base.seed,
            "scenario": self.base.name,
            "trials_per_candidate": self.trials,
            "budget_s": self.budget_s,
            "passes": list(self.passes),
            "finished": self.finished,
            "stopped": self.stopped,
            "elapsed_s": self.elapsed,
            "written": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "original": schedule_dict(self.original),
            "best": schedule_dict(self.best),
            "best_run": self.best_run,
            "original_results": _summary(self.original_results),
            "best_results": _summary(best_results),
            "candidates": [c.to_dict() for c in self.candidates],
            "trials": sum(len(c.trials) for c in self.candidates),
        }


def _summary(results: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the report shows of a run's results: verdict, counts, and which faults the missing
    messages overlap, under their class (``missing_as``). Per fault, only the listed (capped)
    messages are counted: ``lost_listed`` of ``missing``."""
    if not results:
        return None
    counts = results.get("counts") or {}
    attribution = results.get("attribution") or {}
    per_fault: dict[str, int] = {}
    for m in attribution.get("messages") or []:
        for fid in m.get("fault_ids") or []:
            per_fault[fid] = per_fault.get(fid, 0) + 1
    cls = missing_class(counts)
    return {
        "verdict": results.get("verdict"),
        "reason": results.get("reason"),
        "counts": {k: v for k, v in counts.items() if v},
        "attribution": [r | {"status": row_class(r, counts)} for r in attribution.get("rows") or []],
        "missing_as": cls,
        "missing": int(counts.get(cls) or 0),
        "lost_listed": len(attribution.get("messages") or []),
        "lost_by_fault": per_fault,
    }


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def default_out(store: Path, scenario: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    return store / "shrink" / f"{scenario}-{stamp}"
