"""HTML reports: one self-contained page per run and one per multi-run grade.

The PNGs are written beside the page (plots/*.png) for tools that want files, and
embedded in it as data URIs so the page still reads when mailed or archived alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from harness.spec.results import (
    Grade,
    Results,
    describe_stranded,
    exposure_classes,
    missing_class,
    row_class,
    shown_classes,
)
from harness.spec.rundir import GRADE_HTML, PLOTS, REPORT_HTML
from spark_reports.engines.final_heal import describe_down
from spark_reports.engines.grade import describe_grade
from spark_reports.engines.liveness import describe_unavailable
from spark_reports.reports.anomalies import jepsen_parts
from spark_reports.reports.checkers import findings_parts, verdict_table
from spark_reports.reports.delay import delay_parts
from spark_reports.reports.evidence import evidence_parts, no_fault_bit_notes
from spark_reports.reports.html import Raw as _Raw
from spark_reports.reports.html import esc as _e
from spark_reports.reports.html import img as _img
from spark_reports.reports.html import page as _page
from spark_reports.reports.html import shade_faults as _shade_faults
from spark_reports.reports.html import table as _table

_COLOURS = {"ok": "#2e7d32", "fail": "#c62828", "info": "#f9a825", "consume": "#1565c0", "ack": "#6a1b9a"}
_COUNT_LABELS = {
    "attempted": "ids published at least once",
    "confirmed": "confirmed (publish ok)",
    "failed": "refused (every attempt nacked)",
    "unknown": "unconfirmed, outcome unknown",
    "publish_attempts": "publish attempts",
    "delivered_unique": "ids delivered",
    "delivered_total": "deliveries",
    "consumed_unique": "ids consumed (an ack completed ok)",
    "consumed_total": "acks completed ok",
    "abandoned": "deliveries given back (abandon ops)",
    "lost": "lost: confirmed, never consumed after a completed drain",
    "stuck": "stuck: confirmed, held unacked by no consumer",
    "unreachable": "confirmed, never consumed, the final drain unfinished: not known lost",
    "ack_unknown": "confirmed, ack outcome unknown",
    "unexpected": "consumed, never published",
    "corrupted": "body differs from the one sent",
    "duplicated": "consumed (acked ok) more than once",
    "resurrected": "delivered again after an ack completed ok",
    "recovered": "unconfirmed but consumed",
    "split_brain": "split-brain copies found by the drain",
    "unflagged_redeliveries": "redeliveries without the redelivered flag",
    "order_violations": "per-producer order violations",
    "history_ops": "history records",
}
_SCHEMA1_LABELS = {
    "consumed_unique": "ids consumed (delivered: schema-1 history)",
    "consumed_total": "consumptions (deliveries: schema-1 history)",
}
_ROWS = 200
"""Rows shown per detail table; results.json holds up to LIST_CAP of each."""
_DUPLICATES = 50
"""Duplicates are often many and rarely the story: fewer rows."""


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}" if abs(x) < 1e-3 and x else f"{x:,.{digits}f}"


def _grid(times: list[int], width: int) -> list[int]:
    """Every bucket start from the first to the last, ``width`` apart."""
    if not times:
        return []
    lo, hi = min(times), max(times)
    return list(range(lo, hi + 1, width))


def _plots(run_dir: Path, results: Results) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = run_dir / PLOTS
    out.mkdir(parents=True, exist_ok=True)
    return [
        _timeline_plot(plt, out / "timeline.png", results),
        _latency_plot(plt, out / "latency.png", results),
    ]


def _timeline_plot(plt: Any, path: Path, results: Results) -> Path:
    tl = results["timeline"]
    width = tl["bucket_s"]
    series: dict[str, dict[int, float]] = {}
    for row in tl["rows"]:
        if row["f"] == "publish" and row["type"] in ("ok", "fail", "info"):
            name = f"publish {row['type']}"
        elif row["f"] == "consume" and row["type"] == "ok":
            name = "delivered"
        elif row["f"] == "ack" and row["type"] == "ok":
            name = "acked ok"
        else:
            continue
        series.setdefault(name, {})[row["t_s"]] = row["count"] / width
    fig, ax = plt.subplots(figsize=(11, 4.0))
    _shade_faults(ax, results)
    _unavailable_bars(ax, results)
    # Every bucket of the run is drawn: a second with no operations of a kind is a zero,
    # not a line drawn across the gap (a broker down for 4 s must look down for 4 s).
    grid = _grid([t for pts in series.values() for t in pts], width)
    for name, pts in sorted(series.items()):
        colour = (
            _COLOURS["consume"]
            if name == "delivered"
            else _COLOURS["ack"]
            if name == "acked ok"
            else _COLOURS[name.split()[1]]
        )
        ax.plot(
            grid, [pts.get(x, 0.0) for x in grid], label=name, color=colour, lw=1.2, drawstyle="steps-post"
        )
    ax.set_xlabel("seconds since run start")
    ax.set_ylabel("ops/s")
    ax.set_title(
        "Operations by outcome (fault windows shaded; bars on top: no publish / consume ok for longer than "
        "the threshold, hatched where it never came back)",
        fontsize=10,
    )
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)  # headroom for the bars of unavailable windows
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, ncol=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _latency_plot(plt: Any, path: Path, results: Results) -> Path:
    width = results["timeline"]["bucket_s"]
    fig, ax = plt.subplots(figsize=(11, 3.2))
    _shade_faults(ax, results)
    lat = results["timeline"]["latency"]
    if lat:
        # Seconds without a confirm are gaps (NaN), not interpolated.
        by_t: dict[Any, Mapping[str, object]] = {r["t_s"]: r for r in lat}
        xs = _grid(list(by_t), width)
        nan = float("nan")
        for key, label, color, lw in (("max_ms", "max", "#c62828", 1), ("mean_ms", "mean", "#1565c0", 1.2)):
            ys = [by_t[x][key] if x in by_t else nan for x in xs]
            ax.plot(xs, ys, label=label, color=color, lw=lw, drawstyle="steps-post")
        ax.set_yscale("log")
    ax.set_xlabel("seconds since run start")
    ax.set_ylabel("confirm latency (ms)")
    ax.set_title("Publish confirm latency over time")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


_UNAVAILABLE = {"publish": ("#b71c1c", 0.93), "consume": ("#4a148c", 0.86)}
"""Colour and height (axes fraction) of the bars of unavailable windows on the timeline."""


def _unavailable_bars(ax: Any, results: Results) -> None:
    """Each unavailable window (``liveness.windows``) as a bar across the top of the timeline:
    publish above, consume below; a window that never ended in an ok is hatched."""
    seen: set[str] = set()
    for w in (results.get("liveness") or {}).get("windows") or []:
        colour, y = _UNAVAILABLE[w["kind"]]
        ax.broken_barh(
            [(w["start_ns"] / 1e9, w["duration_ns"] / 1e9)],
            (y, 0.05),
            transform=ax.get_xaxis_transform(),
            facecolors=colour,
            alpha=0.85,
            hatch=None if w["ended_by_ok"] else "//",
            edgecolor="white",
            label=None if w["kind"] in seen else f"{w['kind']} unavailable",
        )
        seen.add(w["kind"])


def _liveness_parts(results: Results) -> list[str]:
    """The recovery of each fault step and queue, the unavailable windows and the queues that
    never came back."""
    lv = results.get("liveness")
    if not lv:
        return []
    share = lv["available_share"]
    parts = [
        "<h2>Liveness: did it come back?</h2>",
        "<p>Per fault step and queue, seconds from the heal to the first publish confirmed and the first "
        "message consumed (acked ok, or the queue's drain completing) through any node, and per node the "
        "clients went through. A publish counts once producers kept publishing for longer than the "
        f"threshold ({lv['threshold_ns'] / 1e9:g} s) after the heal. Longest outage "
        f"{lv['longest_outage_ns'] / 1e9:.1f} s"
        + (f"; available {share:.1%} of the time." if share is not None else ".")
        + "</p>",
    ]
    stranded = lv.get("stranded") or []
    if stranded:
        parts.append(
            "<p>Stranded (the broker's nodes hold disjoint messages): messages a node held that no "
            "consumer reached until the drain, kept but not served while they sat there.</p><ul>"
            + "".join(f"<li>{_e(describe_stranded(g))}</li>" for g in stranded)
            + "</ul>"
        )
    for d in lv.get("nodes_down") or []:  # older results have no such field
        parts.append(f"<div class='verdict UNAVAILABLE'>{_e(describe_down([d]))}</div>")
        parts.append("<pre style='white-space:pre-wrap'>" + _e(d["reason"]) + "</pre>")
    if lv.get("nodes_down"):
        parts.append(f"<p>Drained through: {_e(', '.join(lv.get('serving') or []) or 'no node')}.</p>")
    for u in lv["unavailable"]:
        parts.append(f"<div class='verdict UNAVAILABLE'>{_e(describe_unavailable(u, 0))}</div>")
        if u["log"]:
            parts.append("<pre style='white-space:pre-wrap'>" + _e("\n".join(u["log"])) + "</pre>")

    rows = [_recovery_row(r) for r in lv["recovery"]]
    parts.append(
        _table(
            [
                "fault step",
                "kind",
                "node",
                "queue",
                "heal s",
                "publish ok after s",
                "consume ok after s",
                "recovered",
                "recovery s",
                "budget s",
                "per node (publish / consume after s)",
            ],
            rows,
            left=4,
        )
    )
    if lv["windows"]:
        parts.append(
            _table(
                ["queue", "kind", "from s", "to s", "seconds", "ended by an ok", "fault windows"],
                [
                    [
                        w["queue"],
                        w["kind"],
                        _s(w["start_ns"]),
                        _s(w["end_ns"]),
                        f"{w['duration_ns'] / 1e9:.1f}",
                        "yes" if w["ended_by_ok"] else "no (never came back)",
                        ", ".join(w["fault_ids"]) or "-",
                    ]
                    for w in lv["windows"]
                ],
                left=2,
            )
        )
    return parts


def _after(ns: int | None, asked: bool = True) -> str:
    return "-" if not asked else "never" if ns is None else f"{ns / 1e9:.3f}"


def _recovery_row(r: Any) -> list[str]:
    """One fault step and queue: when it was healed and how long each kind took to come back."""
    per_node = "; ".join(
        f"{n['node']}: {_after(n['publish_ok_ns'])} / {_after(n['consume_ok_ns'])}" for n in r["nodes"]
    )
    state = "not healed" if not r["healed"] else "yes" if r["recovered"] else "NO"
    budget = "-" if r["budget_s"] is None else f"{r['budget_s']:g}" + (" (over)" if r["over_budget"] else "")
    return [
        r["fault_id"],
        r["kind"],
        r["node"],
        r["queue"],
        _s(r["heal_ns"]),
        _after(r["publish_ok_ns"], r["publish_demand"] or r["publish_ok_ns"] is not None),
        _after(r["consume_ok_ns"]),
        state,
        _after(r["recovery_ns"], r["healed"] and not (r["recovered"] and r["recovery_ns"] is None)),
        budget,
        per_node,
    ]


def _s(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e9:.3f}"


def _where(d: Mapping[str, Any]) -> str:
    """process@node at seconds, for one delivery or ack."""
    return f"{d['process']}@{d.get('node') or '?'} at {_s(d['time_ns'])} s"


def _bodies(expected: str, received: str | None) -> tuple[_Raw, _Raw]:
    """Both excerpts, the received characters that differ from the sent ones at the same place marked."""
    sent = _Raw(f"<div class='body'>{_e(expected)}</div>")
    if received is None:
        return sent, _Raw("<span class='muted'>not recorded</span>")
    out, run, bad = [], "", False
    for i, ch in enumerate(received):
        differs = i >= len(expected) or expected[i] != ch
        if differs != bad and run:
            out.append(f"<span class='diff'>{_e(run)}</span>" if bad else _e(run))
            run = ""
        run, bad = run + ch, differs
    if run:
        out.append(f"<span class='diff'>{_e(run)}</span>" if bad else _e(run))
    return sent, _Raw(f"<div class='body'>{''.join(out)}</div>")


def _event_parts(results: Mapping[str, Any]) -> list[str]:
    """The broker's notable events (``events``: states worth reaching, not failures), each with
    the fault windows it fell in, and the coverage cells the run reached (``coverage``)."""
    cov = results.get("coverage")
    if not isinstance(cov, Mapping):
        return []
    if cov.get("error"):
        return ["<h2>Broker events</h2>", f"<p>Not read: {_e(cov['error'])}</p>"]
    events = list(results.get("events") or [])
    parts = _listed(
        "Broker events",
        events,
        len(events),
        "What the broker's own logs said it did (promotions, flush timeouts, ...): states worth "
        "reaching, not failures. A fault window counts an event held or up to 5 s after its heal.",
        ["time s", "node", "event", "fault windows", "detail"],
        lambda e: [
            "-" if e.get("time_ns") is None else _s(e["time_ns"]),
            e["node"],
            e["name"],
            ", ".join(e.get("fault_ids") or []) or "none",
            ", ".join(f"{k}={v}" for k, v in (e.get("detail") or {}).items()),
        ],
        left=5,
        shown_when_empty=True,
    )
    cells = [c for c in cov.get("cells") or [] if c[2] is None]
    parts += [
        "<h2>Coverage</h2>",
        f"<p>Features in use: {_e(', '.join(cov.get('features') or []) or 'none')}; "
        f"workload used: {_e(', '.join(cov.get('workload_uses') or []) or 'nothing')}.</p>",
        _table(
            ["feature", "fault kind", "events seen there"],
            [
                [
                    f,
                    k,
                    ", ".join(sorted({str(c[2]) for c in cov["cells"] if c[0] == f and c[1] == k and c[2]})),
                ]
                for f, k, _ in cells
            ],
            left=3,
        ),
    ]
    return parts


def _section(title: str, shown: int, total: int, intro: str, table: str) -> list[str]:
    more = f" (first {shown:,} of {total:,})" if total > shown else ""
    return [f"<h2>{_e(title)}{more}</h2>", f"<p>{intro}</p>" if intro else "", table]


def _listed(
    title: str,
    rows: Sequence[Mapping[str, Any]],
    total: int,
    intro: str,
    headers: list[str],
    row: Callable[[Any], list[Any]],
    *,
    left: int = 1,
    shown_when_empty: bool = False,
) -> list[str]:
    """A section tabling the first ``_ROWS`` of ``rows`` (``total`` in all), ``row`` making the
    table's row of one; nothing where there are none (``shown_when_empty``: a table saying none)."""
    if not rows and not shown_when_empty:
        return []
    shown = rows[:_ROWS]
    return _section(title, len(shown), total, intro, _table(headers, [row(x) for x in shown], left=left))


