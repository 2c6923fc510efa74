"""A run's coverage: the broker's events and the (feature, fault kind, event) cells it reached.

Computed after the run from what the run directory holds, so ``analyze`` computes it again on
a stored run: the broker's events from each node's collected logs (the plugin's ``events``),
what the workload used from the history, what the nemesis did from the fault windows the
checker found (``results.faults``), which features the plugin declares (``features``).

``cells(run)`` is the one function a search over schedules needs: the set of ``Cell`` a run
reached, read back from its ``results.json`` (no plugin, no Docker).

Events go to ``results.json`` (``events``, each with the fault windows it fell in), not into the
history: they are read from the broker's logs after teardown, out of the history's order, and
from a node's logs they can be read again at any time; the history stays what the workload and
the nemesis wrote while the run went.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.history import read_jsonl
from harness.spec.broker import BrokerPlugin
from harness.spec.coverage import RECOVERY_NS, WORKLOAD_FIELDS, BrokerEvent, Cell, Feature
from harness.spec.errors import ScenarioError
from harness.spec.history import is_dead_letter_queue
from harness.spec.rundir import HISTORY_JSONL, NODES, RESULTS_JSON, SCENARIO_JSON
from harness.spec.scenario import WorkloadSection

NO_EVENT = None

#: Each workload use by how the history shows it (``harness.spec.coverage.WORKLOAD_USES``).
_ABANDON_USES = {
    "requeue": "requeue",
    "recover": "recover_every",
    "close": "close_every",
    "crash": "crash_every",
}


def history_clock(history: Path) -> int | None:
    """Wall-clock nanoseconds (epoch) at the history's zero: its first record's ``wall_time``
    less its ``time_ns``. None for an empty history."""
    for rec in read_jsonl(history):
        wall = datetime.fromisoformat(rec["wall_time"])
        return int(wall.timestamp() * 1e9) - int(rec["time_ns"])
    return None


def workload_uses(history: Path, scenario: Mapping[str, Any]) -> dict[str, list[int]]:
    """When the history shows each workload use (``WORKLOAD_USES``), as sorted ``time_ns``."""
    out: dict[str, list[int]] = {}
    consumer = (scenario.get("workload") or {}).get("consumer") or {}
    slow = int(consumer.get("slow") or 0) > 0
    # A delivery is also given back when a fault ends its channel (cause close or crash): only
    # the behaviours the workload asks for count as its use of them.
    asked = {cause: float(consumer.get(key) or 0) > 0 for cause, key in _ABANDON_USES.items()}
    for rec in read_jsonl(history):
        if rec.get("f") == "consume" and rec.get("type") == "ok" and is_dead_letter_queue(rec.get("queue")):
            died = _load(rec.get("detail")).get("dead_letter") or {}
            out.setdefault("dead-letter", []).append(int(rec["time_ns"]))
            if died.get("reason") == "expired":
                out.setdefault("ttl", []).append(int(rec["time_ns"]))
        if rec.get("type") != "invoke" or rec.get("process") == "nemesis":
            continue
        f, t = rec.get("f"), int(rec["time_ns"])
        use: str | None = None
        if f == "publish":
            detail = _load(rec.get("detail"))
            use = "delay" if "delay_ms" in detail else "publish"
            out.setdefault("publish", []).append(t)
        elif f in ("commit", "rollback"):
            use = "transactions"
        elif f == "abandon":
            cause = _load(rec.get("detail")).get("cause")
            use = cause if isinstance(cause, str) and asked.get(cause) else None
        elif f == "ack" and slow:
            use = "slow-ack"
        if use is not None and use != "publish":
            out.setdefault(use, []).append(t)
    return out


def check_workload_features(w: WorkloadSection, plugin: BrokerPlugin) -> None:
    """A workload field that drives a broker feature (``WORKLOAD_FIELDS``) needs a plugin that
    declares a feature with that use: otherwise the run could not exercise what it asks for."""
    declared = {u for f in plugin.features for u in f.workload}
    for name, use in WORKLOAD_FIELDS.items():
        if getattr(w, name) not in (None, False) and use not in declared:
            raise ScenarioError(
                f"workload.{name}: broker plugin {plugin.name!r} has no feature it drives "
                f"(none declares the workload use {use!r}); remove it from this scenario"
            )


def read_events(plugin: BrokerPlugin, run_dir: Path) -> list[BrokerEvent]:
    """Every node's events, from the files of the node's directory the plugin reads (``event_logs``)."""
    out: list[BrokerEvent] = []
    nodes = run_dir / NODES
    for node_dir in sorted(p for p in nodes.glob("*") if p.is_dir()):
        logs: dict[str, str] = {}
        for pattern in plugin.event_logs:
            for f in sorted(node_dir.glob(pattern)):
                if f.is_file():
                    logs[str(f.relative_to(node_dir))] = f.read_text(errors="replace")
        out += plugin.events(node_dir.name, logs)
    return out


def _in(t: int | None, w: Mapping[str, Any]) -> bool:
    return t is not None and w["start_ns"] <= t <= w["end_ns"] + RECOVERY_NS


def event_records(
    events: Iterable[BrokerEvent], zero_ns: int | None, windows: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Events on the history's clock, each with the fault windows it fell in (held, or within
    ``RECOVERY_NS`` after the heal), in time order (untimed ones last)."""
    out = []
    for e in events:
        t = None
        if e.wall_time is not None and zero_ns is not None:
            t = int(e.wall_time.astimezone(UTC).timestamp() * 1e9) - zero_ns
        out.append(
            {
                "node": e.node,
                "name": e.name,
                "time_ns": t,
                "wall_time": e.wall_time.isoformat() if e.wall_time else None,
                "fault_ids": [w["fault_id"] for w in windows if _in(t, w)],
                "detail": dict(e.detail),
                "line": e.line,
            }
        )
    out.sort(key=lambda r: (r["time_ns"] is None, r["time_ns"] or 0, r["node"]))
    return out


