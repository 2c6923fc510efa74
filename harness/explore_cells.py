"""The coverage signal of ``brokerchaos explore``: the (feature, fault, event) cells one run reached.

A cell is a string ``feature | fault | event``:

feature
    a workload feature the scenario drives (``publish-confirm``, ``consume``, ``backlog``,
    ``requeue``, ``recover``, ``close``, ``crash``, ``slow-consumer``, ``delay``, ``tx-publish``,
    ``tx-ack``, ``queues``, ``cluster``), read from the scenario.
fault
    the shape of one fault window: its kind, its enumerated, string and boolean parameters (not
    its numbers, nor how long it was held: a run that moves a figure a little reaches nothing
    new), how much of the cluster it targets (``one``/``some``/``all``), the role of its target
    (``clients``: a node the workload's clients went through; ``no-clients``), the kinds already
    held when it began and whether it hit the same nodes as they did (``under=partition:same``,
    ``under=partition:other``), and the kinds whose heal it followed before the queues had
    recovered (``recovering=kill``).
event
    what the run recorded in that window: whether the fault applied, the share of publishes
    confirmed inside it, whether each queue recovered after its heal, outages that overlapped it,
    lost messages attributed to it. The run as a whole (which kinds of anomaly it counted, its
    verdict) makes cells of its own (fault ``run``), not one per window: crossed with every
    window's shape, each verdict or anomaly made a new cell for every shape a run had.

Everything is read from a stored run (``scenario.json`` and ``results.json``): no Docker, no
clock. Broker events a plugin reports (``results.json`` ``events``: each ``{"name": ...,
"fault_ids": [...]}``) join a window's events when a run has them. The cells are coarse on
purpose: a map in which every run is new gives the search no direction (each run kept, the corpus
a random walk over mutations); a run is new when it reaches a state: a kind of fault over another,
on the same nodes or the others, with an outcome no run had before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


def fault_shapes(results: Mapping[str, Any], nodes: int) -> dict[str, str]:
    """Each fault window's shape, by fault id."""
    windows = list(results.get("faults") or [])
    all_nodes = [f"n{i}" for i in range(1, nodes + 1)]
    lv = results.get("liveness") or {}
    client_nodes = {
        n["node"] for r in lv.get("recovery") or [] for n in r.get("nodes") or [] if n.get("node")
    }
    recovered_at: dict[str, int] = {}
    for r in lv.get("recovery") or []:
        if r.get("heal_ns") is not None:
            # Publishes back, where there were any: a backlog's consumes come back only at the drain.
            back = r.get("publish_ok_ns") if r.get("publish_demand") else None
            end = r["heal_ns"] + (back if back is not None else r.get("recovery_ns") or 0)
            recovered_at[r["fault_id"]] = max(recovered_at.get(r["fault_id"], 0), end)
    aimed = {w["fault_id"]: set(targets(_fault_params(w), all_nodes)) for w in windows}
    out: dict[str, str] = {}
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
        shape = f"{w['kind']}[{_params_shape(_fault_params(w))}]@{share}/{role}"
        if under:
            shape += f" under={'+'.join(under)}"
        if recovering:
            shape += f" recovering={'+'.join(recovering)}"
        out[w["fault_id"]] = shape
    return out


def window_events(results: Mapping[str, Any]) -> dict[str, set[str]]:
    """What each fault window saw, by fault id."""
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
        share = row.get("share")
        label = (
            "no-publishes"
            if share is None
            else "publish-down"
            if share == 0
            else "publish-degraded"
            if share < 0.9
            else "publish-ok"
        )
        out[row["window"]].add(label)
    lv = results.get("liveness") or {}
    for r in lv.get("recovery") or []:
        if r.get("fault_id") not in out or not r.get("healed"):
            continue
        if not r.get("recovered"):
            out[r["fault_id"]].add("not-recovered")
    for u in lv.get("windows") or []:
        for fid in u.get("fault_ids") or []:
            if fid in out:
                out[fid].add(f"outage-{u.get('kind')}")
    for m in (results.get("attribution") or {}).get("messages") or []:
        for fid in m.get("fault_ids") or []:
            if fid in out:
                out[fid].add("lost")
    for e in results.get("events") or []:
        if not isinstance(e, Mapping) or not e.get("name"):
            continue
        for fid in e.get("fault_ids") or ["run"]:
            out.setdefault(fid, set()).add(f"event={e['name']}")
    return out


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


def run_cells(scenario: Mapping[str, Any], results: Mapping[str, Any]) -> set[str]:
    """Every (feature, fault, event) cell a run reached: ``scenario`` is ``Scenario.to_dict()``."""
    features = workload_features(scenario)
    nodes = int((scenario.get("broker") or {}).get("nodes") or 1)
    shapes = fault_shapes(results, nodes)
    events = window_events(results)
    whole = run_events(results)
    out: set[str] = set()
    for fid, shape in shapes.items():
        for ev in events.get(fid, set()):
            out |= {f"{f} | {shape} | {ev}" for f in features}
    where = "run" if shapes else "no-fault"
    for ev in whole | events.get("run", set()):
        out |= {f"{f} | {where} | {ev}" for f in features}
    return out


def stored_run_cells(run_dir: Path) -> set[str]:
    """``run_cells`` of a stored run directory."""
    scenario = json.loads((run_dir / "scenario.json").read_text())["scenario"]
    results = json.loads((run_dir / "results.json").read_text())
    return run_cells(scenario, results)
