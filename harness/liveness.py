"""The text a terminal and the Allure steps show of a run's liveness (``results.liveness``).

A leaf module: it reads the results schema only (``harness.spec.results.Liveness``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.spec.results import describe_stranded
from harness.spec.rundir import NODES

NS_PER_S = 1_000_000_000
SHOWN = 12
"""Recovery rows a terminal shows; the report and results.json have every one."""


def seconds(ns: int | None) -> str:
    return "never" if ns is None else f"{ns / NS_PER_S:.1f}s"


def recovery_row(r: Mapping[str, Any]) -> str:
    """One fault step and queue on one line."""
    if not r.get("healed"):
        return f"{r['fault_id']} ({r['kind']}) {r['queue']}: never healed, nothing measured"
    pub = (
        seconds(r.get("publish_ok_ns"))
        if r.get("publish_demand") or r.get("publish_ok_ns") is not None
        else "-"
    )
    state = "recovered" if r.get("recovered") else "NOT recovered"
    if r.get("recovered") and r.get("recovery_ns") is None:
        state = "nothing asked of it after the heal"
    took = f" in {seconds(r['recovery_ns'])}" if r.get("recovery_ns") is not None else ""
    budget = ""
    if r.get("budget_s") is not None:
        budget = (
            f", over the budget of {r['budget_s']:g}s"
            if r.get("over_budget")
            else f", budget {r['budget_s']:g}s"
        )
    return (
        f"{r['fault_id']} ({r['kind']}{' on ' + r['node'] if r.get('node') else ''}) {r['queue']}: "
        f"publish ok after {pub}, consume ok after {seconds(r.get('consume_ok_ns'))}: {state}{took}{budget}"
    )


def liveness_lines(results: Mapping[str, Any], width: int) -> list[str]:
    """The recovery of each fault step and queue, the unavailable windows and the run's figures."""
    lv = results.get("liveness")
    if not isinstance(lv, Mapping):
        return []
    pad = f"  {'':<{width}}  "
    lines = []
    rows = list(lv.get("recovery") or [])
    if rows:
        lines.append(f"  {'recovery':<{width}}  " + recovery_row(rows[0]))
        lines += [pad + recovery_row(r) for r in rows[1:SHOWN]]
        if len(rows) > SHOWN:
            lines.append(pad + f"... {len(rows) - SHOWN} more in the report and results.json")
    windows = list(lv.get("windows") or [])
    share = lv.get("available_share")
    avail = f", available {share:.1%} of the time" if isinstance(share, float) else ""
    lines.append(
        f"  {'unavailable windows':<{width}}  {len(windows)} over {seconds(lv.get('threshold_ns'))} "
        f"(longest {seconds(lv.get('longest_outage_ns') or 0)}{avail})"
    )
    for w in windows[:SHOWN]:
        during = ", ".join(w.get("fault_ids") or []) or "no fault"
        end = "" if w.get("ended_by_ok") else ", no ok of its kind after it"
        lines.append(
            pad + f"{w['queue']} {w['kind']}: {seconds(w['start_ns'])} to {seconds(w['end_ns'])} "
            f"({seconds(w['duration_ns'])}{end}; during {during})"
        )
    for u in lv.get("unavailable") or []:
        for line in u.get("log") or []:
            lines.append(pad + f"log: {line}")
    for i, g in enumerate(lv.get("stranded") or []):
        lines.append((f"  {'stranded':<{width}}  " if i == 0 else pad) + describe_stranded(g))
    lines += down_lines(lv.get("nodes_down") or [], lv.get("serving"), width)
    return lines


def down_lines(down: Sequence[Mapping[str, Any]], serving: Sequence[str] | None, width: int) -> list[str]:
    """Each node the final heal could not bring back, why, its last log lines, and what served."""
    if not down:
        return []
    pad = f"  {'':<{width}}  "
    lines = [f"  {'did not come back':<{width}}  " + ", ".join(d["node"] for d in down)]
    lines.append(pad + f"drained through: {', '.join(serving or []) or 'no node (nothing drained)'}")
    for d in down:
        why = str(d.get("reason") or "").splitlines()
        lines += [pad + f"{d['node']}: {why[0] if why else 'no reason recorded'}"]
        lines += [pad + f"{d['node']} log: {line.strip()[:300]}" for line in why[1:][-LOG_LINES:]]
    return lines


LOG_LINES = 3
"""Lines per node kept of what its logs said about a queue that never came back."""


def scrape_logs(run_dir: Any, results: dict[str, Any]) -> None:
    """For each queue that never came back (``liveness.unavailable``), the last lines of each node's
    collected logs (``nodes/<node>/``) that name it: what the broker's own nodes said. Read after
    teardown, when the logs are in the run directory."""
    from pathlib import Path

    lv = results.get("liveness")
    if not isinstance(lv, dict) or not lv.get("unavailable"):
        return
    nodes = Path(run_dir) / NODES
    for u in lv["unavailable"]:
        found: list[str] = []
        for node_dir in sorted(p for p in nodes.glob("*") if p.is_dir()):
            hits: list[str] = []
            for f in sorted(x for x in node_dir.rglob("*") if x.is_file() and x.name != "data-dir.txt"):
                try:
                    text = f.read_text(errors="replace")
                except OSError:
                    continue
                hits += [line.strip()[:300] for line in text.splitlines() if u["queue"] in line]
            found += [f"{node_dir.name}: {line}" for line in hits[-LOG_LINES:]]
        u["log"] = found