def render_report(run_dir: Path, results: Results) -> Path:
    """Write run_dir/report.html and run_dir/plots/*.png; return the page's path."""
    run_dir = Path(run_dir)
    html_path = run_dir / REPORT_HTML
    if "counts" not in results or "timeline" not in results:
        html_path.write_text(_page(f"brokerchaos {run_dir.name}", _verdict_only(run_dir, results)))
        return html_path
    plots = _plots(run_dir, results)
    parts = _head_parts(run_dir, results, plots)
    parts += _lost_parts(results) + jepsen_parts(results) + _anomaly_parts(results)
    parts += _attribution_parts(results) + evidence_parts(results) + _drain_parts(results)
    parts += findings_parts(results)
    parts += delay_parts(run_dir, results)
    parts += _event_parts(results)
    parts += _order_parts(results)
    html_path.write_text(_page(f"brokerchaos {run_dir.name}", "".join(parts)))
    return html_path


def _verdict_only(run_dir: Path, results: Results) -> str:
    """No queue checker result (every checker failed, or only checkers of another kind ran): the
    verdict, each checker's, and their findings."""
    why = results.get("reason") or results.get("error") or "no checker result"
    return (
        f"<h1>brokerchaos run {_e(run_dir.name)}</h1><div class='verdict {_e(results.get('verdict', 'unknown'))}'>"
        f"{_e(results.get('verdict', 'unknown'))} &mdash; {_e(why)}</div>"
        + "".join(verdict_table(results) + findings_parts(results))
    )


