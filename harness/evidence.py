"""Proof that the faults bit: every fault action's evidence, read back from the history.

The nemesis records what each fault measured of its own effect next to the action
(``value.evidence`` of the fault's ``ok`` and of its heal's ``ok``; ``harness.spec.history``).
This module only reads those records: it never names a fault kind, it counts what the
evidence says. A pure function of the history, so ``brokerchaos analyze`` derives the same.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.spec.fault import Evidence
from harness.spec.history import EVIDENCE
from harness.spec.results import FaultAction, FaultEvidence, missing_class

NEMESIS = "nemesis"
#: Exposed message ids kept per cut in ``results.json`` (the counts are always whole).
EXPOSED_SHOWN = 100


def _value(rec: Mapping[str, Any]) -> dict[str, Any]:
    raw = rec.get("value")
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        out = json.loads(raw) if raw else {}
    except (TypeError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def _target(value: Mapping[str, Any], node: Any) -> str | None:
    if isinstance(node, str) and node:
        return node
    nodes = (value.get("params") or {}).get("nodes")
    if isinstance(nodes, list) and nodes and all(isinstance(n, str) for n in nodes):
        return ",".join(nodes)
    return None


def fault_line(fault_id: str, kind: str, node: str | None, reason: str) -> str:
    """``f3 power-loss on n2: nothing unsynced was dropped``."""
    return f"{fault_id} {kind}{f' on {node}' if node else ''}: {reason}"


def _action(
    fid: str, kind: str, node: str | None, applied: bool, ev: Evidence | None, at_ns: int | None = None
) -> FaultAction:
    ev = ev or Evidence.unmeasured("no evidence recorded")
    line = fault_line(fid, kind, node, ev.no_effect_reason or ev.summary) if ev.effect is False else ""
    return {
        "fault_id": fid,
        "kind": kind,
        "node": node,
        "applied": applied,
        "effect": ev.effect,
        "summary": ev.summary,
        "no_effect_reason": ev.no_effect_reason,
        "flags": list(ev.flags),
        "restored": ev.restored,
        "facts": dict(ev.facts),
        "line": line,
        "at_ns": at_ns,
        "exposure": None
        if ev.exposed is None
        else {
            "in_dropped_writes": len(ev.exposed),
            "confirmed_before_cut": None,
            "lost": None,
            "unreachable": None,
            "lower_bound": False,
            "ids": list(ev.exposed),
        },
    }


def fault_evidence(records: Iterable[Mapping[str, Any]]) -> FaultEvidence:
    """Every fault action of a history with its evidence (the heal's supersedes the apply's), counted."""
    seen: dict[str, dict[str, Any]] = {}
    for rec in records:
        if rec.get("process") != NEMESIS or rec.get("type") != "ok":
            continue
        value = _value(rec)
        raw = value.get(EVIDENCE)
        ev = Evidence.from_dict(raw) if isinstance(raw, Mapping) else None
        if rec.get("f") == "heal":
            for fid in value.get("fault_ids") or []:
                if ev is not None and str(fid) in seen:
                    seen[str(fid)]["evidence"] = ev
            continue
        fid = str(value.get("fault_id") or f"{rec.get('f')}@{rec.get('index')}")
        seen[fid] = {
            "kind": str(value.get("kind") or rec.get("f")),
            "node": _target(value, rec.get("node")),
            "evidence": ev,
            "at_ns": rec.get("time_ns"),
        }
    actions = [_action(fid, a["kind"], a["node"], True, a["evidence"], a["at_ns"]) for fid, a in seen.items()]
    return summarize(actions)


def summarize(actions: list[FaultAction]) -> FaultEvidence:
    """The counts and the lines an operator must read, from the actions' evidence."""
    lines: list[str] = []
    for a in actions:
        if a["line"]:
            lines.append(a["line"])
        lines += [fault_line(a["fault_id"], a["kind"], a["node"], f) for f in a["flags"]]
        if a["restored"] is False:
            lines.append(fault_line(a["fault_id"], a["kind"], a["node"], "still in effect after its heal"))
    bit = sum(a["effect"] is True for a in actions)
    none = sum(a["effect"] is False for a in actions)
    return {
        "faults": len(actions),
        "bit": bit,
        "no_effect": none,
        "unmeasured": sum(a["effect"] is None for a in actions),
        "not_restored": sum(a["restored"] is False for a in actions),
        "no_fault_bit": bool(actions) and bit == 0 and none > 0,
        "lines": lines,
        "exposure_lines": [],
        "confirms_after_sync": None,
        "unsynced_lines": [],
        "actions": actions,
    }


def _records(history_jsonl: Path, marker: str) -> Iterable[dict[str, Any]]:
    """The records of a stored history whose line holds ``marker`` (the rest is not parsed)."""
    with history_jsonl.open() as f:
        for line in f:
            if marker in line:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue


def publishes(
    records: Iterable[Mapping[str, Any]], ids: set[str]
) -> tuple[set[str], dict[str, int], int | None]:
    """Which of ``ids`` the history attempted (a publish invoke), when each was confirmed (its
    publish's ``ok``), and when the last publish of all was sent, on the history's clock."""
    attempted: set[str] = set()
    confirmed: dict[str, int] = {}
    last: int | None = None
    for r in records:
        if r.get("f") != "publish":
            continue
        if r.get("type") == "invoke":
            last = max(last or 0, int(r.get("time_ns") or 0))
        if r.get("value") not in ids:
            continue
        if r.get("type") == "invoke":
            attempted.add(str(r["value"]))
        elif r.get("type") == "ok":
            confirmed[str(r["value"])] = int(r["time_ns"])
    return attempted, confirmed, last


