"""The shrink's report page: both schedules on one timeline, every step's trials, the failure kept.

One self-contained HTML file (``shrink.html``) with the timeline as inline SVG (also
written alone as ``timeline.svg``), so it opens anywhere without the plotting stack.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from harness.shrink import node_names
from harness.spec.rundir import REPORT_HTML

PALETTE = ("#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
WIDTH, LEFT, ROW, GAP = 980, 150, 22, 14


def _e(x: Any) -> str:
    return html.escape(str(x))


def timeline_svg(data: dict[str, Any]) -> str:
    """Original above, minimal below, one shared time axis; each action a bar from apply to heal."""
    original, best = data["original"], data["best"]
    kinds = sorted({s["kind"] for s in original["steps"]} | {s["kind"] for s in best["steps"]})
    color = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(kinds)}
    span = max(original["duration"], best["duration"], 1.0)
    scale = (WIDTH - LEFT - 130) / span  # room on the right for the last labels

    def x(t: float) -> float:
        return LEFT + t * scale

    parts: list[str] = []
    y = 10

    def lane(title: str, s: dict[str, Any]) -> None:
        nonlocal y
        rate = f"{s['rate']:g}/s" if s["rate"] else "unlimited"
        parts.append(f"<text x='6' y='{y + 15}' font-weight='bold'>{_e(title)}</text>")
        parts.append(
            f"<text x='6' y='{y + 30}' font-size='11' fill='#555'>{s['nodes']} node(s), {rate}</text>"
        )
        parts.append(
            f"<rect x='{x(0):.1f}' y='{y + 4}' width='{s['duration'] * scale:.1f}' height='8' fill='#bbb'/>"
        )
        parts.append(
            f"<text x='{x(s['duration']) + 4:.1f}' y='{y + 12}' font-size='11' fill='#555'>"
            f"workload {s['duration']:g} s</text>"
        )
        y += ROW
        for step in s["steps"]:
            end = step["at"] + (step["hold"] if step["hold"] is not None else s["duration"] - step["at"])
            w = max((end - step["at"]) * scale, 2.0)
            nodes = ",".join(sorted(node_names(step["params"])))
            label = f"{step['fault_id']} {step['kind']} {nodes}".strip()
            parts.append(
                f"<rect x='{x(step['at']):.1f}' y='{y}' width='{w:.1f}' height='{ROW - 6}' rx='3' "
                f"fill='{color[step['kind']]}' fill-opacity='0.85'><title>{_e(label)} at {step['at']:g} s, "
                f"held {step['hold']} s</title></rect>"
            )
            parts.append(
                f"<text x='{x(step['at']) + w + 4:.1f}' y='{y + 12}' font-size='11'>{_e(label)}</text>"
            )
            y += ROW
        if not s["steps"]:
            parts.append(f"<text x='{x(0):.1f}' y='{y + 12}' font-size='11' fill='#555'>no faults</text>")
            y += ROW
        y += GAP

    lane(f"original ({len(original['steps'])})", original)
    parts.append(f"<line x1='0' x2='{WIDTH}' y1='{y - GAP / 2}' y2='{y - GAP / 2}' stroke='#ddd'/>")
    lane(f"minimal ({len(best['steps'])})", best)
    step = next(s for s in (1, 2, 5, 10, 20, 30, 60, 120, 300) if span / s <= 12)
    grid: list[str] = []  # drawn first, under the bars
    t = 0.0
    while t <= span + 1e-9:
        grid.append(f"<line x1='{x(t):.1f}' x2='{x(t):.1f}' y1='6' y2='{y}' stroke='#eee'/>")
        parts.append(f"<text x='{x(t):.1f}' y='{y + 14}' font-size='11' text-anchor='middle'>{t:g}</text>")
        t += step
    parts.append(
        f"<text x='{x(span / 2):.1f}' y='{y + 30}' font-size='11' text-anchor='middle'>"
        "seconds from workload start</text>"
    )
    height = y + 40
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}' "
        f"font-family='sans-serif' font-size='12'><rect width='100%' height='100%' fill='white'/>"
        + "".join(grid + parts)
        + "</svg>"
    )


def _link(out: Path, run_dir: str | None) -> str:
    if not run_dir:
        return "-"
    p = Path(run_dir)
    rel = os.path.relpath(p, out)
    target = rel + ("/report.html" if (p / REPORT_HTML).exists() else "")
    return f"<a href='{_e(target)}'>{_e(p.name)}</a>"


def _results_block(title: str, r: dict[str, Any] | None, steps: list[dict[str, Any]]) -> str:
    if not r:
        return f"<h3>{_e(title)}</h3><p>no results</p>"
    kinds = {s["fault_id"]: s["kind"] for s in steps}
    counts = ", ".join(
        f"{k} {v:,}"
        for k, v in r["counts"].items()
        if k in ("confirmed", "lost", "unreachable", "stuck", "unexpected", "corrupted")
    )
    cls = r.get("missing_as", "lost")  # a shrink made before the classes were apart: lost
    listed, missing = r["lost_listed"], r.get("missing", r["lost_listed"])
    of = f" (of {missing:,}: a lower bound)" if missing > listed else ""
    by_fault = "".join(
        f"<li>{_e(fid)} ({_e(kinds.get(fid, '?'))}): {n:,} of the {listed:,} {cls} messages "
        f"listed{of} were confirmed before it ended</li>"
        for fid, n in sorted(r["lost_by_fault"].items())
    )
    rows = "".join(
        f"<tr><td>{_e(a['fault_kind'])}</td><td>{_e(a['node'])}</td><td>{_e(a.get('status', cls))}</td>"
        f"<td>{a['count']:,}</td></tr>"
        for a in r["attribution"]
    )
    head = "<tr><th>fault kind</th><th>node</th><th>class</th><th>messages</th></tr>"
    return (
        f"<h3>{_e(title)}: {_e(r['verdict'])}</h3><p>{_e(r['reason'])}</p><p>{_e(counts)}</p>"
        + (f"<ul>{by_fault}</ul>" if by_fault else "")
        + (f"<table>{head}{rows}</table>" if rows else "")
    )


def render(out: Path, data: dict[str, Any]) -> Path:
    svg = timeline_svg(data)
    (out / "timeline.svg").write_text(svg)
    rows = []
    for c in data["candidates"]:
        verdicts = ", ".join(t["verdict"] for t in c["trials"])
        links = " ".join(_link(out, t["run_dir"]) for t in c["trials"])
        seconds = sum(t["seconds"] for t in c["trials"])
        rows.append(
            f"<tr class='{'fails' if c['fails'] else 'passes'}'><td>{c['number']}</td><td>{_e(c['what'])}</td>"
            f"<td>{len(c['trials'])}</td><td>{_e(verdicts)}</td>"
            f"<td>{'still fails: kept' if c['fails'] else 'no failure: rejected'}</td>"
            f"<td>{seconds:.0f}</td><td>{links}</td></tr>"
        )
    orig, best = data["original"], data["best"]
    status = {
        "complete": "complete (every pass finished)",
        "budget": "stopped at the time budget",
        "interrupted": "interrupted (Ctrl-C)",
        None: "in progress",
        "stopped": f"stopped early ({data.get('stopped')})",
    }[data["finished"]]
    body = f"""
