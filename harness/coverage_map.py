"""The coverage map: each broker plugin's declared features against the fault kinds it supports,
and which (feature, fault kind) cells the shipped scenarios reach.

A cell is reached by a scenario's coverage record (``bench/results/coverage/<scenario>.json``):
either measured from a run (``source: run``: what the workload did, what the nemesis did, what
the broker's logs said; ``harness.coverage``), or computed from the scenario alone
(``source: plan``: its planned fault schedule and its workload settings, with no events, for a
scenario not run yet). Only measured records fill a hole: a feature's ``wanted`` cell that no
run reached is a hole, listed by name. ``scripts/gen_coverage.py`` writes the records and the
page ``docs/explanation/coverage.md``; a test keeps the page current and lists the holes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.coverage import coverage_record
from harness.spec.broker import BrokerPlugin

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "bench" / "results" / "coverage"
PAGE = ROOT / "docs" / "explanation" / "coverage.md"
S = 1_000_000_000
PLAN_USE_STEP_S = 1.0
"""A planned record's workload uses: one every second of the workload (what it is configured to do)."""


def planned_uses(scenario: Mapping[str, Any]) -> dict[str, list[int]]:
    """The workload uses a scenario's settings ask for, spread over its whole duration."""
    w = scenario.get("workload") or {}
    duration = float(w.get("duration") or 0)
    times = [int(i * PLAN_USE_STEP_S * S) for i in range(int(duration / PLAN_USE_STEP_S) + 1)]
    c = w.get("consumer") or {}
    consumers = int(w.get("consumers") or 0) > 0
    asked = {
        "publish": True,
        "transactions": bool(w.get("transactions")),
        "delay": bool(w.get("delay")),
        "requeue": consumers and float(c.get("requeue") or 0) > 0,
        "recover": consumers and float(c.get("recover_every") or 0) > 0,
        "close": consumers and float(c.get("close_every") or 0) > 0,
        "crash": consumers and float(c.get("crash_every") or 0) > 0,
        "slow-ack": consumers and int(c.get("slow") or 0) > 0,
        "ttl": bool(w.get("ttl_ms") or w.get("expiration_ms")),
        "dead-letter": bool(w.get("dead_letter")),
    }
    return {use: list(times) for use, on in asked.items() if on}


def planned_windows(steps: Iterable[Mapping[str, Any]], duration: float) -> list[dict[str, Any]]:
    """Fault windows as planned: from each step's start to its heal (or the workload's end)."""
    out = []
    for s in steps:
        hold = s.get("hold")
        end = float(s["at"]) + (float(hold) if hold is not None else max(0.0, duration - float(s["at"])))
        out.append(
            {
                "fault_id": s["fault_id"],
                "kind": s["kind"],
                "start_ns": int(float(s["at"]) * S),
                "end_ns": int(end * S),
                "applied": True,
            }
        )
    return out


