"""A cell-seed's figure: what its run did over time, drawn from its record alone.

A record keeps the run's operations per time bucket (confirmed publishes, deliveries) and its
fault windows (``records.trim``); the page draws each as a small inline SVG, the fault windows
shaded, so a cell's seeds can be compared at a glance without the run directories. One fixed
scale per figure (its own peak), the time axis in seconds since the run's start.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 520, 96, 34, 18, 8
SERIES = (("publish_ok", "#1f77b4", "confirmed publishes"), ("consume_ok", "#2ca02c", "deliveries"))
FAULT_FILL = "#ff7f0e"


def series(timeline: Mapping[str, Any]) -> dict[str, Any]:
    """A run's ``timeline`` (rows of bucket, op, type, count) cut down to what the figure draws."""
    width = int(timeline.get("bucket_s") or 1)
    picked: dict[str, dict[int, int]] = {"publish_ok": {}, "consume_ok": {}}
    for row in timeline.get("rows") or []:
        name = {("publish", "ok"): "publish_ok", ("consume", "ok"): "consume_ok"}.get((row["f"], row["type"]))
        if name is not None:
            picked[name][int(row["t_s"]) // width] = int(row["count"])
    last = max((b for pts in picked.values() for b in pts), default=-1)
    return {"bucket_s": width, **{k: [pts.get(b, 0) for b in range(last + 1)] for k, pts in picked.items()}}


def windows(faults: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """The run's fault windows as ``[start_s, end_s, kind]``, a tenth of a second apart at most."""
    return [
        [round(w["start_ns"] / 1e9, 1), round(w["end_ns"] / 1e9, 1), w.get("kind")]
        for w in faults
        if w.get("start_ns") is not None and w.get("end_ns") is not None
    ]


def svg(tl: Mapping[str, Any], title: str) -> str:
    """The figure of one record's ``timeline`` (``series`` plus ``faults``); empty if it has none."""
    width = int(tl.get("bucket_s") or 1)
    counts = [tl.get(name) or [] for name, _, _ in SERIES]
    buckets = max((len(c) for c in counts), default=0)
    if not buckets:
        return ""
    span = buckets * width
    peak = max(max(c, default=0) for c in counts) / width or 1.0
    plot_w, plot_h = WIDTH - LEFT - 6, HEIGHT - BOTTOM - TOP

    def x(t: float) -> float:
        return LEFT + min(max(t, 0.0), span) / span * plot_w

    def y(rate: float) -> float:
        return TOP + plot_h - rate / peak * plot_h

    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
        f"font-family='sans-serif' font-size='10' role='img'><title>{html.escape(title)}</title>",
        f"<rect x='{LEFT}' y='{TOP}' width='{plot_w}' height='{plot_h}' fill='#fafafa' stroke='#ccc'/>",
    ]
    for start, end, kind in tl.get("faults") or []:
        parts.append(
            f"<rect x='{x(start):.1f}' y='{TOP}' width='{max(x(end) - x(start), 1.5):.1f}' height='{plot_h}' "
            f"fill='{FAULT_FILL}' fill-opacity='0.25'><title>{html.escape(str(kind))} "
            f"{start:g}-{end:g} s</title></rect>"
        )
    for (_, colour, _), c in zip(SERIES, counts, strict=True):
        # Steps, not a line between points: a second with nothing done must look empty.
        pts = " ".join(
            f"{x(i * width):.1f},{y(n / width):.1f} {x((i + 1) * width):.1f},{y(n / width):.1f}"
            for i, n in enumerate(c)
        )
        if pts:
            parts.append(f"<polyline points='{pts}' fill='none' stroke='{colour}' stroke-width='1.2'/>")
    parts += [
        f"<text x='{LEFT - 3}' y='{TOP + 8}' text-anchor='end'>{peak:.0f}/s</text>",
        f"<text x='{LEFT - 3}' y='{TOP + plot_h}' text-anchor='end'>0</text>",
        f"<text x='{LEFT}' y='{HEIGHT - 4}'>0 s</text>",
        f"<text x='{LEFT + plot_w}' y='{HEIGHT - 4}' text-anchor='end'>{span} s</text>",
    ]
    legend_x = LEFT + 60
    for _, colour, label in SERIES:
        parts.append(f"<text x='{legend_x}' y='{HEIGHT - 4}' fill='{colour}'>{label}</text>")
        legend_x += 6 * len(label) + 16
    parts.append(f"<text x='{legend_x}' y='{HEIGHT - 4}' fill='{FAULT_FILL}'>fault windows</text>")
    return "".join(parts) + "</svg>"