def _head_parts(run_dir: Path, results: Results, plots: list[Path]) -> list[str]:
    """The verdict, the counts, the timeline, liveness and latency."""
    c = results["counts"]
    lat = results["latency"]
    labels = _COUNT_LABELS | (_SCHEMA1_LABELS if results.get("history_schema", 2) < 2 else {})
    budgets = results.get("budgets") or {}
    set_budgets = ", ".join(
        f"{k} &le; {_e(str(v)) if isinstance(v, dict) else f'{v:,}'}"
        for k, v in budgets.items()
        if v is not None
    )
    fs = dict(results).get("filesystem")  # the runner's, beside the checker's results
    broker = dict(results).get("broker")  # the runner's: what the running broker reported
    running = broker.get("running") if isinstance(broker, dict) else None
    parts = [
        f"<h1>brokerchaos run {_e(run_dir.name)}</h1>",
        *([f"<p>broker: {_e(str(running))}</p>"] if running else []),
        f"<div class='verdict {_e(results['verdict'])}'>{_e(results['verdict'])} &mdash; {_e(results['reason'])}</div>",
        *no_fault_bit_notes(results),
        f"<p>checked by the {_e(results['engine'])} engine on a schema-{results.get('history_schema', 1)} history; "
        f"drain {'completed' if results['drain']['completed'] else 'did not complete'}; "
        f"{c['history_ops']:,} operations"
        + (f"; budgets: {set_budgets}" if set_budgets else "")
        + (f"; data directories on the lazy filesystem, model {_e(str(fs))}" if fs else "")
        + ".</p>",
        *[f"<div class='note'>{_e(n)}</div>" for n in results.get("notes", [])],
        *verdict_table(results),
        "<h2>Counts</h2>",
        _table(["", "what", "messages"], [[k, labels.get(k, k), f"{v:,}"] for k, v in c.items()], left=2),
        "<h2>Timeline</h2>",
        _img(plots[0]),
        *_liveness_parts(results),
        "<h2>Latency</h2>",
        _img(plots[1]),
        _table(
            ["latency (ms)", "n", "p50", "p95", "p99", "max"],
            [
                [name, f"{p['n']:,}", _fmt(p["p50"]), _fmt(p["p95"]), _fmt(p["p99"]), _fmt(p["max"])]
                for name, p in (
                    ("publish confirm", lat["confirm_ms"]),
                    ("publish to first delivery", lat["e2e_ms"]),
                )
            ],
        ),
    ]
    return parts