def planned_record(
    plugin: BrokerPlugin,
    scenario: Mapping[str, Any],
    settings: Mapping[str, Any],
    steps: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """What a scenario's plan would cover, no run: its steps, its workload settings, no events."""
    duration = float((scenario.get("workload") or {}).get("duration") or 0)
    windows = planned_windows(steps, duration)
    return coverage_record(plugin, scenario, settings, planned_uses(scenario), windows, [])


def load_records(directory: Path = RECORDS) -> list[dict[str, Any]]:
    if not directory.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def supported_faults(plugin: BrokerPlugin, faults: Mapping[str, Any]) -> list[str]:
    """The fault kinds a plugin can suffer: those whose required capabilities it declares."""
    return sorted(k for k, cls in faults.items() if cls.requires <= plugin.capabilities)


def reached(
    records: Iterable[Mapping[str, Any]], broker: str
) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Per (feature, fault kind): the records that reached it."""
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("broker") != broker:
            continue
        for f, k, e in r["coverage"]["cells"]:
            if e is None:
                out.setdefault((f, k), []).append(r)
    return out


def events_in(records: Iterable[Mapping[str, Any]], feature: str, kind: str) -> list[str]:
    return sorted(
        {e for r in records for f, k, e in r["coverage"]["cells"] if f == feature and k == kind and e}
    )


def holes(
    plugin: BrokerPlugin,
    faults: Mapping[str, Any],
    records: Iterable[Mapping[str, Any]],
    *,
    drivable: bool = True,
) -> list[str]:
    """Wanted cells no run reached, by name (``feature × fault``); with ``drivable``, only those of
    features the workload can drive."""
    kinds = set(supported_faults(plugin, faults))
    measured = reached([r for r in records if r.get("source") == "run"], plugin.name)
    return [
        f"{f.name} × {k}"
        for f in plugin.features
        if f.drivable or not drivable
        for k in f.wanted
        if k in kinds and (f.name, k) not in measured
    ]


def _mark(cell: list[Mapping[str, Any]] | None, wanted: bool) -> str:
    if cell and any(r.get("source") == "run" for r in cell):
        return "run"
    if cell:
        return "plan" + ("" if not wanted else " (hole)")
    return "**hole**" if wanted else ""


def render(plugins: Sequence[BrokerPlugin], faults: Mapping[str, Any], records: list[dict[str, Any]]) -> str:
    """The page ``docs/explanation/coverage.md``, from the plugins' declarations and the records."""
    out = [
        "# Coverage map",
        "",
        "<!-- generated by scripts/gen_coverage.py from bench/results/coverage/*.json; do not edit -->",
        "",
        "Which broker features the shipped scenarios exercise under which fault kinds. Each broker "
        "plugin declares its features (`BrokerPlugin.features`: queue types, mirroring, transactions, "
        "delayed messages, replication modes, membership, consumer behaviours) and, for each, the fault "
        "kinds it must be exercised under (`wanted`). A cell is reached when the feature was in use while "
        "a fault of that kind was held or in the 5 s after its heal: a setting that was on, an operation "
        "the workload did (read from the history), a fault kind that is the feature (a membership "
        "change), or an event the broker reported (read from its logs).",
        "",
        "Events are what a broker plugin reports of its own internal states (`BrokerPlugin.events`, by "
        "default its `log_events` matched against its collected logs): a promotion of an unsynced mirror, "
        "a flush timeout, a stream leader elected. They are not failures but states worth reaching "
        '(Antithesis calls them "sometimes" assertions). A run keeps them in `results.json` under '
        "`events`, each with the fault windows it fell in, and its cells under `coverage`; the terminal "
        "and `report.html` show both.",
        "",
        "Each scenario has a coverage record in `bench/results/coverage/`. **run**: measured from a run "
        "of the scenario (`results.json`'s `coverage`). **plan**: computed from the scenario's planned "
        "schedule and workload settings only, not run yet; a plan never fills a hole. **hole**: a wanted "
        "cell no run reached. A blank cell: neither wanted nor reached.",
        "",
        "Regenerate with `python3 scripts/gen_coverage.py` (add `--record RUN_DIR` to store a run's "
        "record first); `tests/docs/test_coverage_map.py` fails when this page is stale and lists the "
        "holes of the reference broker's drivable features.",
        "",
    ]
    for plugin in plugins:
        out += _plugin_section(plugin, faults, records)
    return "\n".join(out + _records_section(records))


def _plugin_section(
    plugin: BrokerPlugin, faults: Mapping[str, Any], records: list[dict[str, Any]]
) -> list[str]:
    """One broker's table of features by fault kind, its features and events, what reached each
    cell and the holes."""
    if not plugin.features:
        return []
    kinds = supported_faults(plugin, faults)
    cells = reached(records, plugin.name)
    shown = [k for k in kinds if any(k in f.wanted or (f.name, k) in cells for f in plugin.features)]
    out = [f"## {plugin.name}", ""]
    out.append("| feature | " + " | ".join(shown) + " |")
    out.append("| --- | " + " | ".join("---" for _ in shown) + " |")
    for f in plugin.features:
        name = f.name if f.drivable else f"{f.name} (no workload drives it)"
        row = [_mark(cells.get((f.name, k)), k in f.wanted) for k in shown]
        out.append(f"| {name} | " + " | ".join(row) + " |")
    out.append("")
    out.append("Features:")
    out.append("")
    for f in plugin.features:
        out.append(f"- **{f.name}**: {f.description}.")
    out.append("")
    if plugin.log_events:
        out.append(
            "Events it reports (read from its logs): "
            + ", ".join(f"`{e.name}`" for e in plugin.log_events)
            + "."
        )
        out.append("")
    lines = []
    for f in plugin.features:
        for k in shown:
            recs = cells.get((f.name, k))
            if not recs:
                continue
            names = ", ".join(
                f"`{r['scenario']}`" + ("" if r.get("source") == "run" else " (plan)")
                for r in sorted(recs, key=lambda r: r["scenario"])
            )
            ev = events_in(recs, f.name, k)
            lines.append(f"- {f.name} × {k}: {names}" + (f"; events: {', '.join(ev)}" if ev else ""))
    if lines:
        out += ["Reached by:", "", *lines, ""]
    return out + _holes(plugin, faults, records)


def _holes(plugin: BrokerPlugin, faults: Mapping[str, Any], records: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    found = holes(plugin, faults, records, drivable=False)
    if found:
        out += ["Holes (wanted, reached by no run):", ""]
        drivable = {f.name for f in plugin.features if f.drivable}
        for h in found:
            feature = h.split(" × ")[0]
            out.append(f"- {h}" + ("" if feature in drivable else " (no workload drives the feature)"))
        out.append("")
    return out


def _records_section(records: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    recs = sorted(records, key=lambda r: r["scenario"])
    if recs:
        out += [
            "## Records",
            "",
            "| scenario | broker | source | seed | verdict | events |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in recs:
            run = r.get("run") or {}
            seen = ", ".join(f"{k} ×{v}" for k, v in (r["coverage"].get("events") or {}).items())
            out.append(
                f"| `{r['scenario']}` | {r['broker']} | {r.get('source')} | {run.get('seed', '-')} | "
                f"{run.get('verdict', '-')} | {seen or '-'} |"
            )
        out.append("")
    return out
