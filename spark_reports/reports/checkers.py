"""The report's "Checkers" sections: every checker's own verdict under the run's, and the findings
of the checkers whose results are not the page's body (stream, atomicity, delay, ...).

The run's verdict is the worst of its checkers' (``harness.spec.results.VERDICT_ORDER``); this
is where a reader sees which checker gave it and what that checker found.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from spark_reports.reports.html import Raw, esc, table

ROWS = 50
"""Examples shown per kind of finding; results.json keeps what the checker kept."""


def _cell(x: Any) -> str:
    if isinstance(x, Mapping):
        return "; ".join(f"{k}: {_cell(v)}" for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return ", ".join(_cell(v) for v in x)
    return "-" if x is None else x if isinstance(x, str) else json.dumps(x)


def _verdict(v: Any) -> Raw:
    return Raw(f"<b class='v-{esc(v)}'>{esc(v or 'no verdict')}</b>")


def _why(name: str, p: Mapping[str, Any]) -> str:
    if p.get("error"):
        return f"the checker failed: {p['error']}"
    return str(p.get("reason") or "; ".join(p.get("notes") or []) or "-")


def verdict_table(results: Mapping[str, Any]) -> list[str]:
    """Each checker's verdict, engine and reason (nothing when one checker ran without findings)."""
    per: Mapping[str, Mapping[str, Any]] = results.get("checkers") or {}
    if not per:
        return []
    return [
        "<h2>Checkers</h2>",
        "<p>The run's verdict is the worst of these (LOST, INTEGRITY, DEAD_LETTERED, RESURRECTED, DUPLICATED, "
        "UNAVAILABLE, unknown, durable: a definite failure outranks unknown, unknown outranks durable).</p>",
        table(
            ["checker", "verdict", "engine", "why"],
            [[n, _verdict(p.get("verdict")), p.get("engine") or "-", _why(n, p)] for n, p in per.items()],
            left=4,
        ),
    ]


def _diverged(examples: list[Mapping[str, Any]]) -> str:
    """One row per stream and server: what each replica held after the final drain."""
    rows = []
    for ex in examples:
        for node, view in (ex.get("replicas") or {}).items():
            view = view or {}
            rows.append(
                [
                    ex.get("queue"),
                    node,
                    _cell(view.get("messages")),
                    _cell(view.get("first_seq")),
                    _cell(view.get("last_seq")),
                ]
            )
    return table(["stream", "node", "messages", "first seq", "last seq"], rows, left=2)


def _generic(examples: list[Mapping[str, Any]]) -> str:
    cols: list[str] = []
    for ex in examples:
        cols += [k for k in ex if k not in cols]
    return table(cols, [[_cell(ex.get(c)) for c in cols] for ex in examples], left=len(cols))


_RENDER = {"diverged_streams": _diverged}


def findings_parts(results: Mapping[str, Any]) -> list[str]:
    """For each checker that kept findings (``anomalies``): each kind with its count and examples."""
    parts: list[str] = []
    for name, p in (results.get("checkers") or {}).items():
        counts = p.get("counts") or {}
        kinds = [(k, v or []) for k, v in (p.get("anomalies") or {}).items() if v or counts.get(k)]
        notes = p.get("notes") or []
        if not kinds and not notes:
            continue
        parts.append(f"<h2>Findings of the {esc(name)} checker: {esc(p.get('verdict'))}</h2>")
        parts += [f"<div class='note'>{esc(n)}</div>" for n in notes]
        for kind, examples in kinds:
            n = counts.get(kind)
            total = n if isinstance(n, int) else len(examples)
            shown = examples[:ROWS]
            more = f" (first {len(shown):,} of {total:,})" if total > len(shown) else ""
            parts.append(f"<h3>{esc(kind.replace('_', ' '))}: {total:,}{more}</h3>")
            parts.append(_RENDER.get(kind, _generic)(shown) if shown else "<p>no example kept</p>")
    return parts
