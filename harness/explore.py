"""``brokerchaos explore``: a coverage-guided search over fault schedules.

The seeded random nemesis draws each fault on its own; the schedules that expose a bug are often
the ones it never draws, such as a slow disk held while the power is cut. ``explore`` searches
for them the way a coverage-guided fuzzer searches for inputs: it keeps a corpus of schedules,
each kept because its run reached a (feature, fault, event) cell no earlier run had reached
(``harness.explore_cells``), picks one (favouring those that found more and were picked less),
mutates it, runs the mutant as an ordinary run, and keeps it if it reached something new. It
stops at the first failing run (a verdict worse than ``durable`` that is not ``unknown``) and
hands that run to ``brokerchaos shrink``, or when its time budget is spent.

The mutations, one to three stacked per candidate (a fuzzer's havoc stage):

``shift``    one action earlier or later;
``hold``     one action held longer or shorter;
``node``     two nodes exchanged in one action (its target moves; a partition stays one);
``shape``    one of the action's own parameters changed (an enumerated value, a flag, a number
             halved or doubled), the kind re-resolving the rest; values no run has shown first;
``overlap``  an action of a kind from the pool added so that its window overlaps an existing
             action's, preferring pairs of kinds the corpus has never held together;
``align``    actions of a kind from the pool nested inside an existing action's window, on the
             nodes it targets (a partition's smaller side: a kill held inside the isolation of the
             same node) or on each of the others (with a kind's ``sheds_clients`` parameters half
             the time: their client links reset while one node is cut off, the clients pushed
             onto it; on its own nodes, half the time, the clients pushed onto them from the
             nested action's heal to the window's end), begun early and healed with most of the
             window to run (a kind that takes the node's process, on the window's own node: the
             window widened, the action healed in its first fifth) and with the workload time left that earlier runs' heals ran late
             (``Search.reserve``), relations no run has reached four times as likely as
             others, the kind's enumerated parameters drawn afresh; applied last in its stack,
             so no other mutation moves the window it nested in;
``restart``  on the smaller side of an action that splits the cluster (a partition), a kind that
             takes the node's process nested as ``align`` nests one there, and from its heal to
             the window's end the clients of every other node shed: a node brought back inside
             its minority with the workload pushed onto it; applied last, as ``align``;
``push``     the clients pushed onto such a side (every other node's shed), from early in the
             window or from the heal of what took a side node's process there; applied last;
``add``      an action of a kind from the pool at a random time;
``remove``   one action taken out;
``splice``   the early part of this schedule joined to the later part of another corpus entry.

A candidate is a schedule in ``harness.shrink.Schedule``'s terms (concrete actions, each with
its time, hold, kind and resolved parameters) and runs as a replay of exactly those actions, so
the corpus can be rerun, and what fails is what ``shrink`` takes. Every draw comes from a
generator seeded with the search's seed and the candidate's number: the same corpus and seed
propose the same next candidate; the runs themselves are not deterministic, so what the corpus
keeps may differ between two searches.

Nothing here knows a fault kind, broker or checker: the pool is the scenario's own kinds (plus
``--faults``), each with the parameters the scenario gives it, and a run is whatever the
``execute`` function given to ``Search`` does (a Docker run in ``brokerchaos explore``; a pure
function in the tests).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import BrokerChaosError, ScenarioError
from harness.explore_cells import broker_events, targets
from harness.nemesis import PlannedFault, check_overlaps
from harness.shrink import Schedule, node_names
from harness.spec.fault import Fault
from harness.spec.results import EXIT_FAILED, exit_status

MIN_LEAD = 1.0  # seconds of workload before any action
TAIL = 1.0  # seconds of workload after an action's heal
MIN_HOLD = 0.5
#: Mutation operators and their weights when drawn.
OPERATORS: dict[str, float] = {
    "shift": 2,
    "hold": 2,
    "node": 1,
    "shape": 1,
    "overlap": 3,
    "align": 3,
    "restart": 3,
    "push": 1,
    "add": 1,
    "remove": 1,
    "splice": 1,
}
#: The moves that nest in an existing action's window: applied last in a stack (``Mutator.mutate``).
NESTING = ("align", "restart", "push")
#: How much likelier ``align`` draws a relation no run has reached than one reached already.
FRESH_WEIGHT = 4.0
MAX_ERRORS = 3  # consecutive runs that could not run: the search stops
LATE_RUNS = 5  # the runs whose heals' lateness ``Search.reserve`` takes the median of


@dataclass
class Outcome:
    """What one candidate's run gave: its verdict, its cells, where it is stored."""

    verdict: str
    cells: set[str]
    run_dir: str | None = None
    seconds: float = 0.0
    error: str | None = None
    late_s: float | None = None  # how late its latest heal completed (``explore_cells.heal_lateness``)
    shapes: set[str] = field(default_factory=set)  # what it tried (``explore_cells.run_shapes``)

    @property
    def failed(self) -> bool:
        return self.error is None and exit_status(self.verdict) == EXIT_FAILED


