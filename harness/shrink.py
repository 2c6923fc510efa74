"""Shrinking a failing schedule: the search, independent of any broker, fault or cluster.

A failing run is a schedule (the fault actions it recorded, each with its time, hold and
concrete parameters, plus the workload's duration and rate and the cluster's size). The
search asks an oracle whether a smaller schedule still fails and keeps the smallest one
that does. The oracle is the only thing that touches Docker (``harness.shrink_trials``);
here it is any function, so the search itself is tested with a pure one.

The passes, in order, each taking the best schedule so far:

``faults``
    delta debugging (Zeller's ddmin) over the fault actions: a 1-minimal subset, every
    action of which is needed; then, if one action is left, whether none is needed at all.
``holds``
    each remaining hold halved while the schedule still fails (down to ``MIN_HOLD``).
``nodes``
    each action's parameters with one node name taken out (list members naming it, and
    inner lists that mention it, such as a cut between two nodes), while it still fails.
``cluster``
    a cluster just big enough for the nodes the schedule and the broker settings name.
``workload``
    the workload cut to just past the end of the last remaining action, then the actions
    moved earlier (and the workload shortened with them) while it still fails, then the
    idle time between one action's heal and the next halved while it still fails.
``rate``
    the publish rate halved while it still fails (down to ``MIN_RATE``).

Nothing here knows a fault kind: an action is a time, a hold, a kind name and parameters,
and a node is a name the cluster has (``n1``, ``n2``, ...).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from harness.nemesis import PlannedFault

T = TypeVar("T")

PASSES = ("faults", "holds", "nodes", "cluster", "workload", "rate")
MIN_HOLD = 1.0  # seconds: a shorter hold is mostly the fault's own apply and heal
MIN_LEAD = 2.0  # seconds of workload before the first action (something must be in flight)
TAIL = 1.0  # seconds of workload after the last action's heal
MIN_RATE = 10.0  # messages per second
NODE_NAME = re.compile(r"\bn([1-9][0-9]*)\b")


@dataclass(frozen=True)
class Schedule:
    """What a run did, in the terms the search can change."""

    steps: tuple[PlannedFault, ...]
    duration: float
    rate: float
    nodes: int

    def key(self) -> str:
        """Identity for the oracle's cache: two equal schedules are tried once."""
        return json.dumps(
            {
                "steps": [vars(s) for s in self.steps],
                "duration": self.duration,
                "rate": self.rate,
                "nodes": self.nodes,
            },
            sort_keys=True,
            default=str,
        )

    def to_dict(self) -> dict[str, Any]:
        """As ``shrink.json`` and an explore corpus store it (``from_dict`` reads it back)."""
        return {
            "steps": [vars(s) for s in self.steps],
            "duration": self.duration,
            "rate": self.rate,
            "nodes": self.nodes,
            "describe": self.describe(),
        }

    @classmethod
    def from_dict(cls, d: Any) -> Schedule:
        return cls(
            steps=tuple(
                PlannedFault(p["fault_id"], p["at"], p["hold"], p["kind"], dict(p["params"]))
                for p in d["steps"]
            ),
            duration=float(d["duration"]),
            rate=float(d["rate"]),
            nodes=int(d["nodes"]),
        )

    def replace(self, **changes: Any) -> Schedule:
        return dataclasses.replace(self, **changes)

    def with_step(self, i: int, **changes: Any) -> Schedule:
        steps = list(self.steps)
        steps[i] = dataclasses.replace(steps[i], **changes)
        return self.replace(steps=tuple(steps))

    def describe(self) -> str:
        acts = "; ".join(describe_step(s) for s in self.steps) or "no faults"
        rate = f"{self.rate:g}/s" if self.rate else "unlimited rate"
        return f"{acts} | {self.duration:g} s at {rate} on {self.nodes} node(s)"

    def size(self) -> tuple[float, ...]:
        """Smaller is simpler: fewer actions, fewer nodes touched, shorter holds, shorter, slower, smaller."""
        return (
            len(self.steps),
            sum(len(node_names(s.params)) for s in self.steps),
            sum(s.hold or self.duration for s in self.steps),
            self.duration,
            self.rate,
            self.nodes,
        )


def describe_step(s: PlannedFault) -> str:
    nodes = ",".join(sorted(node_names(s.params), key=_node_index))
    hold = f"/{s.hold:g}s" if s.hold is not None else " (held to the end)"
    return f"{s.fault_id} {s.kind}{' ' + nodes if nodes else ''} @{s.at:g}s{hold}"