def _attribution_parts(results: Results) -> list[str]:
    counts, att = results["counts"], results["attribution"]
    shown = shown_classes(results)
    return [
        "<h2>Loss attribution</h2>",
        "<p>Each confirmed message the final drain did not consume counted once per fault kind whose window "
        "overlapped the time from its confirm to the end of the final drain, against the node that confirmed "
        "it, under its class: lost (the drain completed without it), unreachable (behind a queue or node "
        "the drain did not reach: not known lost) or stuck (held unacked by no consumer).</p>",
        _table(
            ["fault kind", "node", "class", "messages"],
            [[r["fault_kind"], r["node"], row_class(r, counts), f"{r['count']:,}"] for r in att["rows"]],
            left=3,
        ),
        _table(
            ["fault kind", "exposed confirmed", *shown],
            [
                [
                    r["fault_kind"],
                    f"{r['confirmed']:,}",
                    *(f"{exposure_classes(r, counts)[c]:,}" for c in shown),
                ]
                for r in att["exposure"]
            ],
        ),
        "<h2>Fault windows and availability</h2>",
        _table(
            ["window", "kind", "node", "start s", "end s", "healed", "publishes", "confirmed", "share"],
            _availability_rows(results),
            left=3,
        ),
    ]


def _order_parts(results: Results) -> list[str]:
    return _listed(
        "Order violations",
        results["order_violations"],
        results["counts"]["order_violations"],
        "",
        ["consumer", "queue", "producer", "id", "after seq"],
        lambda x: [x["consumer"], x["queue"], x["producer"], x["id"], x["after_seq"]],
        left=4,
    )


