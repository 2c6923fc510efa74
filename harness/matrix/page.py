"""The graded matrix as a docs page (Markdown for mkdocs), a standalone HTML table, and JSON.

Every figure on the page comes from the cell records (``harness.matrix.records``) through the
grade; the page names what a cell does not prove, each cell's seeds, commits and dates, the
run directory behind each seed and the command that runs the cell again. A cell shown from stale
records (``grading.shown_records``) says so in its table entry, its section and both outputs.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from harness.matrix import figure

#: Background colour per verdict (the worst over the cell's seeds), for a durable cell none of
#: whose seeds had a fault bite (``shown``), and for cells without a verdict.
COLOURS = {
    "durable": "#c8e6c9",
    "no fault bit": "#b3e5fc",
    "DUPLICATED": "#fff9c4",
    "UNAVAILABLE": "#ffe0b2",
    "RESURRECTED": "#ffccbc",
    "DEAD_LETTERED": "#ffab91",
    "LOST": "#ef9a9a",
    "INTEGRITY": "#ce93d8",
    "unknown": "#e0e0e0",
    "unsupported": "#f5f5f5",
    "not run": "#ffffff",
}

#: How a cell reads where its colour's key is not the text.
LABELS = {"unsupported": "not supported", "not run": "not run yet", "no fault bit": "durable, no fault bit"}

CAVEATS = """\
What a cell does not prove:

- **One workload.** Every cell runs the same producers, consumers, rate and duration; a broker
  that keeps everything here may lose under another workload (more queues, bigger messages,
  slower consumers, longer outages).
- **One machine.** The clusters are containers on one host sharing its disk and CPU; real
  networks, disks and clocks fail in more ways than the harness's faults model.
- **A handful of seeds.** A cell's share of runs that lost acknowledged messages is bounded over
  its seeds only (exact binomial, 95%); with three durable seeds the bound is still about 63%.
  No seed count turns "no loss seen" into "no loss possible".
- **The faults as written.** A fault class is the schedule below, aimed at node `n1`, where the
  workload declares its queues (the leader at the start); it is not every way the fault could
  happen. A seed whose fault evidence shows that no fault bit (a power cut that found nothing
  unsynced, say) proved nothing about the fault: its cell says in how many seeds, and a cell
  none of whose seeds had a fault bite is coloured apart from durable."""


def _ci(c: Mapping[str, Any]) -> str:
    lo, hi = c.get("runs_lost_low"), c.get("runs_lost_high")
    if hi is None:
        return "no bound from one run"
    if c.get("runs_lost_interval") == "one-sided":
        return f"≤ {hi:.0%}"
    return f"{lo:.0%}–{hi:.0%}"


def _recovery(c: Mapping[str, Any]) -> str:
    rows = [r for r in c.get("recovery") or [] if r.get("median_s") is not None]
    if not rows:
        never = sum(r.get("runs_never") or 0 for r in c.get("recovery") or [])
        return f"did not come back in {never} run(s)" if never else "recovery: -"
    r = max(rows, key=lambda r: r["samples"])
    out = f"recovery {r['median_s']:.2f} s (worst {max(x['max_s'] for x in rows):.2f} s)"
    never = sum(x.get("runs_never") or 0 for x in c.get("recovery") or [])
    return out + (f", not back in {never} run(s)" if never else "")


def shown(c: Mapping[str, Any]) -> str:
    """What a cell's colour and first line stand for: its state, or the verdict of a graded cell,
    except that a durable cell none of whose seeds had a fault bite is ``no fault bit``."""
    if c["state"] != "graded":
        return str(c["state"])
    if c["verdict"] == "durable" and c.get("no_fault_bit") and c["no_fault_bit"] == c["runs"]:
        return "no fault bit"
    return str(c["verdict"])


def cell_lines(c: Mapping[str, Any]) -> list[str]:
    """A graded cell's lines in the table: verdict, seeds in which no fault bit, runs lost and
    bound, loss per million, recovery, anomalies."""
    if c["state"] != "graded":
        return [LABELS.get(c["state"], c["state"])]
    ppm = c.get("lost_per_million")
    hollow = c.get("no_fault_bit") or 0
    lines = [
        LABELS.get(shown(c), shown(c)),
        *([stale_line(c["stale"])] if c.get("stale") else []),
        *([f"fault did not bite in {hollow} of {c['runs']} seeds"] if hollow else []),
        f"{c['runs_lost']}/{c['graded_runs']} runs lost ({_ci(c)})",
        f"{ppm:g} lost per million" if ppm is not None else "nothing confirmed",
        _recovery(c),
    ]
    if c.get("longest_outage_s") is not None:
        lines.append(f"longest outage {c['longest_outage_s']:.1f} s")
    if c.get("anomalies"):
        lines.append(", ".join(c["anomalies"]))
    return lines


def stale_line(stale: Mapping[str, Any]) -> str:
    """What a cell shown from stale records says of them: the last one's commit and date."""
    return f"stale: recorded {str(stale.get('date') or '?')[:10]} at {stale.get('commit')}, under another key"