<h1>Shrink of {_e(data["scenario"])} (seed {data["seed"]}): {_e(data["loss_class"])}</h1>
<p>From <code>{_e(data["source"])}</code>. Search {_e(status)}; ran {data["elapsed_s"]:.0f} s:
{len(data["candidates"])} candidate schedules, {data["trials"]} trial runs (up to {data["trials_per_candidate"]} per
candidate, same seed; a candidate counts as failing when a trial ends in {_e(data["loss_class"])}).</p>
<table><tr><th></th><th>fault actions</th><th>workload</th><th>rate</th><th>nodes</th></tr>
<tr><td>original</td><td>{len(orig["steps"])}</td><td>{orig["duration"]:g} s</td><td>{orig["rate"]:g}/s</td>
<td>{orig["nodes"]}</td></tr>
<tr><td>minimal</td><td>{len(best["steps"])}</td><td>{best["duration"]:g} s</td><td>{best["rate"]:g}/s</td>
<td>{best["nodes"]}</td></tr></table>
<p>Minimal: <code>{_e(best["describe"])}</code> &mdash; <a href='shrunk.yaml'>shrunk.yaml</a>;
failing run of it: {_link(out, data["best_run"])}</p>
<h2>Timeline</h2>
{svg}
<h2>The failure, reproduced</h2>
{_results_block("original run", data["original_results"], orig["steps"])}
{_results_block("minimal schedule", data["best_results"], best["steps"])}
<h2>Steps of the search</h2>
<table><tr><th>#</th><th>candidate</th><th>trials</th><th>verdicts</th><th>outcome</th><th>seconds</th>
<th>runs</th></tr>{"".join(rows)}</table>
"""
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>shrink {_e(data['scenario'])}</title><style>"
        "body{font-family:sans-serif;margin:24px;max-width:1100px} table{border-collapse:collapse;margin:8px 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px} tr.fails td{background:#fdecea}"
        "code{background:#f4f4f4;padding:1px 4px}</style></head><body>" + body + "</body></html>"
    )
    path = out / "shrink.html"
    path.write_text(page)
    return path