def _lost_parts(results: Results) -> list[str]:
    return _lost_table_parts(results) + _stuck_parts(results) + _listing_parts(results, "ack_unknown")


def _lost_table_parts(results: Results) -> list[str]:
    c = results["counts"]
    parts: list[str] = []
    if results["lost"]:
        detail = {d["id"]: d for d in results["lost_detail"]}
        rows = []
        for m in results["attribution"]["messages"][:_ROWS]:
            d = detail.get(m["id"])
            cause: str = (d["cause"] or "-") if d else "-"
            if d and d["abandon_cause"]:
                cause += f" ({d['abandon_cause']})"
            rows.append(
                [
                    m["id"],
                    cause,
                    d["delivered"] if d else "-",
                    m["confirm_node"],
                    f"{m['confirm_ns'] / 1e9:.3f}",
                    ", ".join(m["fault_ids"]) or "-",
                ]
            )
        cls = missing_class(c)  # the lost list holds the unreachable ones when the counts say so
        parts += [
            f"<h2>{cls.capitalize()} messages ({c[cls]:,})</h2>",
            _UNREACHABLE_NOTE if cls == "unreachable" else "",
            _table(
                ["cause", "abandoned as", cls],
                [
                    [r["cause"], r["abandon_cause"] or "-", f"{r['count']:,}"]
                    for r in results.get("lost_by_cause", [])
                ],
                left=2,
            ),
            f"<p>{'First ' + str(len(rows)) + ' by confirm order.' if c[cls] > len(rows) else ''}</p>",
            _table(["id", "cause", "deliveries", "confirmed by", "confirm s", "faults"], rows, left=2),
        ]
    return parts


