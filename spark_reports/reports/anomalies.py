"""The report's section for Jepsen's finer classes (``results.anomalies``): only what occurred,
and each node's holdings when the run recorded them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from spark_reports.engines.anomalies import LABELS, occurring
from spark_reports.reports.html import esc as _e
from spark_reports.reports.html import table as _table

ROWS = 50


def _ids(ids: list[str], total: int) -> str:
    more = f" (+{total - len(ids[:10]):,} more)" if total > len(ids[:10]) else ""
    return ", ".join(ids[:10]) + more


def _off(x: Any) -> str:
    return "-" if x is None else f"{x:,}"


def anomaly_summary(results: Mapping[str, Any]) -> list[str]:
    """One line per class that occurred: "N label" (the terminal, Allure and grade say the same)."""
    return [f"{n:,} {LABELS[k]}" for k, n in occurring(results.get("anomalies")).items()]


def _step(x: Mapping[str, Any]) -> list[Any]:
    """A reader's step: who, on which stream, at which record, from which offset to which."""
    return [x["reader"], x["queue"], x["index"], x["from_offset"], x["to_offset"]]


_TABLES: dict[str, tuple[list[str], Callable[[Any], list[Any]]]] = {
    "lost_on_node": (
        ["queue", "node", "missing", "ids"],
        lambda x: [x["queue"], x["node"], f"{x['count']:,}", _ids(x["ids"], x["count"])],
    ),
    "inconsistent_offsets": (
        ["queue", "offset", "ids", "seen by"],
        lambda x: [x["queue"], x["offset"], ", ".join(x["ids"]), ", ".join(x["sources"])],
    ),
    "duplicate": (
        ["queue", "id", "offsets"],
        lambda x: [x["queue"], x["id"], ", ".join(map(str, x["offsets"]))],
    ),
    "poll_skip": (
        ["reader", "queue", "index", "from", "to", "skipped", "after seek"],
        lambda x: [*_step(x), x["skipped"], x["after_seek"]],
    ),
    "nonmonotonic_poll": (
        ["reader", "queue", "index", "from", "to", "after seek"],
        lambda x: [*_step(x), x["after_seek"]],
    ),
    "unseen": (
        ["queue", "id", "offset", "held by"],
        lambda x: [x["queue"], x["id"], _off(x["offset"]), ", ".join(x["nodes"])],
    ),
}
"""How each stream anomaly class is tabled: its columns, and a row of one example."""


_DETAIL_TABLES: dict[str, tuple[str, list[str], Callable[[Any], list[Any]], int, int | None]] = {
    "lost_positions": (
        "Lost messages by position in their producer's sequence",
        ["producer", "lost", "prefix", "middle", "postfix", "first survivor", "last survivor"],
        lambda p: [
            *(p[k] for k in ("producer", "lost", "prefix", "middle", "postfix")),
            *(_off(p[k]) for k in ("first_seen", "last_seen")),
        ],
        1,
        ROWS,
    ),
    "holdings": (
        "What each node's copy holds after the drain",
        ["queue", "node", "outcome", "entries", "first offset", "last offset", "error"],
        lambda h: [
            *(h[k] for k in ("queue", "node", "outcome")),
            *(_off(h[k]) for k in ("entries", "first_offset", "last_offset")),
            h["error"] or "",
        ],
        3,
        None,
    ),
}
"""The tables beside the classes, where the results have them: title, columns, a row of one, the
columns left-aligned, how many rows at most."""


def jepsen_parts(results: Mapping[str, Any]) -> list[str]:
    a = results.get("anomalies") or {}
    found = occurring(a)
    parts: list[str] = []
    if found:
        parts += [
            "<h2>Anomaly classes</h2>",
            "<p>Jepsen's finer classes (its NATS queue checker and its Kafka workload); see the "
            "docs page <em>Anomaly classes</em> for how each is computed.</p>",
            _table(["class", "what", "count"], [[k, LABELS[k], f"{n:,}"] for k, n in found.items()], left=2),
        ]
    for key, (title, head, row, left, cap) in _DETAIL_TABLES.items():
        if a.get(key):
            parts += [f"<h3>{title}</h3>", _table(head, [row(x) for x in a[key][:cap]], left=left)]
    return parts + _class_tables(a, found)


def _class_tables(a: Mapping[str, Any], found: Mapping[str, int]) -> list[str]:
    """One table per stream anomaly class that occurred, its first ROWS examples."""
    parts: list[str] = []
    for name, (head, row) in _TABLES.items():
        if not found.get(name):
            continue
        rows = a.get(name) or []
        more = (
            f" (first {min(len(rows), ROWS):,} of {found[name]:,})"
            if found[name] > min(len(rows), ROWS)
            else ""
        )
        parts += [
            f"<h3>{_e(name.replace('_', ' '))}{more}</h3>",
            _table(head, [row(x) for x in rows[:ROWS]], left=2),
        ]
    return parts