#: How a cell shown from stale records is drawn: its verdict's colour, faded, with a dashed border.
STALE_STYLE = "opacity:.6;border:1px dashed #555"


def _badge(state: str, stale: bool = False) -> str:
    text = html.escape(LABELS.get(state, state) + (" (stale)" if stale else ""))
    style = f"background:{COLOURS.get(state, '#e0e0e0')};padding:0 .3em" + (
        f";{STALE_STYLE}" if stale else ""
    )
    return f'<span style="{style}">{text}</span>'


def _counts(data: Mapping[str, Any]) -> str:
    n = data["counts"]
    return (
        f"Cells: {n['current']} graded from records of this tree's content keys, {n['stale']} from "
        "stale records (marked *stale*: made under another scenario, image recipe or harness "
        f"version; shown until the cell runs again and replaces them), {n['not run']} with no "
        f"record yet, {n['unsupported']} not supported ({len(data['cells'])} in all)."
    )


def markdown(data: Mapping[str, Any], *, source: str, results: str) -> str:
    out = [
        f"# Durability matrix: `{data['matrix']}`",
        "",
        f"<!-- generated by `brokerchaos matrix {source}` from the cell records in {results}/ "
        "(`python3 scripts/gen_matrix.py` regenerates it, `--check` in CI): do not edit -->",
        "",
    ]
    if data.get("description"):
        out += [data["description"], ""]
    out += [
        f"Every cell is one configuration under one fault class: ordinary runs of one scenario, "
        f"one per seed, graded together. Cells are kept as small records in `{results}/` and "
        "accumulate over reruns; see [Run a durability matrix](../how-to/matrix.md)."
        + (" How they were made is at the end of the page." if data.get("records") else ""),
        "",
        CAVEATS,
        "",
        *_table(data),
        "",
        *_faults(data),
        "",
        *_configurations(data),
        "",
        "## Cells",
        "",
    ]
    for c in data["cells"]:
        if _has_section(c):
            out += _cell_section(c, source)
    if data.get("records"):
        out += [f"## {RECORDS_TITLE}", "", *(line for p in data["records"] for line in (p, ""))]
    return "\n".join(out).rstrip() + "\n"


#: The title of the page's last section, the matrix file's ``records`` paragraphs.
RECORDS_TITLE = "How these records were made"


def _has_section(c: Mapping[str, Any]) -> bool:
    """A cell has a section below the table if it has something to show: a grade, the reason it is
    not supported, or a note (a note on a cell not run yet is still shown)."""
    return c["state"] in ("graded", "unsupported") or bool(c.get("note"))