_UNREACHABLE_NOTE = (
    "<p>The final drain did not reach them (it did not complete, or a node that holds its own share "
    "did not come back): not known lost.</p>"
)


def _stuck_parts(results: Results) -> list[str]:
    c = results["counts"]
    parts: list[str] = []
    if results.get("stuck"):
        parts += [
            f"<h2>Stuck deliveries ({c.get('stuck', 0):,} confirmed messages)</h2>",
            "<p>After the harness had closed every client connection it opened on the queue, these "
            "nodes still reported deliveries unacked: held for consumers that no longer exist, never to "
            "be delivered again. A loss to the application (verdict LOST, cause "
            "&ldquo;held unacked by no consumer&rdquo;), counted apart from lost (a finished drain that "
            "did not find them) and from unreachable (a queue that never answers). The confirmed messages "
            "counted stuck are those the drain could not obtain when it was held up by these nodes alone. "
            "Holders: what the broker listed when asked (the drain's own connection among them).</p>",
            _table(
                [
                    "node",
                    "queue",
                    "drainer",
                    "unacked reported",
                    "since s",
                    "last seen s",
                    "looks",
                    "holders",
                ],
                [
                    [
                        q["node"],
                        q["queue"],
                        q["drainer"],
                        f"{q['unacked']:,}",
                        _s(q["since_ns"]),
                        _s(q["last_ns"]),
                        q["looks"],
                        _holders(q["holders"]),
                    ]
                    for q in results["stuck"]
                ],
                left=3,
            ),
        ]
        parts += _listed(
            "Stuck messages",
            results.get("stuck_detail") or [],
            c.get("stuck", 0),
            "",
            ["id", "confirmed by", "confirm s", "deliveries"],
            lambda d: [d["id"], d["confirm_node"], _s(d["confirm_ns"]), d["delivered"]],
            left=2,
        )
    return parts


class _Listing(NamedTuple):
    """A section that lists one of the results' capped lists of messages (``_listed``)."""

    title: str
    intro: str
    headers: list[str]
    row: Callable[[Any], list[Any]]
    left: int = 1


_LISTINGS: dict[str, _Listing] = {
    "ack_unknown": _Listing(
        "Acked with an unknown outcome",
        "Confirmed messages whose ack ended without an answer (connection lost) and that were not delivered "
        "again: the broker may have processed the ack. Indeterminate, not counted as lost.",
        ["id", "last delivery", "deliveries"],
        lambda d: [d["id"], _where(d["deliveries"][-1]) if d["deliveries"] else "-", d["delivered"]],
        left=2,
    ),
    "resurrected": _Listing(
        "Resurrected",
        "Delivered again after an ack of the message had completed ok (the broker had certainly "
        "processed it).",
        ["id", "acked ok", "delivered again", "redelivered flag", "deliveries after"],
        lambda x: [
            x["id"],
            _where({"process": x["ack_process"], "node": x["ack_node"], "time_ns": x["ack_ns"]}),
            _where(x["delivery"]),
            "yes" if x["delivery"]["redelivered"] else "no",
            x["deliveries_after"],
        ],
        left=4,
    ),
    "split_brain": _Listing(
        "Split-brain copies",
        "Found by the final drain on one node after another node had reported the queue empty.",
        ["id", "found on", "drainer", "queue", "reported empty before", "acked at s"],
        lambda x: [
            x["id"],
            x["node"],
            x["drainer"],
            x["queue"],
            ", ".join(f"{e['node']} at {_s(e['empty_at_ns'])} s" for e in x["empty"]),
            _s(x["ack_ns"]),
        ],
        left=5,
    ),
    "unflagged_redeliveries": _Listing(
        "Redeliveries without the redelivered flag",
        "A delivery after the message was given back, not flagged redelivered (reported, "
        "not a failure: a publish retried under the same id also arrives unflagged).",
        ["id", "delivered", "after abandon"],
        lambda x: [x["id"], _where(x["delivery"]), x["abandon_cause"] or "-"],
        left=3,
    ),
}
"""The sections whose rows are the results' list of that name and whose total is the count of it."""


