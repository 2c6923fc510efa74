"""The pieces every HTML page of the reports shares: escaping, tables, embedded images, the page
frame and its style, and the fault windows shaded on a plot. A leaf: the report modules import it,
it imports none of them."""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_FAULT_COLOURS = ["#ef9a9a", "#90caf9", "#ce93d8", "#ffcc80", "#a5d6a7", "#b0bec5"]
CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}
.verdict{font-size:1.3em;padding:.6em 1em;border-radius:6px;display:inline-block;color:#fff}
.durable{background:#2e7d32}.LOST,.INTEGRITY,.DEAD_LETTERED,.RESURRECTED,.DUPLICATED,.UNAVAILABLE{background:#c62828}
.unknown{background:#757575}
img{max-width:100%;border:1px solid #eee}code{font-size:.9em}
.note{background:#fff8e1;border-left:4px solid #f9a825;padding:.4em .8em;margin:.6em 0}
.body{font-family:ui-monospace,monospace;font-size:.82em;white-space:pre-wrap;word-break:break-all;
max-width:520px;text-align:left}
.diff{background:#ffcdd2}.muted{color:#757575}
"""


class Raw(str):
    """A table cell that is already HTML."""


def esc(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def table(headers: list[str], rows: Iterable[Iterable[Any]], left: int = 1) -> str:
    head = "".join(
        f"<th class='l'>{esc(h)}</th>" if i < left else f"<th>{esc(h)}</th>" for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = "".join(
            (f"<td class='l'>{c}</td>" if isinstance(c, Raw) else f"<td class='l'>{esc(c)}</td>")
            if i < left
            else f"<td>{esc(c)}</td>"
            for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    if not body:
        body.append(f"<tr><td class='l' colspan='{len(headers)}'>none</td></tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
        f"<style>{CSS}</style></head><body>{body}</body></html>"
    )


def img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f"<img alt='{esc(path.stem)}' src='data:image/png;base64,{data}'>"


def shade_faults(ax: Any, results: Any) -> None:
    colours: dict[str, str] = {}
    for w in results["faults"]:
        first = w["kind"] not in colours
        colour = colours.setdefault(w["kind"], _FAULT_COLOURS[len(colours) % len(_FAULT_COLOURS)])
        ax.axvspan(
            w["start_ns"] / 1e9,
            w["end_ns"] / 1e9,
            color=colour,
            alpha=0.35,
            lw=0,
            label=w["kind"] if first else None,
        )