# -- delta debugging -------------------------------------------------------------------------


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool]) -> list[T]:
    """A 1-minimal failing subset of ``items`` (which as a whole is taken to fail).

    Zeller and Hildebrandt's ddmin: split into n chunks, keep a chunk that fails alone
    (back to n = 2) or a complement that fails (n - 1), else split finer; stop when every
    single item is needed. Order is kept; each subset is asked at most once.
    """
    asked: dict[tuple[int, ...], bool] = {}

    def test(idx: list[int]) -> bool:
        key = tuple(idx)
        if key not in asked:
            asked[key] = fails([items[i] for i in idx])
        return asked[key]

    current = list(range(len(items)))
    n = 2
    while len(current) >= 2:
        chunks = _split(current, n)
        for chunk in chunks:
            if test(chunk):
                current, n = chunk, 2
                break
        else:
            for chunk in chunks if n > 2 else ():
                rest = [i for i in current if i not in chunk]
                if test(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(len(current), 2 * n)
    return [items[i] for i in current]


def _split(xs: list[int], n: int) -> list[list[int]]:
    """n contiguous chunks, sizes differing by at most one."""
    k, r = divmod(len(xs), n)
    out, start = [], 0
    for j in range(n):
        end = start + k + (1 if j < r else 0)
        out.append(xs[start:end])
        start = end
    return [c for c in out if c]


# -- nodes named in parameters ---------------------------------------------------------------


def _node_index(name: str) -> int:
    m = NODE_NAME.fullmatch(name)
    return int(m.group(1)) if m else 0


def node_names(value: Any) -> set[str]:
    """Every node name (``n<k>``) a parameter value mentions, at any depth."""
    if isinstance(value, str):
        return {value} if NODE_NAME.fullmatch(value) else set()
    if isinstance(value, dict):
        out: set[str] = set()
        for k, v in value.items():
            out |= node_names(k) | node_names(v)
        return out
    if isinstance(value, list | tuple):
        return set().union(*(node_names(x) for x in value)) if value else set()
    return set()


def without_node(params: dict[str, Any], node: str) -> dict[str, Any] | None:
    """``params`` with ``node`` taken out, or None when that leaves the action without a target.

    A list loses the members equal to ``node`` and the inner lists that mention it (a cut
    ``[n1, n3]`` goes whole); a mapping loses the keys equal to it. A parameter that *is*
    the node (``node: n3``), or a list emptied by the removal, means the action needs it.
    """
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == node:
            continue
        if value == node:
            return None
        stripped = _strip(value, node)
        if isinstance(value, list | dict) and value and not stripped:
            return None
        out[key] = stripped
    return out if node_names(out) != node_names(params) else None


def _strip(value: Any, node: str) -> Any:
    if isinstance(value, list | tuple):
        return [
            _strip(x, node)
            for x in value
            if x != node and not (isinstance(x, list | tuple | dict) and node in node_names(x))
        ]
    if isinstance(value, dict):
        return {k: _strip(v, node) for k, v in value.items() if k != node}
    return value


def named_nodes(s: Schedule, settings: Any) -> set[str]:
    """Nodes the schedule's actions touch or the broker settings name (e.g. a mirror list)."""
    out = set().union(*(node_names(p.params) for p in s.steps)) if s.steps else set()
    text = json.dumps(settings, default=str)
    return out | {f"n{m}" for m in NODE_NAME.findall(text)}


# -- the search ------------------------------------------------------------------------------


class StopSearch(Exception):
    """The search cannot go on (``str`` says why); it keeps the best schedule it has."""


class OutOfBudget(StopSearch):
    """The search's time is spent."""


Test = Callable[[Schedule, str], bool]


def shrink_faults(s: Schedule, test: Test) -> Schedule:
    def fails(sub: list[PlannedFault]) -> bool:
        if len(sub) == len(s.steps):
            return True
        ids = ", ".join(p.fault_id for p in sub) or "none"
        return test(s.replace(steps=tuple(sub)), f"faults: {len(sub)} of {len(s.steps)} ({ids})")

    kept = ddmin(list(s.steps), fails)
    if len(kept) == 1 and test(s.replace(steps=()), "faults: none at all"):
        kept = []
    return s.replace(steps=tuple(kept))


def shrink_holds(s: Schedule, test: Test) -> Schedule:
    for i in range(len(s.steps)):
        while True:
            step = s.steps[i]
            if step.hold is None or step.hold <= MIN_HOLD:
                break
            hold = max(MIN_HOLD, round(step.hold / 2, 2))
            cand = s.with_step(i, hold=hold)
            if not test(cand, f"holds: {step.fault_id} held {step.hold:g} s -> {hold:g} s"):
                break
            s = cand
    return s


def shrink_nodes(s: Schedule, test: Test) -> Schedule:
    for i in range(len(s.steps)):
        for node in sorted(node_names(s.steps[i].params), key=_node_index, reverse=True):
            if len(node_names(s.steps[i].params)) < 2:
                break
            params = without_node(s.steps[i].params, node)
            if params is None:
                continue
            cand = s.with_step(i, params=params)
            if test(cand, f"nodes: {s.steps[i].fault_id} without {node}"):
                s = cand
    return s


def shrink_cluster(s: Schedule, test: Test, settings: Any = None) -> Schedule:
    need = max((_node_index(n) for n in named_nodes(s, settings or {})), default=1)
    if 1 <= need < s.nodes and test(s.replace(nodes=need), f"cluster: {s.nodes} -> {need} node(s)"):
        return s.replace(nodes=need)
    return s


def _end(s: Schedule) -> float:
    return max((p.at + (p.hold or 0.0) for p in s.steps), default=0.0)


def shrink_workload(s: Schedule, test: Test) -> Schedule:
    if not s.steps:  # a failure without faults: only the workload's length is left to cut
        while s.duration / 2 >= MIN_LEAD:
            cand = s.replace(duration=round(s.duration / 2, 2))
            if not test(cand, f"workload: {s.duration:g} s -> {cand.duration:g} s"):
                break
            s = cand
        return s
    cut = round(_end(s) + TAIL, 2)
    if cut < s.duration and test(s.replace(duration=cut), f"workload: {s.duration:g} s -> {cut:g} s"):
        s = s.replace(duration=cut)
    while True:
        first = min(p.at for p in s.steps)
        shift = round(min(first / 2, first - MIN_LEAD), 2)
        if shift < 0.5:
            break
        steps = tuple(dataclasses.replace(p, at=round(p.at - shift, 3)) for p in s.steps)
        cand = s.replace(
            steps=steps, duration=round(max(s.duration - shift, _end(s.replace(steps=steps)) + TAIL), 2)
        )
        if not test(
            cand, f"workload: everything {shift:g} s earlier, {s.duration:g} s -> {cand.duration:g} s"
        ):
            break
        s = cand
    return _close_gaps(s, test)


def _close_gaps(s: Schedule, test: Test) -> Schedule:
    """Idle time between one action's heal and the next action halved while it still fails."""
    i = 1
    while i < len(s.steps):
        prev_end = max(p.at + (p.hold or 0.0) for p in s.steps[:i])
        shift = round((s.steps[i].at - prev_end) / 2, 2)
        if shift < 0.5:
            i += 1
            continue
        steps = s.steps[:i] + tuple(dataclasses.replace(p, at=round(p.at - shift, 3)) for p in s.steps[i:])
        cand = s.replace(
            steps=steps, duration=round(max(s.duration - shift, _end(s.replace(steps=steps)) + TAIL), 2)
        )
        if not test(
            cand,
            f"workload: {s.steps[i].fault_id} and after {shift:g} s earlier, "
            f"{s.duration:g} s -> {cand.duration:g} s",
        ):
            i += 1
            continue
        s = cand
    return s


def shrink_rate(s: Schedule, test: Test) -> Schedule:
    while s.rate and s.rate / 2 >= MIN_RATE:
        cand = s.replace(rate=round(s.rate / 2, 2))
        if not test(cand, f"rate: {s.rate:g}/s -> {cand.rate:g}/s"):
            break
        s = cand
    return s


def search(
    start: Schedule,
    test: Test,
    *,
    passes: Iterable[str] = PASSES,
    settings: Any = None,
    on_best: Callable[[Schedule], None] | None = None,
) -> tuple[Schedule, bool]:
    """The smallest failing schedule the passes find from ``start`` (known to fail).

    ``test`` raises StopSearch (e.g. OutOfBudget when the time is spent): the best so far is
    returned with ``complete`` False. Every schedule ``test`` accepts is smaller than the one before, so
    the best so far is simply the last accepted.
    """
    best = start
    on_best = on_best or (lambda s: None)

    def accept(s: Schedule, what: str) -> bool:
        nonlocal best
        if not test(s, what):
            return False
        if s.size() <= best.size():
            best = s
            on_best(best)
        return True

    steps: dict[str, Callable[[Schedule, Test], Schedule]] = {
        "faults": shrink_faults,
        "holds": shrink_holds,
        "nodes": shrink_nodes,
        "cluster": lambda s, t: shrink_cluster(s, t, settings),
        "workload": shrink_workload,
        "rate": shrink_rate,
    }
    wanted = list(passes)
    unknown = [p for p in wanted if p not in steps]
    if unknown:
        raise ValueError(f"unknown shrink passes {unknown}; known: {', '.join(PASSES)}")
    try:
        for name in PASSES:
            if name in wanted:
                best = steps[name](best, accept)
    except StopSearch:
        return best, False
    return best, True