def _listing_parts(results: Results, key: str) -> list[str]:
    s = _LISTINGS[key]
    lists: Mapping[str, Any] = results
    counts: Mapping[str, Any] = results["counts"]
    return _listed(s.title, lists.get(key) or [], counts.get(key, 0), s.intro, s.headers, s.row, left=s.left)


def _anomaly_parts(results: Results) -> list[str]:
    return (
        _corrupted_parts(results)
        + _unexpected_parts(results)
        + _listing_parts(results, "resurrected")
        + _listing_parts(results, "split_brain")
        + _listing_parts(results, "unflagged_redeliveries")
        + _duplicated_parts(results)
    )


def _corrupted_parts(results: Results) -> list[str]:
    c = results["counts"]
    parts: list[str] = []
    if results.get("corrupted"):
        rows = []
        for x in results["corrupted"][:_ROWS]:
            want, got = _bodies(x["expected"], x["received"])
            length = "-" if x["received_length"] is None else f"{x['received_length']:,} bytes"
            rows.append([x["id"], _where(x["delivery"]), want, got, length, x["deliveries"]])
        parts += _section(
            "Corrupted bodies",
            len(rows),
            c["corrupted"],
            "Delivered with a body whose digest is not that of the body the producer sent (recomputed "
            "from the id, the seed and the message size). Received text is the consumer's excerpt; "
            "characters that differ from the sent body are marked.",
            _table(
                [
                    "id",
                    "delivered",
                    "sent (excerpt)",
                    "received (excerpt)",
                    "received length",
                    "bad deliveries",
                ],
                rows,
                left=4,
            ),
        )
    return parts


def _unexpected_parts(results: Results) -> list[str]:
    if not results["unexpected"]:
        return []
    return _listed(
        "Consumed but never attempted",
        results["unexpected_detail"],
        results["counts"]["unexpected"],
        "",
        ["id", "deliveries", "first delivered"],
        lambda d: [d["id"], d["delivered"], _where(d["deliveries"][0]) if d["deliveries"] else "-"],
        shown_when_empty=True,
    )


def _duplicated_parts(results: Results) -> list[str]:
    c = results["counts"]
    parts: list[str] = []
    if results["duplicated"]:
        shown = min(len(results["duplicated"]), _DUPLICATES)
        parts += _section(
            "Delivered more than once",
            shown,
            c["duplicated"],
            "Allowed by at-least-once delivery (every delivery given back comes again); "
            "a budget in the scenario can bound them.",
            _table(
                ["id", "where (first deliveries; r: flagged redelivered)", "deliveries", "acks ok"],
                [
                    [
                        d["id"],
                        "; ".join(
                            f"{x['process']}@{x['node'] or '?'}{' (r)' if x['redelivered'] else ''}"
                            for x in d["deliveries"]
                        ),
                        d["delivered"],
                        d["consumed"],
                    ]
                    for d in results["duplicated"][:shown]
                ],
                left=2,
            ),
        )
    return parts


def _drain_parts(results: Results) -> list[str]:
    ops = results["drain"].get("ops") or []
    if not ops:
        return []
    rows = []
    for op in ops:
        nodes: list[tuple[str | None, dict]] = list(op["nodes"].items()) or [(None, {})]
        for node, v in nodes:
            rows.append(
                [
                    op["process"],
                    op["queue"],
                    op["outcome"],
                    "-" if op["consumed"] is None else op["consumed"],
                    node or "-",
                    _v(v.get("consumed")),
                    _v(v.get("ready")),
                    _v(v.get("unacked")),
                    _s(v.get("empty_at_ns")),
                    v.get("error") or op["error"] or "-",
                ]
            )
    return [
        "<h2>Final drain</h2>",
        _table(
            [
                "drainer",
                "queue",
                "outcome",
                "acked",
                "node",
                "node acked",
                "ready",
                "unacked",
                "empty at s",
                "error",
            ],
            rows,
            left=3,
        ),
    ]


