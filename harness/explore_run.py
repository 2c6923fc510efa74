"""``brokerchaos explore`` on a cluster: each candidate of ``harness.explore.Search`` as an ordinary run.

The corpus directory (``--corpus``, default ``<store>/explore/<scenario>``) holds
``corpus.json`` (kept schedules, the cells each reached, every run), ``kept/<id>.yaml`` (each
kept schedule as a ready scenario), the runs under ``runs/``, and after a failure
``failure.yaml`` and the shrink's directory ``shrink/``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from harness.errors import BrokerChaosError
from harness.explore import Corpus, Outcome, Search, pool_of
from harness.explore_cells import heal_lateness, run_cells, run_shapes
from harness.host import Host
from harness.nemesis import Plan, plan
from harness.progress import say
from harness.scenario import Scenario
from harness.shrink import Schedule
from harness.shrink_run import LOSS_CLASSES, compact_scenario, schedule_scenario
from harness.spec.fault import Fault


class Explore:
    def __init__(
        self,
        host: Host,
        scenario: Scenario,
        corpus_dir: Path,
        *,
        budget_s: float,
        seed: int | None = None,
        extra_faults: Sequence[str] = (),
        max_runs: int | None = None,
        checkers: tuple[str, ...] | None = None,
        until: frozenset[str] | None = None,
        until_events: frozenset[str] = frozenset(),
    ) -> None:
        if budget_s <= 0:
            raise BrokerChaosError("--budget must be a positive number of minutes")
        self.host = host
        self.base = scenario
        self.faults: Mapping[str, type[Fault]] = host.registry.faults
        plugin = host.broker(scenario.broker.plugin)
        self.pool = pool_of(scenario, self.faults, extra_faults)
        if not self.pool:
            raise BrokerChaosError(
                f"explore: scenario {scenario.name!r} names no fault kinds; give some with --faults KIND,..."
            )
        for kind in sorted(self.pool):
            missing = self.faults[kind].requires - frozenset(plugin.capabilities)
            if missing:
                raise BrokerChaosError(
                    f"explore: fault {kind!r} needs broker capabilities {sorted(missing)} "
                    f"that plugin {plugin.name!r} does not declare"
                )
        known = {e.name for e in plugin.log_events}
        if until_events - known:
            raise BrokerChaosError(
                f"--until-event: plugin {plugin.name!r} reads no event {sorted(until_events - known)} "
                f"from its logs; it reads {', '.join(sorted(known)) or 'none'}"
            )
        nodes = [f"n{i}" for i in range(1, scenario.broker.nodes + 1)]
        w = scenario.workload
        self.start = Schedule(
            steps=tuple(plan(scenario, self.faults, nodes).steps),
            duration=w.duration,
            rate=w.rate,
            nodes=scenario.broker.nodes,
        )
        self.dir = corpus_dir
        self.corpus = Corpus.open(corpus_dir, scenario.name, scenario.seed if seed is None else seed)
        self.checkers = checkers
        self.search = Search(
            self.corpus,
            self.start,
            self.faults,
            self.pool,
            self.execute,
            budget_s=budget_s,
            max_runs=max_runs,
            until=until,
            until_events=until_events,
            say=lambda line: say("explore", line),
        )

    def scenario_for(self, s: Schedule, name: str | None = None) -> Scenario:
        sc = schedule_scenario(self.base, s, self.faults)
        return dataclasses.replace(sc, name=name) if name else sc

    def execute(self, s: Schedule, how: str, iteration: int) -> Outcome:
        from harness.runner import Run

        sc = self.scenario_for(s)
        t0 = time.monotonic()
        try:
            run = Run(self.host, sc, self.dir / "runs", replay=Plan(list(s.steps)), checkers=self.checkers)
            results = run.execute()
        except BrokerChaosError as exc:  # this candidate could not run: no coverage, not a failure
            return Outcome("error", set(), None, time.monotonic() - t0, str(exc))
        assert run.dir is not None
        verdict = str(results.get("verdict", results.get("valid")))
        due = {p.fault_id: p.at + p.hold for p in s.steps if p.hold is not None}
        return Outcome(
            verdict,
            run_cells(sc.to_dict(), results),
            str(run.dir.path),
            time.monotonic() - t0,
            late_s=heal_lateness(results, due),
            shapes=run_shapes(sc.to_dict(), results),
        )

    def write_kept(self) -> None:
        kept = self.dir / "kept"
        kept.mkdir(parents=True, exist_ok=True)
        for e in self.corpus.entries:
            path = kept / f"{e.id}.yaml"
            if path.exists():
                continue
            head = f"# Kept by `brokerchaos explore` ({e.how}): {len(e.new)} new cell(s); run {e.run_dir}\n"
            path.write_text(
                head + _yaml(compact_scenario(self.scenario_for(e.schedule), f"{self.base.name}-{e.id}"))
            )

    def run(self) -> Outcome | None:
        from harness.cluster import docker_client

        docker_client()  # Docker down: one line now, not an error per run
        self.dir.mkdir(parents=True, exist_ok=True)
        say(
            "explore",
            f"{self.base.name}: corpus {self.dir} ({len(self.corpus.entries)} schedule(s), "
            f"{len(self.corpus.cells)} cells, {self.corpus.iteration} run(s) so far); kinds "
            f"{', '.join(sorted(self.pool))}; budget {self.search.budget_s / 60:g} min",
        )
        try:
            out = self.search.run()
        finally:
            self.corpus.save()
            self.write_kept()
        if out is not None:
            fail = self.corpus.failure or {}
            sc = self.scenario_for(
                Schedule.from_dict(fail["schedule"]), name=f"{self.base.name}-explore-failure"
            )
            text = (
                f"# The first failing schedule `brokerchaos explore` found ({out.verdict}), run {fail.get('iteration')}\n"
                f"# Exact replay: brokerchaos run {self.dir / 'failure.yaml'} --replay {out.run_dir}\n"
            )
            (self.dir / "failure.yaml").write_text(text + _yaml(compact_scenario(sc, sc.name)))
        return out

    def shrink(self, out: Outcome, budget_s: float, trials: int) -> Any:
        """Hand the failing run to ``brokerchaos shrink`` (which takes LOST and INTEGRITY runs)."""
        from harness.shrink_run import Shrink

        if out.verdict not in LOSS_CLASSES or out.run_dir is None:
            say(
                "explore",
                f"not shrinking: shrink takes {' or '.join(LOSS_CLASSES)} runs and this one is {out.verdict}",
            )
            return None
        job = Shrink(self.host, out.run_dir, self.dir / "shrink", trials=trials, budget_s=budget_s)
        job.run()
        return job


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
