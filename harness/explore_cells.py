"""The coverage signal of ``brokerchaos explore``: the (feature, fault, event) cells one run reached.

A cell is a string ``feature | fault | event``:

feature
    a workload feature the scenario drives (``publish-confirm``, ``consume``, ``backlog``,
    ``requeue``, ``recover``, ``close``, ``crash``, ``slow-consumer``, ``delay``, ``tx-publish``,
    ``tx-ack``, ``queues``, ``cluster``), read from the scenario.
fault
    one fault window, coarse: its kind, how much of the cluster it targets (``one``/``some``/
    ``all``) and whether a node the workload's clients went through is among them
    (``kill@one/clients``, ``partition@one/no-clients``); or a relation of the window to another
    (``kill under=partition:same``: begun while a partition of the same nodes was held;
    ``kill recovering=power-loss``: begun after its heal, before the queues had recovered); or
    ``run`` for the run as a whole.
event
    what the run showed in that window: whether the fault applied and bit, whether publishes
    were served inside it (``publish-served``, ``publish-none``), whether each
    queue recovered after its heal, missing messages attributed to it under their class
    (``lost``, ``stuck``, ``unreachable``); for the run, its verdict, the
    kinds of anomaly it counted, its outages (``outage-publish``: no publish completed for longer
    than the liveness threshold) and the broker's own events the plugin reads from its logs
    (``event=promoted-in-sync``, ``event=served-alone``).

The cells say what the cluster did, not what the schedule was. A fault's parameters, its numbers
and its relations to other windows are the search's input: cells keyed on them (a kind crossed
with each parameter value, each relation crossed with each outcome) are reached by the mutation
that makes them, whatever the broker does, so every run was new and the corpus kept everything: a
random walk over mutations. A relation makes a cell only with what went wrong for the workload
(``lost``, ``stuck``, ``not-recovered``, a heal that failed); the broker's events and the outages are the
run's, so a node that started alone and served is one cell whichever schedule got it there, and
which window a routine event (a synced mirror, a group-commit batch) or an outage fell in makes
none. What
the search has tried (each window's parameters and relations, ``run_shapes``) is kept apart, for
the mutations to aim at what is untried first.

Everything is read from a stored run (``scenario.json`` and ``results.json``): no Docker, no
clock. Broker events a plugin reports (``results.json`` ``events``: each ``{"name": ...}``) make
the run's cells when a run has them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.spec.results import row_class
from harness.spec.rundir import RESULTS_JSON, SCENARIO_JSON

#: A window's events a relation is crossed with: what went wrong for the workload. Crossed with
#: every outcome (applied, publishes served, an outage), a relation was reached by the mutation
#: that made it, whatever the broker did.
WENT_WRONG = frozenset({"apply-failed", "never-healed", "not-recovered", "lost", "stuck"})
#: Run-level counts that make an event when they are above zero.
COUNTED = ("recovered", "unknown", "failed", "duplicated", "resurrected", "ack_unknown", "abandoned")


def workload_features(scenario: Mapping[str, Any]) -> list[str]:
    """The workload features a scenario (``Scenario.to_dict()``) drives."""
    w = scenario.get("workload") or {}
    out = ["publish-confirm"]
    out.append("consume" if w.get("consumers", 2) else "backlog")
    c = w.get("consumer") or {}
    for key, name in (
        ("requeue", "requeue"),
        ("recover_every", "recover"),
        ("close_every", "close"),
        ("crash_every", "crash"),
        ("slow", "slow-consumer"),
    ):
        if c.get(key):
            out.append(name)
    if w.get("delay"):
        out.append("delay")
    tx = w.get("transactions") or {}
    if tx.get("publish_batch"):
        out.append("tx-publish")
    if tx.get("ack_batch"):
        out.append("tx-ack")
    if (w.get("queues") or 1) > 1:
        out.append("queues")
    if ((scenario.get("broker") or {}).get("nodes") or 1) > 1:
        out.append("cluster")
    return out


def _is_node(v: Any) -> bool:
    return isinstance(v, str) and len(v) > 1 and v[0] == "n" and v[1:].isdigit()


def targets(params: Mapping[str, Any], all_nodes: list[str]) -> list[str]:
    """The nodes an action is aimed at: its ``node``, its ``nodes``, the smallest of its ``groups``
    (a partition's minority side), else the whole cluster."""
    if isinstance(params.get("node"), str):
        return [params["node"]]
    if isinstance(params.get("nodes"), list | tuple):
        return [str(n) for n in params["nodes"]]
    groups = [g for g in params.get("groups") or [] if isinstance(g, list | tuple) and g]
    if groups:
        return sorted(str(n) for n in min(groups, key=len))
    return list(all_nodes)


def _params_shape(params: Mapping[str, Any]) -> str:
    """The parameters that say what an action does (enumerated values, strings, flags); numbers
    (a delay, a share, a seed) and node names are left out."""
    parts = []
    for key in sorted(params):
        v = params[key]
        if key.endswith("seed") or _is_node(v):
            continue
        if isinstance(v, bool) or isinstance(v, str):
            parts.append(f"{key}={str(v).lower()}")
    return ",".join(parts)


def _fault_params(w: Mapping[str, Any]) -> Mapping[str, Any]:
    """A window's fault parameters (its ``params`` is the recorded action: parameters, hold, start)."""
    p = w.get("params") or {}
    return p["params"] if isinstance(p.get("params"), Mapping) else p


def fault_shapes(results: Mapping[str, Any], nodes: int) -> dict[str, list[str]]:
    """Each fault window's shapes, by fault id: the fault itself, then one per relation to another.

    The first is the fault alone (``kill[]@one/clients``); then one per kind it began under,
    with whether it hit the same nodes (``kill under=partition:same``), and one per kind whose
    heal it followed before the queues recovered (``kill recovering=power-loss``). Each relation is
    a shape of its own, not crossed with the fault's parameters, its target or its other relations.
    The shapes are what a run tried (``run_shapes``); the cells take the first without its
    parameters and the relations only with what went wrong (``run_cells``).
    """
    windows = list(results.get("faults") or [])
    all_nodes = [f"n{i}" for i in range(1, nodes + 1)]
    client_nodes = {
        n["node"]
        for r in (results.get("liveness") or {}).get("recovery") or []
        for n in r.get("nodes") or []
        if n.get("node")
    }
    recovered_at = _recovered_at(results)
    aimed = {w["fault_id"]: set(targets(_fault_params(w), all_nodes)) for w in windows}
    out: dict[str, list[str]] = {}
    for w in windows:
        mine = aimed[w["fault_id"]]
        share = "all" if len(mine) >= len(all_nodes) else "one" if len(mine) == 1 else "some"
        role = "clients" if not client_nodes or mine & client_nodes else "no-clients"
        start = w["start_ns"]
        under = sorted(
            {
                f"{o['kind']}:{'same' if mine & aimed[o['fault_id']] else 'other'}"
                for o in windows
                if o is not w and o["start_ns"] <= start < (o.get("end_ns") or start + 1)
            }
        )
        recovering = sorted(
            {
                o["kind"]
                for o in windows
                if o is not w
                and o.get("heal_start_ns") is not None
                and o["heal_start_ns"] <= start < recovered_at.get(o["fault_id"], o["heal_start_ns"])
            }
        )
        kind = w["kind"]
        out[w["fault_id"]] = [
            f"{kind}[{_params_shape(_fault_params(w))}]@{share}/{role}",
            *(f"{kind} under={u}" for u in under),
            *(f"{kind} recovering={r}" for r in recovering),
        ]
    return out


def _recovered_at(results: Mapping[str, Any]) -> dict[str, int]:
    """When each fault's queues had their publishes back after its heal (ns), by fault id."""
    out: dict[str, int] = {}
    for r in (results.get("liveness") or {}).get("recovery") or []:
        if r.get("heal_ns") is not None:
            # Publishes back, where there were any: a backlog's consumes come back only at the drain.
            back = r.get("publish_ok_ns") if r.get("publish_demand") else None
            end = r["heal_ns"] + (back if back is not None else r.get("recovery_ns") or 0)
            out[r["fault_id"]] = max(out.get(r["fault_id"], 0), end)
    return out


def window_events(results: Mapping[str, Any]) -> dict[str, set[str]]:
    """What each fault window saw, by fault id, and under ``run`` the broker's events."""
    out: dict[str, set[str]] = {}
    for w in results.get("faults") or []:
        out[w["fault_id"]] = {"applied" if w.get("applied") else "apply-failed"}
        if w.get("applied") and not w.get("healed"):
            out[w["fault_id"]].add("never-healed")
    for fid, label in evidence_events(results):
        if fid in out:
            out[fid].add(label)
    for row in results.get("availability") or []:
        if row.get("window") not in out:
            continue
        out[row["window"]].add(publish_label(row))
    lv = results.get("liveness") or {}
    for r in lv.get("recovery") or []:
        if r.get("fault_id") not in out or not r.get("healed"):
            continue
        if not r.get("recovered"):
            out[r["fault_id"]].add("not-recovered")
    # An outage (no op of a kind completed for longer than the liveness threshold) is the run's:
    # which windows it overlapped moved with the timing (one schedule run twice had it in the
    # partition's window once and not the other time, and two isolations of one node, overlapping,
    # made ``partition | outage-publish`` new where one had not).
    for u in lv.get("windows") or []:
        out.setdefault("run", set()).add(f"outage-{u.get('kind')}")
    # Each missing message under its class: an unreachable one (the drain did not complete) is
    # not a loss, and a stuck one is.
    counts = results.get("counts") or {}
    for m in (results.get("attribution") or {}).get("messages") or []:
        for fid in m.get("fault_ids") or []:
            if fid in out:
                out[fid].add(row_class(m, counts))
    # The broker's events are the run's: which window a promotion or a synced mirror fell in moved
    # with the timing (two runs of one schedule had them in different windows).
    for e in results.get("events") or []:
        if isinstance(e, Mapping) and e.get("name"):
            out.setdefault("run", set()).add(f"event={e['name']}")
    return out


def publish_label(row: Mapping[str, Any]) -> str:
    """Whether the workload was served inside a window: ``publish-served`` when a publish invoked in
    it was confirmed, else ``publish-none``.

    Served or not, not how much (a threshold on the share moved a window across it with the
    timing), and not whether a publish was tried: with every producer reconnecting, whether one
    retry fell inside a short window split ``publish-down`` (tried, none confirmed) from
    ``no-publishes`` (none tried) by timing alone; to the cluster both are a window that confirmed
    nothing.
    """
    return "publish-served" if row.get("confirmed") or (row.get("share") or 0) > 0 else "publish-none"


def evidence_events(results: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Whether each fault action bit, by fault id (``results.json``'s ``fault_evidence``): a fault that
    bit is a different cell from one that had no effect, and a power cut that found acknowledged
    messages unsynced from one that found none."""
    out: list[tuple[str, str]] = []
    for a in (results.get("fault_evidence") or {}).get("actions") or []:
        effect = a.get("effect")
        fid = str(a.get("fault_id"))
        out.append((fid, "bit" if effect is True else "no-effect" if effect is False else "unmeasured"))
        if a.get("flags"):
            out.append((fid, "partial"))
        exposure = a.get("exposure") or {}
        if exposure.get("confirmed_before_cut") is not None:
            out.append((fid, "exposed>0" if exposure["confirmed_before_cut"] else "exposed=0"))
    return out


def run_events(results: Mapping[str, Any]) -> set[str]:
    """Events of the run as a whole: the anomaly counts above zero and the verdict."""
    counts = results.get("counts") or {}
    out = {f"{k}>0" for k in COUNTED if counts.get(k)}
    out.add(f"verdict={results.get('verdict', results.get('valid'))}")
    return out


def _coarse(shape: str) -> str:
    """A fault's own shape without its parameters: ``kill[]@one/clients`` -> ``kill@one/clients``."""
    kind, _, rest = shape.partition("[")
    return kind + "@" + rest.split("]@", 1)[1] if rest else shape


def run_cells(scenario: Mapping[str, Any], results: Mapping[str, Any]) -> set[str]:
    """Every (feature, fault, event) cell a run reached: ``scenario`` is ``Scenario.to_dict()``."""
    features = workload_features(scenario)
    nodes = int((scenario.get("broker") or {}).get("nodes") or 1)
    events = window_events(results)
    out: set[str] = set()
    for fid, (own, *relations) in fault_shapes(results, nodes).items():
        seen = events.get(fid, set())
        out |= {f"{f} | {_coarse(own)} | {ev}" for f in features for ev in seen}
        wrong = seen & WENT_WRONG
        out |= {f"{f} | {shape} | {ev}" for f in features for shape in relations for ev in wrong}
    where = "run" if results.get("faults") else "no-fault"
    for ev in run_events(results) | events.get("run", set()):
        out |= {f"{f} | {where} | {ev}" for f in features}
    return out


def broker_events(cells: set[str]) -> set[str]:
    """The broker's events (``event=NAME`` of the run, ``window_events``) among a run's cells, by name."""
    out = set()
    for cell in cells:
        _, where, event = cell.split(" | ", 2)
        if where in ("run", "no-fault") and event.startswith("event="):
            out.add(event.removeprefix("event="))
    return out


def run_shapes(scenario: Mapping[str, Any], results: Mapping[str, Any]) -> set[str]:
    """What the run tried: each window's shape with its parameters and each relation it had
    (``fault_shapes``), for the mutations to aim at what no run has tried."""
    nodes = int((scenario.get("broker") or {}).get("nodes") or 1)
    return {shape for shapes in fault_shapes(results, nodes).values() for shape in shapes}


def heal_lateness(results: Mapping[str, Any], due: Mapping[str, float]) -> float | None:
    """How many seconds past its planned time the latest heal of the run completed (``due``: fault id ->
    its planned heal, seconds from the workload's start); None when no applied action was healed.

    A window ends at its heal's ok: the heal itself (a restart takes its time) and what the nemesis
    measured after it, during which it applies nothing else. On a loaded machine both run late, and
    what a nested action leaves behind meets the workload only if that much of it is left.
    """
    worst: float | None = None
    for w in results.get("faults") or []:
        at = due.get(str(w.get("fault_id")))
        start = (w.get("params") or {}).get("workload_start_s")
        if at is None or start is None or not (w.get("applied") and w.get("healed")):
            continue
        late = max(0.0, w["end_ns"] / 1e9 - float(start) - at)
        worst = late if worst is None else max(worst, late)
    return None if worst is None else round(worst, 3)


def stored_run_cells(run_dir: Path) -> set[str]:
    """``run_cells`` of a stored run directory."""
    scenario = json.loads((run_dir / SCENARIO_JSON).read_text())["scenario"]
    results = json.loads((run_dir / RESULTS_JSON).read_text())
    return run_cells(scenario, results)