@dataclass
class Entry:
    """A schedule the corpus keeps, with the cells its run reached."""

    id: str
    schedule: Schedule
    cells: list[str]
    new: list[str]
    parent: str | None
    how: str
    run_dir: str | None
    verdict: str
    picked: int = 0

    def weight(self) -> float:
        return (1.0 + len(self.new)) / (1.0 + self.picked)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in vars(self).items() if k != "schedule"}
        d["schedule"] = self.schedule.to_dict()
        return d


@dataclass
class Corpus:
    """The search's state, in ``DIR/corpus.json``: kept schedules, cells seen, shapes tried, every run so far.

    A later search with the same directory continues from it (its candidate numbers, time and
    cells go on from where the last one stopped).
    """

    path: Path
    scenario: str
    seed: int
    entries: list[Entry] = field(default_factory=list)
    cells: dict[str, str] = field(default_factory=dict)  # cell -> the run that first reached it
    shapes: dict[str, str] = field(default_factory=dict)  # fault shape -> the run that first tried it
    runs: list[dict[str, Any]] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)  # Schedule.key() of every candidate run
    elapsed_s: float = 0.0  # search time over every session
    failure: dict[str, Any] | None = None

    FILE = "corpus.json"

    @classmethod
    def open(cls, path: Path, scenario: str, seed: int) -> Corpus:
        f = path / cls.FILE
        if not f.exists():
            return cls(path, scenario, seed)
        data = json.loads(f.read_text())
        if data.get("scenario") != scenario:
            raise BrokerChaosError(
                f"{path} holds the corpus of scenario {data.get('scenario')!r}, not {scenario!r}: "
                "give another --corpus"
            )
        entries = [
            Entry(**{**e, "schedule": Schedule.from_dict(e["schedule"])}) for e in data.get("entries", [])
        ]
        return cls(
            path,
            scenario,
            int(data.get("seed", seed)),
            entries=entries,
            cells=dict(data.get("cells", {})),
            shapes=dict(data.get("shapes", {})),
            runs=list(data.get("runs", [])),
            tried=set(data.get("tried", [])),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            failure=data.get("failure"),
        )

    @property
    def iteration(self) -> int:
        return len(self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "written": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "elapsed_s": round(self.elapsed_s, 1),
            "entries": [e.to_dict() for e in self.entries],
            "cells": dict(sorted(self.cells.items())),
            "shapes": dict(sorted(self.shapes.items())),
            "runs": self.runs,
            "tried": sorted(self.tried),
            "failure": self.failure,
        }

    def save(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / (self.FILE + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        tmp.replace(self.path / self.FILE)


# -- mutations -----------------------------------------------------------------------------------


def _window(p: PlannedFault, duration: float) -> tuple[float, float]:
    return p.at, p.at + (p.hold if p.hold is not None else duration)


class Mutator:
    """Schedules near a given one, drawn from ``rng``; each is valid (it plans) or is not returned.

    ``pool``: the fault kinds a mutation may add, each with the scenario-level parameters to
    resolve it from. ``seen_pairs``: (kind held, kind started under it) pairs the corpus has
    tried, so ``overlap`` aims at the others first; ``seen_relations``: the same with ``same`` or
    ``other`` nodes, so ``align`` aims at a relation no run has tried first; ``seen_values``: (kind, ``key=value``) of
    parameters the corpus's runs showed, so ``shape`` sets a value no run has shown first;
    ``reserve``: seconds of workload ``align`` leaves after a nested action's planned heal
    (``Search.reserve``: how late the runs' heals ended).
    """

    def __init__(
        self,
        faults: Mapping[str, type[Fault]],
        pool: Mapping[str, Mapping[str, Any]],
        rng: random.Random,
        seen_pairs: set[tuple[str, str]] | None = None,
        seen_values: set[tuple[str, str]] | None = None,
        seen_relations: set[tuple[str, str, str]] | None = None,
        reserve: float = 0.0,
    ) -> None:
        self.faults = faults
        self.pool = dict(pool)
        self.rng = rng
        self.seen_pairs = seen_pairs or set()
        self.seen_values = seen_values  # None: nothing known, no value is preferred
        self.seen_relations = seen_relations or set()
        self.reserve = reserve  # seconds of workload ``align`` leaves after a nested action's heal

    def _any_step(self, s: Schedule) -> tuple[int, PlannedFault]:
        """A step of ``s`` drawn uniformly, with its index (``s`` has steps)."""
        i = self.rng.randrange(len(s.steps))
        return i, s.steps[i]

    # each operator returns (schedule, what) or None when it does not apply
    def shift(self, s: Schedule, other: Schedule | None) -> tuple[Schedule, str] | None:
        if not s.steps:
            return None
        i, p = self._any_step(s)
        delta = self.rng.choice([-1, 1]) * self.rng.uniform(0.5, max(1.0, s.duration / 4))
        at = round(min(max(MIN_LEAD, p.at + delta), s.duration - TAIL - MIN_HOLD), 3)
        if at == p.at:
            return None
        return s.with_step(i, at=at), f"shift {p.fault_id} {p.at:g}s->{at:g}s"

    def hold(self, s: Schedule, other: Schedule | None) -> tuple[Schedule, str] | None:
        if not s.steps:
            return None
        i, p = self._any_step(s)
        old = p.hold if p.hold is not None else s.duration - p.at
        hold = round(old * self.rng.choice([0.25, 0.5, 2.0, 4.0]), 3)
        hold = max(MIN_HOLD, min(hold, s.duration - TAIL - p.at))
        if hold == p.hold:
            return None
        return s.with_step(i, hold=hold), f"hold {p.fault_id} {old:g}s->{hold:g}s"

    def node(self, s: Schedule, other: Schedule | None) -> tuple[Schedule, str] | None:
        cluster = [f"n{k}" for k in range(1, s.nodes + 1)]
        targeted = [i for i, p in enumerate(s.steps) if node_names(p.params)]
        if len(cluster) < 2 or not targeted:
            return None
        i = self.rng.choice(targeted)
        p = s.steps[i]
        old = self.rng.choice(sorted(node_names(p.params)))
        new = self.rng.choice([n for n in cluster if n != old])
        params = _swap(p.params, old, new)
        return s.with_step(i, params=params), f"node {p.fault_id} {old}<->{new}"

    def shape(self, s: Schedule, other: Schedule | None) -> tuple[Schedule, str] | None:
        if not s.steps:
            return None
        i, p = self._any_step(s)
        cls = self.faults[p.kind]
        fresh = [
            (j, k, v) for j, q in enumerate(s.steps) for k, v in self._values(q) if self._unseen(q.kind, k, v)
        ]
        if fresh:  # a value of a parameter no run has shown yet, on any action
            i, key, value = self.rng.choice(fresh)
            p = s.steps[i]
            cls = self.faults[p.kind]
        else:
            choices = self._values(p)
            for key, allowed in cls.params_schema.items():
                if (
                    allowed is float
                    and isinstance(p.params.get(key), int | float)
                    and not key.endswith("seed")
                ):
                    choices += [(key, p.params[key] * 2), (key, p.params[key] / 2)]
            if not choices:
                return None
            key, value = self.rng.choice(choices)
        base = dict(self.pool.get(p.kind, {}))
        for k in ("node", "nodes"):
            if k in p.params and k in cls.params_schema:
                base[k] = p.params[k]
        base[key] = value
        try:
            params = cls.resolve(base, [f"n{k}" for k in range(1, s.nodes + 1)], self.rng)
        except ScenarioError:
            return None
        return s.with_step(i, params=params), f"shape {p.fault_id} {key}={value}"

    def _values(self, p: PlannedFault) -> list[tuple[str, Any]]:
        """The other values of the action's enumerated and boolean parameters."""
        out: list[tuple[str, Any]] = []
        for key, allowed in self.faults[p.kind].params_schema.items():
            if key.endswith("seed") or key in ("node", "nodes"):
                continue
            if isinstance(allowed, tuple) and len(allowed) > 1:
                out += [(key, v) for v in allowed if v != p.params.get(key)]
            elif allowed is bool:
                out.append((key, not p.params.get(key, False)))
        return out

    def _unseen(self, kind: str, key: str, value: Any) -> bool:
        return self.seen_values is not None and (kind, f"{key}={str(value).lower()}") not in self.seen_values

    def _new_step(
        self, kind: str, at: float, hold: float, nodes: int, given: Mapping[str, Any] | None = None
    ) -> PlannedFault | None:
        try:
            params = self.faults[kind].resolve(
                {**self.pool.get(kind, {}), **(given or {})}, [f"n{k}" for k in range(1, nodes + 1)], self.rng
            )
        except ScenarioError:
            return None
        return PlannedFault("new", round(at, 3), round(hold, 3), kind, params)

    def _drawn(self, kind: str) -> dict[str, Any]:
        """The kind's enumerated parameters the pool leaves open, each drawn afresh: a value no run
        has shown first (what ``shape`` does for one parameter, here for all at once)."""
        out: dict[str, Any] = {}
        for key, allowed in self.faults[kind].params_schema.items():
            if key in self.pool.get(kind, {}) or not isinstance(allowed, tuple) or len(allowed) < 2:
                continue
            fresh = [v for v in allowed if self._unseen(kind, key, v)]
            out[key] = self.rng.choice(fresh or list(allowed))
        return out

    def _align_options(self, s: Schedule) -> list[tuple[int, str, str]]:
        """(action, pool kind, ``same``/``others``) that ``align`` can draw, unseen relations first."""
        kinds = [k for k in sorted(self.pool) if "node" in self.faults[k].params_schema]
        options = [(i, k, way) for i in range(len(s.steps)) for k in kinds for way in ("same", "others")]
        fresh = [o for o in options if self._unseen_relation(s.steps[o[0]].kind, o[1], o[2])]
        return fresh or options

    def _align_draw(self, s: Schedule) -> tuple[int, str, str] | None:
        """One of ``_align_options``: a relation no run has reached ``FRESH_WEIGHT`` times as likely
        as one reached already, not only those: what happens in a relation depends on what else
        the window holds (the clients pushed onto its side or not), and with every relation of
        every action unseen first, one reached once was not drawn again for the rest of a search."""
        kinds = [k for k in sorted(self.pool) if "node" in self.faults[k].params_schema]
        options = [(i, k, way) for i in range(len(s.steps)) for k in kinds for way in ("same", "others")]
        if not options:
            return None
        weights = [
            FRESH_WEIGHT if self._unseen_relation(s.steps[i].kind, k, w) else 1.0 for i, k, w in options
        ]
        return self.rng.choices(options, weights=weights)[0]

    def _unseen_relation(self, held: str, kind: str, way: str) -> bool:
        return (held, kind, "same" if way == "same" else "other") not in self.seen_relations

    def align(self, s: Schedule, other: Schedule | None) -> tuple[Schedule, str] | None:
        """Actions of one pool kind nested inside an existing action's window, on its nodes (a
        partition's smaller side) or on each other node: begun early in the window and healed
        with most of it still to run (a killed node back, with time to act, while its isolation
        holds); relations no run has reached likelier (``_align_draw``). Half the time the window is widened first
        (begun anywhere back to the workload's start, held to its end): the time after the nested
        action's heal is where what it started shows, and a short window leaves none. A kind that
        takes the window's own node's process (``_takes_process``: a kill inside its isolation)
        widens it always and heals in its first fifth: the node back needs its restart and
        whatever start-up wait its broker has, inside the window and while producers run.

        The nested action heals ``reserve`` seconds before the workload's end at the latest (the
        time earlier runs' heals took past their planned time: a node restarted after the
        producers stopped serves no one). On each other node, half the time a kind that
        ``sheds_clients`` is held with those parameters to the window's end: the clients pushed onto
        the window's side while it lasts. On its nodes, half the time the same is done from the
        nested action's heal to the window's end (``_push_clients``): a node brought back inside
        the window gets the clients, so what it does there (serve alone, rejoin) meets the
        workload, which had moved away from it."""
        drawn = self._align_draw(s) if s.steps else None
        got = None if drawn is None else self._nest(s, *drawn, push=None)
        return None if got is None else (got[0], f"align {got[1]}")

    def _nest(
        self, s: Schedule, i: int, kind: str, way: str, push: bool | None
    ) -> tuple[Schedule, str] | None:
        """``kind`` nested in action ``i``'s window, on its nodes (``way`` ``same``) or on each other
        node (``others``), as ``align`` says; ``push``: whether the clients are pushed onto the
        window's nodes after what was nested there healed (``same`` only; None: half the time)."""
        cluster = [f"n{k}" for k in range(1, s.nodes + 1)]
        p = s.steps[i]
        mine = targets(p.params, cluster)
        aim = mine if way == "same" else [n for n in cluster if n not in mine]
        what = f"{kind} on {way} of {p.fault_id}"
        heal_by = s.duration - TAIL - self.reserve  # the nested action's heal, with workload left after it
        comeback = way == "same" and self._takes_process(kind)  # the node comes back inside the window
        widen = self.rng.random() < 0.5  # drawn always: the same draws as before for other nestings
        if widen or comeback or p.at + MIN_HOLD >= heal_by:
            at = round(p.at - self.rng.uniform(0.0, 1.0) * max(0.0, p.at - MIN_LEAD), 3)
            s = s.with_step(i, at=at, hold=round(s.duration - TAIL - at, 3))
            p = s.steps[i]
            what += " (widened)"
        start, end = _window(p, s.duration)
        end = min(end, s.duration - TAIL)
        span = end - start
        # Shares of the window: the nested action begins between the first two, held up to the third.
        begin_lo, begin_hi, hold_hi = (0.02, 0.1, 0.1) if comeback else (0.05, 0.2, 0.25)
        at = start + self.rng.uniform(begin_lo, begin_hi) * span
        shed = self.faults[kind].sheds_clients
        if way == "others" and shed and self.rng.random() < 0.5:
            given = dict(shed)
            hold = max(MIN_HOLD, end - at - min(0.5, 0.05 * span))  # to the window's end
            what += " (clients pushed to its side)"
        else:
            given = self._drawn(kind)
            hold = max(MIN_HOLD, self.rng.uniform(0.05, hold_hi) * span)
            if at + hold > heal_by:
                hold = max(MIN_HOLD, heal_by - at)
                at = min(at, heal_by - hold)
        if not aim or at <= start or at + hold >= end:
            return None  # strictly inside: healed before the window it nests in
        added = [self._new_step(kind, at, hold, s.nodes, {**given, "node": n}) for n in aim]
        pushing = way == "same" and (self.rng.random() < 0.5 if push is None else push)
        if pushing and all(a is not None for a in added):
            healed = max(a.at + (a.hold or 0.0) for a in added if a is not None)
            pushed = self._push_clients(s, [n for n in cluster if n not in mine], healed, end)
            if pushed:
                added += pushed[0]
                what += f" (clients pushed to its side by {pushed[1]})"
        if any(a is None for a in added):
            return None
        steps = (*s.steps, *(a for a in added if a is not None))
        return s.replace(steps=steps), what

    def restart(self, s: Schedule, other: Schedule | None) -> tuple[Schedule, str] | None:
        """A node brought back inside its minority with the clients pushed onto it: on the smaller
        side of an action that splits the cluster (``_sides``: a partition), a pool kind that takes
        the node's process nested as ``align`` nests one on a window's own nodes (the window
        widened, the action healed in its first fifth), and from its heal to the window's end a
        kind that ``sheds_clients`` on every other node (``_push_clients``). ``align`` reaches this
        only when its draw over every action, kind and way lands here and its push draw says so
        (3 to 6 % of proposals); a partition lets a broker go wrong where a node comes back alone
        on its small side and the workload meets it there, which is this move's aim."""
        kinds = self._kinds("process")
        sides = self._sides(s)
        if not kinds or not sides:
            return None
        got = self._nest(s, self.rng.choice(sides), self.rng.choice(kinds), "same", push=True)
        return None if got is None else (got[0], f"restart {got[1]}")

    def push(self, s: Schedule, other: Schedule | None) -> tuple[Schedule, str] | None:
        """The clients pushed onto the smaller side of an action that splits the cluster
        (``_sides``): a kind that ``sheds_clients`` on every node outside it, held to the window's
        end from early in it, or, when an action that takes the side's process is nested in the
        window, from that action's heal (the node back gets the clients)."""
        sides = self._sides(s)
        if not sides:
            return None
        i = self.rng.choice(sides)
        p = s.steps[i]
        cluster = [f"n{k}" for k in range(1, s.nodes + 1)]
        mine = set(targets(p.params, cluster))
        start, end = _window(p, s.duration)
        end = min(end, s.duration - TAIL)
        back = [
            q.at + q.hold
            for q in s.steps
            if q.hold is not None
            and self._takes_process(q.kind)
            and node_names(q.params) & mine
            and start < q.at
            and q.at + q.hold < end
        ]
        at = max(back) if back else start + self.rng.uniform(0.02, 0.2) * (end - start)
        pushed = self._push_clients(s, [n for n in cluster if n not in mine], at, end)
        if pushed is None or any(a is None for a in pushed[0]):
            return None
        added = tuple(a for a in pushed[0] if a is not None)
        return s.replace(steps=(*s.steps, *added)), f"push clients onto {p.fault_id}'s side by {pushed[1]}"

    def _kinds(self, what: str) -> list[str]:
        """The pool's kinds aimed at one ``node`` that take its process (``process``) or shed its
        clients (``sheds``)."""
        return [
            k
            for k in sorted(self.pool)
            if "node" in self.faults[k].params_schema
            and (self._takes_process(k) if what == "process" else bool(self.faults[k].sheds_clients))
        ]

    def _sides(self, s: Schedule) -> list[int]:
        """The actions that split the cluster into groups (a partition's resolved ``groups``) with a
        side smaller than the whole: where the clients can be pushed and a node brought back alone."""
        cluster = [f"n{k}" for k in range(1, s.nodes + 1)]
        return [
            i
            for i, p in enumerate(s.steps)
            if p.params.get("groups") and len(targets(p.params, cluster)) < len(cluster)
        ]

    def _takes_process(self, kind: str) -> bool:
        """Whether one application of ``kind`` holds its node's broker process (``Fault.touches``):
        its heal brings the node back (a restart, a resume), which takes time before it acts."""
        return "process" in self.faults[kind].touches

    def _push_clients(
        self, s: Schedule, others: list[str], at: float, end: float
    ) -> tuple[list[PlannedFault | None], str] | None:
        """A pool kind that ``sheds_clients``, with those parameters, on each node in ``others``,
        from ``at`` to the end of the window (``end``): the clients pushed onto the nodes the
        window holds after what was nested there has healed, so what it left behind meets the
        workload. None when no pool kind sheds clients or no time is left."""
        kinds = self._kinds("sheds")
        hold = end - at - min(0.5, 0.05 * (end - at))
        if not kinds or not others or hold < MIN_HOLD:
            return None
        kind = self.rng.choice(kinds)
        shed = dict(self.faults[kind].sheds_clients or {})
        return [self._new_step(kind, at, hold, s.nodes, {**shed, "node": n}) for n in others], kind

    def overlap(self, s: Schedule, other: Schedule | None) -> tuple[Schedule, str] | None:
        """A pool kind added over (or under) an existing action, unseen pairs first."""
        if not s.steps or not self.pool:
            return None
        options = []
        for i in range(len(s.steps)):
            for kind in self.pool:
                options.append((i, kind, "over"))  # the new one held when p begins
                options.append((i, kind, "under"))  # the new one begins while p is held
        fresh = [
            o
            for o in options
            if ((o[1], s.steps[o[0]].kind) if o[2] == "over" else (s.steps[o[0]].kind, o[1]))
            not in self.seen_pairs
        ]
        i, kind, way = self.rng.choice(fresh or options)
        p = s.steps[i]
        start, end = _window(p, s.duration)
        end = min(end, s.duration - TAIL)
        if way == "over":
            at = max(MIN_LEAD, start - self.rng.uniform(0.3, 3.0))
            hold = (start - at) + self.rng.uniform(0.5, max(0.6, end - start + 1.0))
        else:
            at = start + self.rng.uniform(0.0, max(0.1, 0.8 * (end - start)))
            hold = self.rng.uniform(MIN_HOLD, max(MIN_HOLD + 0.1, end - at + 1.0))
        hold = max(MIN_HOLD, min(hold, s.duration - TAIL - at))
        if at >= s.duration - TAIL - MIN_HOLD:
            return None
        step = self._new_step(kind, at, hold, s.nodes)
        if step is None:
            return None
        return s.replace(steps=(*s.steps, step)), f"overlap {kind} {way} {p.fault_id}"

    def add(self, s: Schedule, other: Schedule | None) -> tuple[Schedule, str] | None:
        if not self.pool:
            return None
        kind = self.rng.choice(sorted(self.pool))
        at = self.rng.uniform(MIN_LEAD, max(MIN_LEAD, s.duration - TAIL - MIN_HOLD))
        hold = self.rng.uniform(MIN_HOLD, max(MIN_HOLD, min(s.duration / 4, s.duration - TAIL - at)))
        step = self._new_step(kind, at, hold, s.nodes)
        if step is None:
            return None
        return s.replace(steps=(*s.steps, step)), f"add {kind} @{step.at:g}s/{step.hold:g}s"

    def remove(self, s: Schedule, other: Schedule | None) -> tuple[Schedule, str] | None:
        if len(s.steps) < 2:
            return None
        i = self.rng.randrange(len(s.steps))
        return s.replace(steps=s.steps[:i] + s.steps[i + 1 :]), f"remove {s.steps[i].fault_id}"

    def splice(self, s: Schedule, other: Schedule | None) -> tuple[Schedule, str] | None:
        if other is None or not s.steps or not other.steps:
            return None
        cut = self.rng.uniform(MIN_LEAD, s.duration)
        steps = tuple(p for p in s.steps if p.at < cut) + tuple(p for p in other.steps if p.at >= cut)
        if not steps:
            return None
        return s.replace(steps=steps), f"splice at {cut:.1f}s"

    def mutate(
        self, s: Schedule, other: Schedule | None, nodes: Sequence[str]
    ) -> tuple[Schedule, str] | None:
        """One to three stacked mutations of ``s``; None when none gave a valid schedule.

        A move that nests in a window (``NESTING``: ``align``, ``restart``, ``push``) is applied
        last in its stack, one a stack: a ``shift`` or ``hold`` of the outer action after it would
        move the window it nested in (a kill inside an isolation, the isolation moved off it), so
        the nesting it made would not be the one that runs.
        """
        stack = self.rng.choices([1, 2, 3], weights=[6, 3, 1])[0]
        names = list(OPERATORS)
        weights = [OPERATORS[n] * self._boost(s).get(n, 1) for n in names]
        done: list[str] = []
        cur = s
        nest: str | None = None  # a nesting move drawn: its place in the stack, applied after the others
        for _ in range(stack * 4):  # room for operators that do not apply
            if len(done) + (nest is not None) >= stack:
                break
            op = self.rng.choices(names, weights=weights)[0]
            if op in NESTING:
                nest = nest or op
            else:
                cur = self._apply(op, cur, other, nodes, done)
        for _ in range(4 if nest else 0):  # a few draws for it to fit
            before = len(done)
            cur = self._apply(nest or "align", cur, other, nodes, done)
            if len(done) > before:
                break
        if not done or cur.key() == s.key():
            return None  # nothing applied, or the stack undid itself (an action added, then removed)
        return cur, "; ".join(done)

    def _apply(
        self, op: str, cur: Schedule, other: Schedule | None, nodes: Sequence[str], done: list[str]
    ) -> Schedule:
        """``cur`` mutated by ``op`` when that gives another valid schedule (its name added to ``done``)."""
        got = getattr(self, op)(cur, other)
        if got is None:
            return cur
        cand = normalise(got[0])
        if cand.key() == cur.key() or not valid(cand, self.faults, nodes):
            return cur
        done.append(got[1])
        return cand

    def _boost(self, s: Schedule) -> dict[str, int]:
        """While kinds were never held together, relations never reached, or parameter values never
        shown, the operators that make them are worth more draws (the signal counts relations)."""
        unseen = any((a, b) not in self.seen_pairs for a in self.pool for b in self.pool)
        relations = any(self._unseen_relation(s.steps[i].kind, k, w) for i, k, w in self._align_options(s))
        values = any(self._unseen(p.kind, k, v) for p in s.steps for k, v in self._values(p))
        sides = bool(self._sides(s))  # none: ``restart`` and ``push`` have nothing to aim at
        return {
            "overlap": 2 if unseen else 1,
            "align": 2 if relations else 1,
            "shape": 2 if values else 1,
            "restart": int(sides and bool(self._kinds("process"))),
            "push": int(sides and bool(self._kinds("sheds"))),
        }


def _swap(value: Any, a: str, b: str) -> Any:
    """``value`` with node names ``a`` and ``b`` exchanged: a partition's groups and cuts stay a
    partition (renaming one into a name it already holds made cuts like ``[n1, n1]`` and groups
    that share a node), and a one-node action simply moves."""
    if isinstance(value, str):
        return b if value == a else a if value == b else value
    if isinstance(value, dict):
        return {_swap(k, a, b): _swap(v, a, b) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_swap(v, a, b) for v in value]
    return value


def normalise(s: Schedule) -> Schedule:
    """Actions by time, renumbered f1, f2, ...; those at or past the workload's end dropped."""
    steps = sorted((p for p in s.steps if p.at < s.duration), key=lambda p: (p.at, p.kind))
    return s.replace(steps=tuple(dataclasses.replace(p, fault_id=f"f{i}") for i, p in enumerate(steps, 1)))


def valid(s: Schedule, faults: Mapping[str, type[Fault]], nodes: Sequence[str]) -> bool:
    """Whether the schedule can run: each action's kind known, no two held at once that cannot overlap."""
    if any(p.kind not in faults for p in s.steps):
        return False
    try:
        check_overlaps(s.steps, faults, s.duration, nodes)
    except ScenarioError:
        return False
    return True


def values_in(shapes: Iterable[str]) -> set[tuple[str, str]]:
    """(kind, ``key=value``) of every parameter the fault shapes (``explore_cells.run_shapes``) show."""
    out: set[tuple[str, str]] = set()
    for shape in shapes:
        if "[" not in shape:
            continue
        kind, rest = shape.split("[", 1)
        out |= {(kind, kv) for kv in rest.split("]", 1)[0].split(",") if kv}
    return out


def relations_in(shapes: Iterable[str]) -> set[tuple[str, str, str]]:
    """(held kind, kind started under it, ``same`` or ``other`` nodes) of the relation shapes."""
    out: set[tuple[str, str, str]] = set()
    for shape in shapes:
        if " under=" not in shape:
            continue
        kind, under = shape.split(" under=", 1)
        held, _, where = under.partition(":")
        out.add((held, kind, where))
    return out


def pairs_in(shapes: Iterable[str]) -> set[tuple[str, str]]:
    """(held kind, kind started under it) pairs that the relation shapes show."""
    return {(held, kind) for held, kind, _ in relations_in(shapes)}


# -- the search ------------------------------------------------------------------------------------

Execute = Callable[[Schedule, str, int], Outcome]


class Search:
    """The loop: seed the corpus with the scenario's own schedule, then pick, mutate, run, keep.

    ``execute(schedule, what, iteration)`` runs one candidate. ``until``: the failing verdicts that
    stop the search (None: any); ``until_events``: broker events (``results.json`` ``events``, as
    the run's cells hold them) a failing run must also have shown to stop it. A run failing
    otherwise is recorded and kept like any run, and the search goes on. ``clock`` is the time source of the
    budget (``time.monotonic`` in use; the tests give their own).
    """

    def __init__(
        self,
        corpus: Corpus,
        start: Schedule,
        faults: Mapping[str, type[Fault]],
        pool: Mapping[str, Mapping[str, Any]],
        execute: Execute,
        *,
        budget_s: float,
        max_runs: int | None = None,
        until: frozenset[str] | None = None,
        until_events: frozenset[str] = frozenset(),
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.corpus = corpus
        self.until = until  # the failing verdicts that stop the search (None: any)
        self.until_events = until_events  # and the broker events such a run must have shown
        self.start = normalise(start)
        self.faults = faults
        self.pool = dict(pool)
        self.execute = execute
        self.budget_s = budget_s
        self.max_runs = max_runs
        self.clock = clock
        self.say = say
        self.nodes = [f"n{k}" for k in range(1, start.nodes + 1)]
        self.finished: str | None = None  # failure | budget | runs | errors | exhausted

    def propose(self, iteration: int) -> tuple[Schedule, str, Entry | None] | None:
        """The next candidate: the start when the corpus is empty, else a mutant of a picked entry."""
        if not self.corpus.entries and self.start.key() not in self.corpus.tried:
            return self.start, "the scenario's schedule", None
        rng = random.Random(f"{self.corpus.seed}:explore:{iteration}")
        parents = self.corpus.entries or [Entry("start", self.start, [], [], None, "start", None, "durable")]
        mutator = Mutator(
            self.faults,
            self.pool,
            rng,
            pairs_in(self.corpus.shapes),
            values_in(self.corpus.shapes),
            relations_in(self.corpus.shapes),
            self.reserve(),
        )
        for _ in range(50):
            parent = rng.choices(parents, weights=[e.weight() for e in parents])[0]
            other = rng.choice(parents).schedule if len(parents) > 1 else None
            got = mutator.mutate(parent.schedule, other, self.nodes)
            if got is None or got[0].key() in self.corpus.tried:
                continue
            return got[0], f"{parent.id}: {got[1]}", parent
        return None

    def stops(self, out: Outcome) -> bool:
        """Whether ``out`` ends the search: a failing run with a verdict of ``until`` that showed
        every event of ``until_events``."""
        if not out.failed or (self.until is not None and out.verdict not in self.until):
            return False
        return self.until_events <= broker_events(out.cells)

    def reserve(self) -> float:
        """Seconds of workload to leave after a nested action's planned heal: the median lateness of
        the last ``LATE_RUNS`` runs' heals, at most a third of the workload (0 before any)."""
        late = sorted(r["late_s"] for r in self.corpus.runs[-LATE_RUNS:] if r.get("late_s") is not None)
        if not late:
            return 0.0
        return round(min(late[len(late) // 2], self.start.duration / 3), 3)

    def _keep(
        self, iteration: int, schedule: Schedule, how: str, parent: Entry | None, out: Outcome
    ) -> dict[str, Any]:
        """Add a run's new cells and shapes to the corpus, its record to the runs, and its schedule
        to the corpus when it found new cells; say so. Returns the run's record."""
        new = sorted(out.cells - set(self.corpus.cells))
        for c in new:
            self.corpus.cells[c] = f"run {iteration}"
        for shape in out.shapes - set(self.corpus.shapes):
            self.corpus.shapes[shape] = f"run {iteration}"
        record = {
            "iteration": iteration,
            "how": how,
            "schedule": schedule.to_dict(),
            "verdict": out.verdict,
            "error": out.error,
            "seconds": round(out.seconds, 1),
            "elapsed_s": round(self.corpus.elapsed_s, 1),
            "cells": len(out.cells),
            "new": len(new),
            "cells_total": len(self.corpus.cells),
            "late_s": out.late_s,
            "run_dir": out.run_dir,
        }
        self.corpus.runs.append(record)
        kept = bool(new) and out.error is None
        if kept:
            self.corpus.entries.append(
                Entry(
                    f"e{len(self.corpus.entries) + 1}",
                    schedule,
                    sorted(out.cells),
                    new,
                    parent.id if parent else None,
                    how,
                    out.run_dir,
                    out.verdict,
                )
            )
        self.say(
            f"run {iteration}: {out.error or out.verdict} ({out.seconds:.0f} s), {len(new)} new cell(s), "
            f"{len(self.corpus.cells)} in all; corpus {len(self.corpus.entries)} schedule(s)"
            + (f", kept as {self.corpus.entries[-1].id}" if kept else "")
            + f"; {self.corpus.elapsed_s / 60:.1f} min searched"
        )
        return record

    def run(self) -> Outcome | None:
        """Search until the first failure that stops it (returned), the budget or ``max_runs`` is spent (None)."""
        t0 = self.clock()
        spent0 = self.corpus.elapsed_s
        errors = 0
        runs = 0
        while True:
            now = self.clock()
            self.corpus.elapsed_s = spent0 + (now - t0)
            if now - t0 >= self.budget_s:
                self.finished = "budget"
                return None
            if self.max_runs is not None and runs >= self.max_runs:
                self.finished = "runs"
                return None
            iteration = self.corpus.iteration + 1
            proposal = self.propose(iteration)
            if proposal is None:
                self.finished = "exhausted"
                self.say("no new schedule found in 50 draws: the mutations are exhausted for this corpus")
                return None
            schedule, how, parent = proposal
            if parent is not None:
                parent.picked += 1
            self.say(f"run {iteration} ({how}): {schedule.describe()}")
            out = self.execute(schedule, how, iteration)
            runs += 1
            self.corpus.tried.add(schedule.key())
            self.corpus.elapsed_s = spent0 + (self.clock() - t0)
            record = self._keep(iteration, schedule, how, parent, out)
            if self.stops(out):
                self.corpus.failure = {**record, "describe": schedule.describe()}
                self.corpus.save()
                self.finished = "failure"
                return out
            self.corpus.save()
            errors = errors + 1 if out.error else 0
            if errors >= MAX_ERRORS:
                self.finished = "errors"
                raise BrokerChaosError(
                    f"explore: {errors} runs in a row could not run; the last: {out.error}"
                )


def pool_of(
    scenario: Any, faults: Mapping[str, type[Fault]], extra: Sequence[str] = ()
) -> dict[str, dict[str, Any]]:
    """The kinds a mutation may add, with the parameters the scenario gives each.

    The scenario's random nemesis's ``params``, else the parameters of its first explicit step of
    that kind (those a scenario may give), else none; ``extra`` kinds are added with none.
    """
    n = scenario.nemesis
    out: dict[str, dict[str, Any]] = {}
    kinds = [s.fault for s in n.schedule] + list(n.random.faults if n.random else ()) + list(extra)
    for kind in kinds:
        if kind in out:
            continue
        if kind not in faults:
            raise ScenarioError(f"explore: unknown fault {kind!r}; available: {', '.join(sorted(faults))}")
        if n.random and kind in n.random.params:
            out[kind] = dict(n.random.params[kind])
            continue
        step = next((s for s in n.schedule if s.fault == kind), None)
        out[kind] = dict(step.params) if step else {}
    return out