def _table(data: Mapping[str, Any]) -> list[str]:
    """The matrix itself: a row per configuration, a column per fault class, each cell linking to
    its section (and marked ``note`` where the matrix file has a note on it)."""
    cells = {(c["configuration"], c["fault"]): c for c in data["cells"]}
    out = [
        "## The matrix",
        "",
        "Colour: the worst verdict over the cell's seeds "
        + ", ".join(_badge(v) for v in COLOURS)
        + "; *durable, no fault bit* is a durable cell none of whose seeds had a fault bite (each "
        "one's fault evidence shows its faults had no effect, so it proved nothing). Each cell: that verdict; the seeds in which no fault bit, if "
        "any; runs that lost acknowledged messages of the runs whose "
        "outcome is known, with the exact 95% bound on that share; acknowledged messages lost "
        "per million confirmed; recovery after the heal (median over every healed step and queue, "
        "and the worst); the longest outage of any seed (no publish or no consume completed); anomaly classes seen. A cell links to its seeds and scenario below"
        + ("; *note* links to what its result was, with its evidence." if _noted(data) else "."),
        "",
        _counts(data),
        "",
        "| configuration | "
        + " | ".join(f"[{f['name']}](#fault-{f['name']})" for f in data["faults"])
        + " |",
        "|---|" + "---|" * len(data["faults"]),
    ]
    for conf in data["configurations"]:
        row = [f"[{conf['label']}](#config-{conf['id']})"]
        for f in data["faults"]:
            c = cells[(conf["id"], f["name"])]
            lines = cell_lines(c)
            head = _badge(shown(c), bool(c.get("stale")))
            rest = "<br>".join(html.escape(x) for x in lines[1:])
            link = f" [›](#cell-{c['cell']})" if _has_section(c) else ""
            note = f" [note](#cell-{c['cell']})" if c.get("note") else ""
            row.append(head + link + note + (f"<br>{rest}" if rest else ""))
        out.append("| " + " | ".join(row) + " |")
    return out


def _noted(data: Mapping[str, Any]) -> bool:
    return any(c.get("note") for c in data["cells"])


