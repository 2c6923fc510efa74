"""The report's "Delayed messages" section: the delay checker's verdict and the lateness distribution.

The checker's summary (``results["checkers"]["delay"]``, or ``delay-spark``) holds counts
only, so the plot reads the lateness of each delayed message's first delivery from the
history again (one pass in Python, only when a delay checker ran).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.spec.rundir import PLOTS
from spark_reports.engines.common import history_path
from spark_reports.engines.delay import iter_rows, lateness, lateness_ms_of_first_deliveries
from spark_reports.reports.html import esc as _e
from spark_reports.reports.html import img as _img
from spark_reports.reports.html import shade_faults as _shade_faults
from spark_reports.reports.html import table as _table

_LABELS = {
    "delayed_publishes": "ids published with a delay",
    "delayed_confirmed": "of them confirmed",
    "delayed_delivered": "of them delivered",
    "early": "deliveries before the due time (violations)",
    "early_ids": "ids delivered early",
    "late": "ids first delivered later than late_ms after due",
    "lateness_p50_ms": "lateness p50 (ms)",
    "lateness_p90_ms": "lateness p90 (ms)",
    "lateness_p99_ms": "lateness p99 (ms)",
    "lateness_max_ms": "lateness max (ms)",
}


def delay_parts(run_dir: Path, results: Any) -> list[str]:
    checkers = results.get("checkers") or {}
    name = next((n for n in ("delay", "delay-spark") if n in checkers), None)
    if name is None:
        return []
    summary = checkers[name]
    counts = summary.get("counts") or {}
    parts = [
        "<h2>Delayed messages</h2>",
        f"<p>checker <code>{_e(name)}</code>: <b>{_e(summary.get('verdict'))}</b>. Due time = the publish "
        "invoke's time on the harness's clock + its x-delay; a delivery before it is early (a violation), "
        "lateness = first delivery &minus; due time.</p>",
    ]
    if summary.get("error"):
        return parts + [f"<div class='note'>{_e(summary['error'])}</div>"]
    parts.append(
        _table(
            ["", "what", "value"],
            [
                [k, _LABELS.get(k, k), "-" if v is None else f"{v:,}"]
                for k, v in counts.items()
                if k in _LABELS
            ],
            left=2,
        )
    )
    state, _ = lateness(iter_rows(history_path(Path(run_dir))))
    if not state["first"]:
        return parts
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lat = lateness_ms_of_first_deliveries(state)
    firsts = sorted(state["first"].values(), key=lambda d: d["due_ns"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [1, 1.4]})
    on_time = [x for x in lat if x >= 0]
    left.hist(on_time, bins=40, color="#1565c0")
    if len(on_time) < len(lat):
        left.hist([x for x in lat if x < 0], bins=10, color="#c62828", label="early")
        left.legend(fontsize=8)
    left.set_yscale("log")  # the tail (messages held while their node was down) is a few among many
    left.set_xlabel("lateness of first delivery (ms)")
    left.set_ylabel("messages")
    left.set_title("Lateness distribution")
    _shade_faults(right, results)
    right.scatter(
        [d["due_ns"] / 1e9 for d in firsts],
        [(d["delivered_ns"] - d["due_ns"]) / 1e6 for d in firsts],
        s=4,
        color=["#c62828" if d["delivered_ns"] < d["due_ns"] else "#1565c0" for d in firsts],
    )
    right.set_xlabel("due time (s since run start)")
    right.set_ylabel("lateness (ms)")
    right.set_title("Lateness by due time (fault windows shaded)")
    if results.get("faults"):
        right.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    png = Path(run_dir) / PLOTS / "delay-lateness.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return parts + [_img(png)]
