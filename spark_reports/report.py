"""HTML reports: one self-contained page per run and one per multi-run grade.

The PNGs are written beside the page (plots/*.png) for tools that want files, and
embedded in it as data URIs so the page still reads when mailed or archived alone.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .grade import describe_grade
from .schema import Grade, Results

_COLOURS = {"ok": "#2e7d32", "fail": "#c62828", "info": "#f9a825", "consume": "#1565c0"}
_FAULT_COLOURS = ["#ef9a9a", "#90caf9", "#ce93d8", "#ffcc80", "#a5d6a7", "#b0bec5"]
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}
.verdict{font-size:1.3em;padding:.6em 1em;border-radius:6px;display:inline-block;color:#fff}
.durable{background:#2e7d32}.LOST,.INTEGRITY{background:#c62828}.unknown{background:#757575}
img{max-width:100%;border:1px solid #eee}code{font-size:.9em}
"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _table(headers: list[str], rows: Iterable[Iterable[Any]], left: int = 1) -> str:
    head = "".join(f"<th class='l'>{_e(h)}</th>" if i < left else f"<th>{_e(h)}</th>" for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = "".join(f"<td class='l'>{_e(c)}</td>" if i < left else f"<td>{_e(c)}</td>" for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    if not body:
        body.append(f"<tr><td class='l' colspan='{len(headers)}'>none</td></tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}" if abs(x) < 1e-3 and x else f"{x:,.{digits}f}"


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{_CSS}</style></head><body>{body}</body></html>")


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f"<img alt='{_e(path.stem)}' src='data:image/png;base64,{data}'>"


def _shade_faults(ax: Any, results: Results) -> None:
    colours: dict[str, str] = {}
    for w in results["faults"]:
        first = w["kind"] not in colours
        colour = colours.setdefault(w["kind"], _FAULT_COLOURS[len(colours) % len(_FAULT_COLOURS)])
        ax.axvspan(w["start_ns"] / 1e9, w["end_ns"] / 1e9, color=colour, alpha=0.35, lw=0,
                   label=w["kind"] if first else None)


def _grid(times: list[float], width: float) -> list[float]:
    """Every bucket start from the first to the last, ``width`` apart."""
    if not times:
        return []
    lo, hi = min(times), max(times)
    n = int(round((hi - lo) / width))
    return [lo + k * width for k in range(n + 1)]


def _plots(run_dir: Path, results: Results) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    tl = results["timeline"]
    width = tl["bucket_s"]
    series: dict[str, dict[int, float]] = {}
    for row in tl["rows"]:
        if row["f"] == "publish" and row["type"] in ("ok", "fail", "info"):
            name = f"publish {row['type']}"
        elif row["f"] == "consume" and row["type"] == "ok":
            name = "consume ok"
        else:
            continue
        series.setdefault(name, {})[row["t_s"]] = row["count"] / width
    paths = []
    fig, ax = plt.subplots(figsize=(11, 3.6))
    _shade_faults(ax, results)
    # Every bucket of the run is drawn: a second with no operations of a kind is a zero,
    # not a line drawn across the gap (a broker down for 4 s must look down for 4 s).
    grid = _grid([t for pts in series.values() for t in pts], width)
    for name, pts in sorted(series.items()):
        colour = _COLOURS["consume"] if name.startswith("consume") else _COLOURS[name.split()[1]]
        ax.plot(grid, [pts.get(x, 0.0) for x in grid], label=name, color=colour, lw=1.2, drawstyle="steps-post")
    ax.set_xlabel("seconds since run start")
    ax.set_ylabel("ops/s")
    ax.set_title("Operations by outcome (fault windows shaded)")
    ax.legend(loc="upper right", fontsize=8, ncol=3)
    fig.tight_layout()
    paths.append(out / "timeline.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(11, 3.2))
    _shade_faults(ax, results)
    lat = tl["latency"]
    if lat:
        # Seconds without a confirm are gaps (NaN), not interpolated.
        by_t = {r["t_s"]: r for r in lat}
        xs = _grid(list(by_t), width)
        nan = float("nan")
        ax.plot(xs, [by_t[x]["max_ms"] if x in by_t else nan for x in xs], label="max", color="#c62828", lw=1,
                drawstyle="steps-post")
        ax.plot(xs, [by_t[x]["mean_ms"] if x in by_t else nan for x in xs], label="mean", color="#1565c0", lw=1.2,
                drawstyle="steps-post")
        ax.set_yscale("log")
    ax.set_xlabel("seconds since run start")
    ax.set_ylabel("confirm latency (ms)")
    ax.set_title("Publish confirm latency over time")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    paths.append(out / "latency.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def render_report(run_dir: Path, results: Results) -> Path:
    """Write run_dir/report.html and run_dir/plots/*.png; return the page's path."""
    run_dir = Path(run_dir)
    plots = _plots(run_dir, results)
    c = results["counts"]
    lat = results["latency"]
    parts = [
        f"<h1>brokerchaos run {_e(run_dir.name)}</h1>",
        f"<div class='verdict {_e(results['verdict'])}'>{_e(results['verdict'])} &mdash; {_e(results['reason'])}</div>",
        f"<p>checked by the {_e(results['engine'])} engine; drain "
        f"{'completed' if results['drain']['completed'] else 'did not complete'}; "
        f"{c['history_ops']:,} operations.</p>",
        "<h2>Timeline</h2>", _img(plots[0]), "<h2>Latency</h2>", _img(plots[1]),
        _table(["latency (ms)", "n", "p50", "p95", "p99", "max"],
               [[name, f"{p['n']:,}", _fmt(p["p50"]), _fmt(p["p95"]), _fmt(p["p99"]), _fmt(p["max"])]
                for name, p in (("publish confirm", lat["confirm_ms"]), ("end to end", lat["e2e_ms"]))]),
        "<h2>Counts</h2>", _table(["what", "messages"], [[k, f"{v:,}"] for k, v in c.items()]),
        "<h2>Loss attribution</h2>",
        "<p>Each lost message counted once per fault kind whose window overlapped the time from its confirm "
        "to the end of the final drain, against the node that confirmed it.</p>",
        _table(["fault kind", "node", "lost"], [[r["fault_kind"], r["node"], r["count"]]
                                                for r in results["attribution"]["rows"]], left=2),
        _table(["fault kind", "exposed confirmed", "lost"],
               [[r["fault_kind"], f"{r['confirmed']:,}", r["lost"]] for r in results["attribution"]["exposure"]]),
        "<h2>Fault windows and availability</h2>",
        _table(["window", "kind", "node", "start s", "end s", "healed", "publishes", "confirmed", "share"],
               _availability_rows(results), left=3),
    ]
    if results["lost"]:
        more = " (list truncated)" if results["lost_truncated"] else ""
        parts += [f"<h2>Lost messages{more}</h2>",
                  _table(["id", "confirmed by", "confirm s", "faults"],
                         [[m["id"], m["confirm_node"], f"{m['confirm_ns'] / 1e9:.3f}", ", ".join(m["fault_ids"])]
                          for m in results["attribution"]["messages"][:200]], left=2)]
    if results["unexpected"]:
        parts += ["<h2>Consumed but never attempted</h2>",
                  _table(["id", "deliveries"], [[d["id"], d["consumed"]] for d in results["unexpected_detail"][:200]])]
    if results["order_violations"]:
        parts += ["<h2>Order violations (first 200)</h2>",
                  _table(["consumer", "queue", "producer", "id", "after seq"],
                         [[v["consumer"], v["queue"], v["producer"], v["id"], v["after_seq"]]
                          for v in results["order_violations"][:200]], left=4)]
    html_path = run_dir / "report.html"
    html_path.write_text(_page(f"brokerchaos {run_dir.name}", "".join(parts)))
    return html_path


def _availability_rows(results: Results) -> list[list[Any]]:
    by_id = {w["fault_id"]: w for w in results["faults"]}
    rows = []
    for a in results["availability"]:
        w = by_id.get(a["window"])
        rows.append([a["window"], a["kind"] or "-", (w["node"] if w else None) or "-",
                     f"{w['start_ns'] / 1e9:.2f}" if w else "-", f"{w['end_ns'] / 1e9:.2f}" if w else "-",
                     ("yes" if w["healed"] else "no") if w else "-", f"{a['attempts']:,}", f"{a['confirmed']:,}",
                     "-" if a["share"] is None else f"{a['share']:.1%}"])
    return rows


def render_grade_report(out_dir: Path, grade: Grade) -> Path:
    """Write out_dir/grade.html and out_dir/plots/grade.png; return the page's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    kinds = [k for k in grade["per_kind"] if k["high"] is not None]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    if kinds:
        names = [k["fault_kind"] for k in kinds]
        low = [k["low"] or 0.0 for k in kinds]
        ax.bar(names, [(k["high"] or 0.0) - lo for k, lo in zip(kinds, low, strict=True)], bottom=low,
               color="#90caf9", label=f"{grade['confidence']:.0%} bootstrap interval over runs")
        ax.scatter(names, [k["loss_rate"] or 0 for k in kinds], color="#c62828", zorder=3, label="pooled rate")
        ax.legend(fontsize=8)
    ax.set_ylabel("lost per confirmed message")
    ax.set_title("Loss rate per fault kind")
    fig.tight_layout()
    png = out_dir / "plots" / "grade.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    body = [
        f"<h1>brokerchaos grade over {len(grade['runs'])} runs</h1>",
        f"<div class='verdict {_e(grade['verdict'])}'>{_e(grade['verdict'])}</div>",
        "".join(f"<p>{_e(line)}</p>" for line in describe_grade(grade)[1:]),
        "<p>A run, not a message, is one trial: losses arrive in clusters. The share of runs that lose messages "
        "has an exact binomial (Clopper-Pearson) interval over runs; the per-message rate has a percentile "
        "bootstrap interval that resamples whole runs. Per fault kind the denominator is the confirmed messages "
        "whose confirm-to-drain interval overlapped a window of that kind.</p>",
        _img(png),
        _table(["fault kind", "runs", "runs that lost", "exposed confirmed", "lost", "pooled rate",
                "interval low", "interval high"],
               [[k["fault_kind"], k["runs"], k["runs_lost"], f"{k['confirmed']:,}", k["lost"], _fmt(k["loss_rate"]),
                 _fmt(k["low"]), _fmt(k["high"])] for k in grade["per_kind"]]),
        "<h2>Runs</h2>",
        _table(["run", "seed", "verdict", "graded", "confirmed", "lost", "unexpected"],
               [[r["run_dir"], "-" if r["seed"] is None else r["seed"], r["verdict"], "yes" if r["graded"] else "no",
                 f"{r['confirmed']:,}", r["lost"], r["unexpected"]] for r in grade["runs"]], left=2),
    ]
    path = out_dir / "grade.html"
    path.write_text(_page("brokerchaos grade", "".join(body)))
    return path