def _holders(holders: list | None) -> str:
    """What the broker listed as holding the deliveries (the drain's own connection among them)."""
    if holders is None:
        return "-"
    return "; ".join(
        ", ".join(f"{k} {v}" for k, v in h.items()) if isinstance(h, Mapping) else str(h) for h in holders
    )


def _v(x: Any) -> str:
    return "-" if x is None else f"{x:,}" if isinstance(x, int) else str(x)


def _availability_rows(results: Results) -> list[list[Any]]:
    by_id = {w["fault_id"]: w for w in results["faults"]}
    rows = []
    for a in results["availability"]:
        w = by_id.get(a["window"])
        rows.append(
            [
                a["window"],
                a["kind"] or "-",
                (w["node"] if w else None) or "-",
                f"{w['start_ns'] / 1e9:.2f}" if w else "-",
                f"{w['end_ns'] / 1e9:.2f}" if w else "-",
                ("yes" if w["healed"] else "no") if w else "-",
                f"{a['attempts']:,}",
                f"{a['confirmed']:,}",
                "-" if a["share"] is None else f"{a['share']:.1%}",
            ]
        )
    return rows


def render_grade_report(out_dir: Path, grade: Grade) -> Path:
    """Write out_dir/grade.html and out_dir/plots/grade.png; return the page's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    (out_dir / PLOTS).mkdir(parents=True, exist_ok=True)
    png = _grade_plot(plt, out_dir / PLOTS / "grade.png", grade)
    body = [
        f"<h1>brokerchaos grade over {len(grade['runs'])} runs</h1>",
        f"<div class='verdict {_e(grade['verdict'])}'>{_e(grade['verdict'])}</div>",
        "".join(f"<p>{_e(line)}</p>" for line in describe_grade(grade)[1:]),
        "<p>A run, not a message, is one trial: losses arrive in clusters. The share of runs that lose messages "
        "has an exact binomial (Clopper-Pearson) interval over runs; the per-message rate has a percentile "
        "bootstrap interval that resamples whole runs. Per fault kind the denominator is the confirmed messages "
        "whose confirm-to-drain interval overlapped a window of that kind.</p>",
        _img(png),
        *_grade_tables(grade),
    ]
    path = out_dir / GRADE_HTML
    path.write_text(_page("brokerchaos grade", "".join(body)))
    return path


def _grade_plot(plt: Any, png: Path, grade: Grade) -> Path:
    kinds = [k for k in grade["per_kind"] if k["high"] is not None]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    if kinds:
        names = [k["fault_kind"] for k in kinds]
        low = [k["low"] or 0.0 for k in kinds]
        ax.bar(
            names,
            [(k["high"] or 0.0) - lo for k, lo in zip(kinds, low, strict=True)],
            bottom=low,
            color="#90caf9",
            label=f"{grade['confidence']:.0%} bootstrap interval over runs",
        )
        ax.scatter(
            names, [k["loss_rate"] or 0 for k in kinds], color="#c62828", zorder=3, label="pooled rate"
        )
        ax.legend(fontsize=8)
    ax.set_ylabel("lost per confirmed message")
    ax.set_title("Loss rate per fault kind")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def _grade_tables(grade: Grade) -> list[str]:
    """Per fault kind, and per run."""
    return [
        _table(
            [
                "fault kind",
                "runs",
                "runs that lost",
                "exposed confirmed",
                "lost",
                "pooled rate",
                "interval low",
                "interval high",
            ],
            [
                [
                    k["fault_kind"],
                    k["runs"],
                    k["runs_lost"],
                    f"{k['confirmed']:,}",
                    k["lost"],
                    _fmt(k["loss_rate"]),
                    _fmt(k["low"]),
                    _fmt(k["high"]),
                ]
                for k in grade["per_kind"]
            ],
        ),
        "<h2>Runs</h2>",
        _table(
            ["run", "seed", "verdict", "checkers", "graded", "confirmed", "lost", "unexpected"],
            [
                [
                    r["run_dir"],
                    "-" if r["seed"] is None else r["seed"],
                    r["verdict"],
                    ", ".join(f"{n} {v}" for n, v in (r.get("checkers") or {}).items()) or "-",
                    "yes" if r["graded"] else "no",
                    f"{r['confirmed']:,}",
                    r["lost"],
                    r["unexpected"],
                ]
                for r in grade["runs"]
            ],
            left=4,
        ),
    ]