def started(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """When each fault's own op was invoked, by fault id, on the history's clock."""
    out: dict[str, int] = {}
    for rec in records:
        if rec.get("process") != NEMESIS or rec.get("type") != "invoke" or rec.get("f") == "heal":
            continue
        fid = _value(rec).get("fault_id")
        if fid is not None and rec.get("time_ns") is not None:
            out.setdefault(str(fid), int(rec["time_ns"]))
    return out


def after_last_publish(
    actions: list[FaultAction], last_publish_ns: int | None, starts: Mapping[str, int]
) -> list[str]:
    """One line per fault applied after the workload's last publish was sent: no publish met it
    (a slow heal before it can push a planned fault past the workload's end). What it did to
    the data already stored still counts; the line says what the run did not test. A fault is
    applied when its op was invoked (``starts``, by fault id): a long fault (a rolling restart)
    completes its op long after publishes met it."""
    if last_publish_ns is None:
        return []
    lines = []
    for a in actions:
        at = starts.get(a["fault_id"], a["at_ns"])
        if at is not None and at > last_publish_ns:
            why = f"applied {(at - last_publish_ns) / 1e9:.1f} s after the last publish was sent: no publish met it"
            lines.append(fault_line(a["fault_id"], a["kind"], a["node"], why))
    return lines


def add_exposure(
    actions: list[FaultAction],
    attempted: set[str],
    confirmed: Mapping[str, int],
    lost: set[str],
    unreachable: Collection[str] = frozenset(),
    capped: bool = False,
) -> list[str]:
    """Per cut whose dropped writes a plugin mapped to messages: how many of them had been
    confirmed before the cut (acknowledged but unsynced), how many of those the checkers found
    lost, and how many they could not read because the drain did not complete (unreachable, not
    known lost). One line per such cut. ``capped``: the checkers listed only the first of the
    run's missing ids, so what the cut's ids meet in the list is a lower bound, said so."""
    floor = "at least " if capped else ""
    lines = []
    for a in actions:
        exp = a["exposure"]
        if exp is None:
            continue
        exp["ids"] = sorted(i for i in exp["ids"] if i in attempted)
        exp["in_dropped_writes"] = len(exp["ids"])
        acked = [
            i for i in exp["ids"] if i in confirmed and (a["at_ns"] is None or confirmed[i] <= a["at_ns"])
        ]
        gone = sum(i in lost for i in acked)
        behind = sum(i in unreachable for i in acked)
        exp["confirmed_before_cut"], exp["lost"], exp["unreachable"] = len(acked), gone, behind
        exp["lower_bound"] = capped and bool(acked)  # none acknowledged: none lost, exactly
        exp["ids"] = exp["ids"][:EXPOSED_SHOWN]
        lines.append(
            fault_line(
                a["fault_id"],
                a["kind"],
                a["node"],
                f"{len(acked)} acknowledged message(s) were unsynced at the cut "
                f"({exp['in_dropped_writes']} in the dropped writes); "
                f"{floor if lost and acked else ''}{gone} of them lost"
                + (f", {floor if acked else ''}{behind} unreachable" if unreachable else ""),
            )
        )
    return lines


def unsynced_lines(actions: list[FaultAction]) -> list[str]:
    """One line per cut that found acknowledged messages unsynced: read only where the broker
    promised a sync before each confirm, where every such message is a broken promise."""
    return [
        fault_line(
            a["fault_id"],
            a["kind"],
            a["node"],
            f"{n} acknowledged message(s) were unsynced at the cut although the broker's settings "
            "promise a sync before each confirm",
        )
        for a in actions
        if a["exposure"] is not None and (n := a["exposure"]["confirmed_before_cut"] or 0)
    ]


def missing(results: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The ids the checkers found missing in a run's results, as (lost, unreachable). The results'
    ``lost`` list holds the confirmed ids the drain did not consume whichever class the counts
    put them in: all lost after a completed drain, all unreachable when it did not complete (or
    a node that holds its own share of them did not come back), so the counts say which."""
    ids = [str(i) for i in results.get("lost") or ()]
    if missing_class(results.get("counts") or {}) == "unreachable":
        return [], ids
    return ids, []


def read_fault_evidence(
    history_jsonl: Path,
    lost: Iterable[str] | None = None,
    confirms_after_sync: bool | None = None,
    unreachable: Iterable[str] | None = None,
    capped: bool = False,
) -> FaultEvidence:
    """``fault_evidence`` of a stored run's ``history.jsonl`` (only the nemesis lines are parsed,
    and, when a cut's dropped writes were mapped to messages, the confirms of those messages),
    with each cut's exposure compared with ``lost`` and ``unreachable`` (the checkers' ids of
    each class, ``missing``; ``capped``: the first of them only), and judged when the broker's
    settings promise a sync before each confirm (``confirms_after_sync``)."""
    if not history_jsonl.exists():
        return summarize([])
    nemesis = list(_records(history_jsonl, '"nemesis"'))
    out = fault_evidence(nemesis)
    out["confirms_after_sync"] = confirms_after_sync
    mapped = [a["exposure"] for a in out["actions"] if a["exposure"] is not None]
    ids = {i for exp in mapped for i in exp["ids"]}
    attempted, confirmed, last = publishes(_records(history_jsonl, '"publish"'), ids)
    out["lines"] += after_last_publish(out["actions"], last, started(nemesis))
    if mapped:  # a cut mapped to no message at all still says so: 0 acknowledged and unsynced
        out["exposure_lines"] = add_exposure(
            out["actions"], attempted, confirmed, set(lost or ()), set(unreachable or ()), capped
        )
        if confirms_after_sync:
            out["unsynced_lines"] = unsynced_lines(out["actions"])
    return out