def _section(title: str, *columns: str) -> list[str]:
    return [f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _faults(data: Mapping[str, Any]) -> list[str]:
    out = _section(
        "Fault classes", "class", "what it stands for", "schedule (seconds from the workload's start)"
    )
    for f in data["faults"]:
        steps = "<br>".join(f"`{json.dumps(s, sort_keys=True)}`" for s in f["schedule"])
        out.append(f'| <span id="fault-{f["name"]}"></span>`{f["name"]}` | {f["description"]} | {steps} |')
    w = data.get("workload") or {}
    out += [
        "",
        f"The workload of every cell: `{json.dumps(w, sort_keys=True)}` on {data['nodes']} nodes "
        f"(unless a configuration says otherwise), checked by {', '.join(data.get('checkers') or ['the default checkers'])}.",
    ]
    return out


def _configurations(data: Mapping[str, Any]) -> list[str]:
    out = _section("Configurations", "configuration", "broker plugin", "version", "settings", "nodes")
    for c in data["configurations"]:
        version = c["version"] or "the plugin's default"
        settings = f"`{json.dumps(c['settings'], sort_keys=True)}`" if c["settings"] else "-"
        out.append(
            f'| <span id="config-{c["id"]}"></span>{c["label"]} (`{c["id"]}`) | `{c["broker"]}` | '
            f"{version} | {settings} | {c['nodes']} |"
        )
    return out


def _cell_section(c: Mapping[str, Any], source: str) -> list[str]:
    out = [f"### `{c['cell']}` {{#cell-{c['cell']}}}", ""]
    if c.get("note"):
        first, *more = c["note"].split("\n\n")
        out += [f"**Note:** {first}", "", *(line for p in more for line in (p, ""))]
    if c["state"] == "unsupported":
        return out + [f"Not supported: {c['reason']}", ""]
    if c["state"] != "graded":
        return out + [LABELS.get(c["state"], c["state"]).capitalize() + ".", ""]
    if c.get("stale"):
        out += [
            f"**Stale:** {c['stale']['records']} record(s), the last made {c['stale']['date']} at "
            f"`{c['stale']['commit']}`, under another content key than this tree's (scenario, image "
            "recipe or harness version): what the cell did then, shown until it runs again.",
            "",
        ]
    out += [
        f"{c['statement']}" if c.get("statement") else "",
        "",
        "| seed | verdict | confirmed | lost | seconds | commit | date | run directory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in c["seeds"]:
        verdict = f"{s['verdict']} (no fault bit)" if s.get("no_fault_bit") else s["verdict"]
        out.append(
            f"| {s['seed']} | {verdict} | {s['confirmed']} | {s['lost']} | {s['seconds']} | "
            f"`{s['commit']}` | {s['date']} | `{s['run_dir']}` |"
        )
    out += _figures(c)
    seeds = " ".join(f"--seed {s['seed']}" for s in c["seeds"])
    scenario = yaml.safe_dump(dict(c.get("scenario") or {}), sort_keys=False).rstrip().splitlines()
    out += [
        "",
        f"Run it again: `brokerchaos matrix {source} --cell {c['cell']} {seeds} --force` (each run's "
        "scenario file is `scenario.yaml` in its store root, `<store>/matrix/<matrix>/runs/<cell>/seed-N/`).",
        "",
        f'??? note "Scenario of `{c["cell"]}` (seed {c["seeds"][0]["seed"]})"',
        "    ```yaml",
        *(f"    {line}" for line in scenario),
        "    ```",
        "",
    ]
    return out


def _figures(c: Mapping[str, Any]) -> list[str]:
    """Each seed's operations over time, fault windows shaded (records made before figures were
    kept have none, and say so)."""
    out = [""]
    for s in c["seeds"]:
        drawn = figure.svg(s.get("timeline") or {}, f"{c['cell']} seed {s['seed']}")
        out += [f"Seed {s['seed']}:", "", drawn or "(no figure: recorded before records kept one)", ""]
    return out


def html_page(data: Mapping[str, Any]) -> str:
    """A standalone table for CI artefacts: the same cells, each linking to its grade report."""
    cells = {(c["configuration"], c["fault"]): c for c in data["cells"]}
    head = "".join(f"<th>{html.escape(f['name'])}</th>" for f in data["faults"])
    rows = []
    for conf in data["configurations"]:
        tds = []
        for f in data["faults"]:
            c = cells[(conf["id"], f["name"])]
            state = shown(c)
            text = "<br>".join(html.escape(x) for x in cell_lines(c))
            if c["state"] == "unsupported":
                text += f"<br><small>{html.escape(c['reason'])}</small>"
            if c.get("report"):
                text += f'<br><a href="{html.escape(str(c["report"]))}">grade report</a>'
            if c.get("note"):
                text += f'<br><a href="#cell-{html.escape(c["cell"])}">note</a>'
            style = f"background:{COLOURS.get(state, '#e0e0e0')}" + (
                f";{STALE_STYLE}" if c.get("stale") else ""
            )
            tds.append(f'<td style="{style}">{text}</td>')
        rows.append(f"<tr><th>{html.escape(conf['label'])}</th>{''.join(tds)}</tr>")
    return (
        f"<!doctype html><meta charset=utf-8><title>matrix {html.escape(data['matrix'])}</title>"
        "<style>td,th{border:1px solid #999;padding:4px;vertical-align:top;font:13px sans-serif}</style>"
        f"<h1>Durability matrix {html.escape(data['matrix'])}</h1><p>{html.escape(_counts(data))}</p>"
        f"<table><tr><th>configuration</th>{head}</tr>{''.join(rows)}</table>"
        f"{_html_prose(data)}\n"
    )


def _html_prose(data: Mapping[str, Any]) -> str:
    """The notes on cells (each under its cell's anchor, as on the docs page) and how the records
    were made, as paragraphs of escaped text."""

    def paras(text: str) -> str:
        return "".join(f"<p>{html.escape(p)}</p>" for p in text.split("\n\n"))

    noted = [c for c in data["cells"] if c.get("note")]
    out = "<h2>Notes on cells</h2>" if noted else ""
    for c in noted:
        out += f'<h3 id="cell-{html.escape(c["cell"])}">{html.escape(c["cell"])}</h3>{paras(c["note"])}'
    if data.get("records"):
        out += f"<h2>{RECORDS_TITLE}</h2>" + "".join(paras(p) for p in data["records"])
    return out


def write_outputs(data: Mapping[str, Any], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    j, h = out / "matrix.json", out / "matrix.html"
    j.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    h.write_text(html_page(data))
    return j, h
