"""Jepsen's finer anomaly classes, the pure-Python half and what both engines share.

Lost messages by position in their producer's sequence (Jepsen's NATS queue checker,
``lost-breakout``); from the ``holdings`` ops (each node's own copy of a stream after the
drain) and the ordered readers' ``read``/``seek`` ops: lost on node, inconsistent offsets,
duplicate, poll skip, nonmonotonic poll and unseen (Jepsen's Kafka workload). The Spark job
computes the same rows in ``_spark_anomalies``; ``anomalies_of`` turns either engine's rows
into the results' ``anomalies`` section. Definitions: docs/explanation/anomalies.md.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.spec.history import HOLDINGS, READ, SEEK
from harness.spec.results import (
    ANOMALY_CLASSES,
    ANOMALY_EXAMPLES,
    INTEGRITY_ANOMALIES,
    LIST_CAP,
    Anomalies,
)

STREAM_OPS = (HOLDINGS, READ, SEEK)
LISTS = ("lost_on_node", "inconsistent_offsets", "duplicate", "poll_skip", "nonmonotonic_poll", "unseen")
LABELS = {
    "lost_prefix": "lost before the first message of their producer that survived",
    "lost_middle": "lost between messages of their producer that survived",
    "lost_postfix": "lost after the last message of their producer that survived",
    "lost_on_node": "confirmed messages missing from a node's copy that another node's copy holds",
    "inconsistent_offsets": "offsets holding different messages on different nodes or reads",
    "duplicate": "messages at more than one offset",
    "poll_skip": "reads that skipped offsets that exist",
    "nonmonotonic_poll": "reads that went back without a seek",
    "unseen": "confirmed messages a node still holds that nobody consumed or read",
}


def entry_list(value: Any) -> list[tuple[int | None, str]]:
    """A holdings op's ``value`` (JSON text ``{"entries": [[offset, id], ...]}``) as pairs: an
    offset that is not a whole number reads as None, an entry without a string id is left out
    (as Spark's ``from_json`` + ``try_cast`` read it)."""
    try:
        obj = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return []
    raw = obj.get("entries") if isinstance(obj, dict) else None
    out: list[tuple[int | None, str]] = []
    for e in raw if isinstance(raw, list) else []:
        if not isinstance(e, list) or len(e) < 2 or not isinstance(e[1], str):
            continue
        off = e[0] if isinstance(e[0], int) and not isinstance(e[0], bool) else None
        out.append((off, e[1]))
    return out


def _offset(detail: Any) -> int | None:
    try:
        d = json.loads(detail) if isinstance(detail, str) else None
    except ValueError:
        return None
    v = d.get("stream_seq") if isinstance(d, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass
class StreamOps:
    """What the Python engine's pass keeps of the holdings, read and seek ops."""

    holdings: dict[tuple[str | None, str | None], dict] = field(default_factory=dict)  # last completion
    reads: list[tuple[str, str | None, int, str, int]] = field(default_factory=list)
    seeks: list[tuple[str, str | None, int, int]] = field(default_factory=list)
    read_ids: set[str] = field(default_factory=set)
    n_reads: int = 0

    def add(self, r: dict) -> None:
        f, ty = r["f"], r["type"]
        if f == HOLDINGS:
            if ty != "invoke":
                self.holdings[(r["queue"], r["node"])] = r  # rows come in index order: the last wins
            return
        if ty != "ok":
            return
        off = _offset(r["detail"])
        if f == READ and r["value"] is not None:
            self.n_reads += 1
            self.read_ids.add(r["value"])
            if off is not None:
                self.reads.append((r["process"], r["queue"], r["index"], r["value"], off))
        elif f == SEEK and off is not None:
            self.seeks.append((r["process"], r["queue"], r["index"], off))


def _off_key(off: int | None) -> tuple[bool, int]:
    return (off is None, off or 0)


def _holdings(
    ops: StreamOps,
) -> tuple[list[dict[str, Any]], dict[tuple[str | None, str | None], list[tuple[int | None, str]]]]:
    """Per node's copy of a queue: a summary row, and its entries where the look succeeded."""
    summary = []
    copies: dict[tuple[str | None, str | None], list[tuple[int | None, str]]] = {}
    for (q, n), r in sorted(ops.holdings.items(), key=lambda kv: (kv[0][0] or "", kv[0][1] or "")):
        entries = entry_list(r["value"]) if r["type"] == "ok" else None
        offs = [o for o, _ in entries or [] if o is not None]
        summary.append(
            {
                "queue": q,
                "node": n,
                "outcome": r["type"],
                "entries": None if entries is None else len(entries),
                "first_offset": min(offs, default=None),
                "last_offset": max(offs, default=None),
                "error": r["error"],
            }
        )
        if entries is not None:
            copies[(q, n)] = entries
    return summary, copies


def _lost_on_node(
    replicas: dict[str | None, list[str | None]],
    held_by: dict[tuple[str | None, str], set[str | None]],
    low: dict[tuple[str | None, str], int],
    out: dict[str, list[dict]],
    counts: dict[str, int],
) -> None:
    """Confirmed ids a node's copy lacks that another copy of the queue holds."""
    for q, nodes in sorted(replicas.items(), key=lambda kv: kv[0] or ""):
        for n in sorted(nodes, key=lambda x: x or ""):
            missing = [mid for (qq, mid), ns in held_by.items() if qq == q and n not in ns]
            if missing:
                missing.sort(key=lambda m: (*_off_key(low.get((q, m))), m))
                counts["lost_on_node"] += len(missing)
                out["lost_on_node"].append(
                    {"queue": q, "node": n, "count": len(missing), "ids": missing[:ANOMALY_EXAMPLES]}
                )


def stream_findings(ops: StreamOps, status: Callable[[str], tuple[bool, bool]]) -> dict[str, Any]:
    """Counts and capped lists of the holdings and reader classes. ``status(id)``: (confirmed,
    delivered or consumed)."""
    summary, copies = _holdings(ops)
    # every copy of every queue: where each id sits, at which offsets
    at: dict[tuple[str | None, str], set[str | None]] = {}  # (queue, id) -> nodes
    low: dict[tuple[str | None, str], int] = {}  # (queue, id) -> lowest offset
    seen_at: dict[tuple[str | None, int], dict[str, set[str]]] = {}  # (queue, offset) -> id -> sources
    for (q, n), entries in copies.items():
        for off, mid in entries:
            at.setdefault((q, mid), set()).add(n)
            if off is not None:
                low[(q, mid)] = min(low.get((q, mid), off), off)
                seen_at.setdefault((q, off), {}).setdefault(mid, set()).add(str(n))
    for proc, q, _i, mid, off in ops.reads:
        seen_at.setdefault((q, off), {}).setdefault(mid, set()).add(proc)
    out: dict[str, list[dict]] = {k: [] for k in LISTS}
    counts = dict.fromkeys(LISTS, 0)
    replicas: dict[str | None, list[str | None]] = {}
    for q, n in copies:
        replicas.setdefault(q, []).append(n)
    held_by = {key: nodes for key, nodes in at.items() if status(key[1])[0]}
    _lost_on_node(replicas, held_by, low, out, counts)
    for (q, off), ids in sorted(seen_at.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
        if len(ids) > 1:
            counts["inconsistent_offsets"] += 1
            out["inconsistent_offsets"].append(
                {
                    "queue": q,
                    "offset": off,
                    "ids": sorted(ids),
                    "sources": sorted(set().union(*ids.values())),
                }
            )
    offsets_of: dict[tuple[str | None, str], set[int]] = {}
    for (q, off), ids in seen_at.items():
        for mid in ids:
            offsets_of.setdefault((q, mid), set()).add(off)
    dups = [(q, mid, sorted(o)) for (q, mid), o in offsets_of.items() if len(o) > 1]
    dups.sort(key=lambda d: (d[0] or "", d[2][0], d[1]))
    counts["duplicate"] = len(dups)
    out["duplicate"] = [{"queue": q, "id": mid, "offsets": o} for q, mid, o in dups]
    polls(ops, {key for key in seen_at}, out, counts)
    unseen: list[dict[str, Any]] = []
    for (q, mid), holders in at.items():
        confirmed, got = status(mid)
        if confirmed and not got and mid not in ops.read_ids:
            unseen.append(
                {"queue": q, "id": mid, "offset": low.get((q, mid)), "nodes": sorted(str(x) for x in holders)}
            )
    unseen.sort(key=lambda u: (u["queue"] or "", u["offset"] is None, u["offset"] or 0, u["id"]))
    counts["unseen"] = len(unseen)
    out["unseen"] = unseen
    counts["holdings"] = len(copies)
    counts["readers"] = len({p for p, *_ in ops.reads})
    counts["reads"] = ops.n_reads
    return {"counts": counts, "holdings": summary, **{k: v[:ANOMALY_EXAMPLES] for k, v in out.items()}}


def polls(
    ops: StreamOps, exists: set[tuple[str | None, int]], out: dict[str, list[dict]], counts: dict[str, int]
) -> None:
    """Each reader's successive reads per stream (a seek to n stands for a read of n - 1). A step
    skips the offsets that ``exists`` holds strictly between its two ends: the offsets a node's
    copy or a read showed, dense (JetStream) or sparse (Redis entry ids) alike."""
    steps: dict[tuple[str, str | None], list[tuple[int, int, bool]]] = {}
    for proc, q, i, _mid, off in ops.reads:
        steps.setdefault((proc, q), []).append((i, off, False))
    for proc, q, i, off in ops.seeks:
        steps.setdefault((proc, q), []).append((i, off - 1, True))
    by_queue: dict[str | None, list[int]] = {}
    for q, off in exists:
        by_queue.setdefault(q, []).append(off)
    for offs in by_queue.values():
        offs.sort()
    found: dict[str, list[dict]] = {"poll_skip": [], "nonmonotonic_poll": []}
    for (proc, q), items in steps.items():
        items.sort()
        for (_i0, lo, seek0), (i, off, seek) in zip(items, items[1:], strict=False):
            if seek:
                continue
            step = {"reader": proc, "queue": q, "index": i, "from_offset": lo, "to_offset": off}
            if off <= lo:
                found["nonmonotonic_poll"].append({**step, "skipped": 0, "after_seek": seek0})
                continue
            known = by_queue.get(q, [])  # never the integers between: offsets may be sparse
            skipped = bisect.bisect_left(known, off) - bisect.bisect_right(known, lo)
            if skipped:
                found["poll_skip"].append({**step, "skipped": skipped, "after_seek": seek0})
    for k, v in found.items():
        v.sort(key=lambda s: s["index"])
        counts[k] = len(v)
        out[k] = v


def lost_positions(lost: Iterable[tuple[str, int]], survivors: Iterable[tuple[str, int]]) -> list[dict]:
    """Jepsen's ``lost-breakout`` per producer: (producer, seq) of every lost message and of every
    one that survived."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for p, s in survivors:
        first[p] = min(first.get(p, s), s)
        last[p] = max(last.get(p, s), s)
    rows: dict[str, dict] = {}
    for p, s in lost:
        row = rows.setdefault(
            p,
            {
                "producer": p,
                "lost": 0,
                "prefix": 0,
                "middle": 0,
                "postfix": 0,
                "first_seen": first.get(p),
                "last_seen": last.get(p),
            },
        )
        row["lost"] += 1
        if p in first and s < first[p]:
            row["prefix"] += 1
        elif p in last and s < last[p]:
            row["middle"] += 1
        else:
            row["postfix"] += 1
    return [rows[p] for p in sorted(rows)]


def empty_findings() -> dict[str, Any]:
    return {
        "counts": dict.fromkeys((*LISTS, "holdings", "readers", "reads"), 0),
        "holdings": [],
        **{k: [] for k in LISTS},
    }


def anomalies_of(lost: int, positions: list[dict], findings: dict[str, Any]) -> Anomalies:
    """The results' section from either engine's rows. Positions count only the run's lost
    messages (``lost``: 0 while what is missing is unreachable or stuck)."""
    positions = positions if lost else []
    counts = {
        "lost_prefix": sum(p["prefix"] for p in positions),
        "lost_middle": sum(p["middle"] for p in positions),
        "lost_postfix": sum(p["postfix"] for p in positions),
        **findings["counts"],
    }
    return Anomalies(
        counts={k: int(counts[k]) for k in (*ANOMALY_CLASSES, "holdings", "readers", "reads")},
        lost_positions=positions[:LIST_CAP],
        **{k: findings[k] for k in ("holdings", *LISTS)},  # type: ignore[typeddict-item]
    )


def integrity_findings(anomalies: Anomalies | dict | None) -> list[str]:
    """The INTEGRITY classes that occurred, each as "N label"."""
    counts = (anomalies or {}).get("counts") or {}
    return [f"{counts[k]:,} {LABELS[k]}" for k in INTEGRITY_ANOMALIES if counts.get(k)]


def occurring(anomalies: Anomalies | dict | None) -> dict[str, int]:
    """The classes that occurred, with their counts (what reports and grades show)."""
    counts = (anomalies or {}).get("counts") or {}
    return {k: int(counts[k]) for k in ANOMALY_CLASSES if counts.get(k)}