def _in_use(
    feature: Feature,
    w: Mapping[str, Any],
    uses: Mapping[str, list[int]],
    windows: Sequence[Mapping[str, Any]],
    events: list[dict[str, Any]],
) -> bool:
    if feature.workload and not any(_in(t, w) for u in feature.workload for t in uses.get(u, ())):
        return False
    if feature.faults and not any(
        o["kind"] in feature.faults
        and o["start_ns"] <= w["end_ns"] + RECOVERY_NS
        and w["start_ns"] <= o["end_ns"]
        for o in windows
    ):
        return False
    return not feature.events or any(e["name"] in feature.events and _in(e["time_ns"], w) for e in events)


def coverage_record(
    plugin: BrokerPlugin,
    scenario: Mapping[str, Any],
    settings: Mapping[str, Any],
    uses: Mapping[str, list[int]],
    faults: Sequence[Mapping[str, Any]],
    events: list[dict[str, Any]],
) -> dict[str, Any]:
    """What one run covered: the features in use under each applied fault window, the events
    seen there, and the cells (``Cell``) that makes."""
    windows = [w for w in faults if w.get("applied")]
    nodes = int((scenario.get("broker") or {}).get("nodes") or 1)
    gated = [f for f in plugin.features if f.settings_match(settings, nodes)]
    cells: set[Cell] = set()
    per_window = []
    for w in windows:
        used = [f.name for f in gated if _in_use(f, w, uses, windows, events)]
        seen = sorted({e["name"] for e in events if w["fault_id"] in e["fault_ids"]})
        for name in used:
            cells.add(Cell(name, w["kind"], NO_EVENT))
            cells.update(Cell(name, w["kind"], e) for e in seen)
        per_window.append({"fault_id": w["fault_id"], "kind": w["kind"], "features": used, "events": seen})
    counts: dict[str, int] = {}
    for e in events:
        counts[e["name"]] = counts.get(e["name"], 0) + 1
    return {
        "broker": plugin.name,
        "features": sorted(f.name for f in gated),
        "workload_uses": sorted(u for u, ts in uses.items() if ts),
        "faults": sorted({w["kind"] for w in windows}),
        "windows": per_window,
        "events": dict(sorted(counts.items())),
        "cells": sorted([list(c) for c in cells], key=lambda c: (c[0], c[1], c[2] or "")),
    }


def annotate(plugin: BrokerPlugin, run_dir: Path, results: dict[str, Any]) -> None:
    """Add ``events`` and ``coverage`` to a run's results (after teardown: the logs are collected)."""
    stored = json.loads((run_dir / SCENARIO_JSON).read_text())
    scenario = stored.get("scenario") or {}
    settings = (stored.get("broker") or {}).get("settings") or {}
    history = run_dir / HISTORY_JSONL
    faults = list(results.get("faults") or [])
    zero = history_clock(history) if history.exists() else None
    events = event_records(read_events(plugin, run_dir), zero, faults)
    uses = workload_uses(history, scenario) if history.exists() else {}
    results["events"] = events
    results["coverage"] = coverage_record(plugin, scenario, settings, uses, faults, events)


def cells(run: Path | str | Mapping[str, Any]) -> set[Cell]:
    """The cells a run reached: from a run directory (its ``results.json``) or from its results."""
    if isinstance(run, Mapping):
        results = run
    else:
        path = Path(run)
        results = json.loads((path / RESULTS_JSON if path.is_dir() else path).read_text())
    cov = results.get("coverage") or {}
    return {Cell(c[0], c[1], c[2]) for c in cov.get("cells") or []}


def _load(text: Any) -> dict[str, Any]:
    if not text:
        return {}
    try:
        out = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return {}
    return out if isinstance(out, dict) else {}


def coverage_lines(results: Mapping[str, Any], width: int) -> list[str]:
    """The terminal's lines for a run's events and coverage (``results.events``, ``results.coverage``)."""
    cov = results.get("coverage")
    if not isinstance(cov, Mapping):
        return []
    pad = f"  {'':<{width}}  "
    if cov.get("error"):
        return [f"  {'events':<{width}}  not read: {cov['error']}"]
    counts = cov.get("events") or {}
    seen = ", ".join(f"{k} x{v}" for k, v in counts.items()) or "none"
    lines = [f"  {'events':<{width}}  {seen}"]
    if not cov.get("features"):  # one line, not one per fault: nothing of the map applies here
        lines.append(pad + "no feature the broker plugin declares applies to this configuration")
    for w in cov.get("windows") or []:
        ev = f"; events {', '.join(w['events'])}" if w.get("events") else ""
        if not cov.get("features"):
            if ev:
                lines.append(pad + f"{w['fault_id']} ({w['kind']}){ev}")
            continue
        feats = ", ".join(w.get("features") or []) or "no declared feature in use"
        lines.append(pad + f"{w['fault_id']} ({w['kind']}): {feats}{ev}")
    cells_n = len(cov.get("cells") or [])
    lines.append(f"  {'coverage cells':<{width}}  {cells_n}")
    return lines
