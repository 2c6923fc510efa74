"""Delay checks (``early`` / ``late``): delayed publishes against when they were delivered.

A delayed publish (``workload.delay``) carries ``{"delay_ms": n}`` in its invoke's
``detail``. Its due time is the invoke's ``time_ns`` plus the delay: the harness's
own monotonic clock, never the broker's. The broker got the publish after the invoke
was recorded and must hold it ``n`` ms by its clock, so a broker whose clock runs at
the right rate cannot deliver before that due time, whatever its clock says the time
is: a clock fault (``faults.clock``, libfaketime) that skews a node by a constant
offset changes nothing, while one that steps its clock forward, or makes it run
fast, while messages are held shows up here as early deliveries. An id published
more than once is due at its earliest attempt's due time (the kindest reading).

- ``early`` (a violation): a delivery (``consume`` ok) of a delayed id before its due
  time. Every delivery counts, redeliveries included.
- ``late`` (reported, not a violation): a delayed id whose first delivery came more
  than ``workload.delay.late_ms`` after due. The lateness of every first delivery is
  summarised (nearest-rank percentiles on whole milliseconds, so both engines agree
  exactly) and plotted in the report; lateness includes the broker's timer, routing,
  queueing behind other messages, and any time the scheduling node was down.

Delayed messages never delivered are the queue checkers' business (``lost``).
Two engines, one answer: ``check_delay_python`` and ``check_delay_spark``; a
differential test compares them on generated histories.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from spark_reports.engines import rows as _rows
from spark_reports.engines.common import history_path
from spark_reports.engines.rows import EXAMPLES, spark_history

COUNT_KEYS = (
    "delayed_publishes",
    "delayed_confirmed",
    "delayed_delivered",
    "early",
    "early_ids",
    "late",
    "lateness_p50_ms",
    "lateness_p90_ms",
    "lateness_p99_ms",
    "lateness_max_ms",
    "history_ops",
)
DEFAULT_LATE_MS = 5000
PERCENTILES = (50, 90, 99)
_COLUMNS = ("index", "time_ns", "process", "node", "type", "f", "value", "detail")


def iter_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The columns the delay checks read, in index order."""
    return _rows.iter_rows(path, _COLUMNS)


def late_ms(scenario: dict[str, Any] | None) -> int:
    delay = ((scenario or {}).get("workload") or {}).get("delay") or {}
    v = delay.get("late_ms", DEFAULT_LATE_MS)
    return v if isinstance(v, int) and not isinstance(v, bool) else DEFAULT_LATE_MS


def _delay(detail: Any) -> int | None:
    if not detail:
        return None
    try:
        d = json.loads(detail)
    except (TypeError, ValueError):
        return None
    v = d.get("delay_ms") if isinstance(d, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def nearest_rank(sorted_values: list[int], p: int) -> int | None:
    """The p-th percentile by nearest rank: the value at rank ceil(p/100 * n)."""
    n = len(sorted_values)
    if not n:
        return None
    return sorted_values[max(1, -(-p * n // 100)) - 1]


def lateness(rows: Iterable[dict[str, Any]]) -> tuple[dict[str, Any], int]:
    """Per delayed id: due, delay, confirmed, first delivery; plus every early delivery. Returns (state, rows seen)."""
    due: dict[str, int] = {}
    delay: dict[str, int] = {}
    confirmed: set[str] = set()
    first: dict[str, dict[str, Any]] = {}
    early: list[dict[str, Any]] = []
    n = 0
    for r in rows:
        n += 1
        f, t, mid = r.get("f"), r.get("type"), r.get("value")
        if f == "publish" and t == "invoke":
            d = _delay(r.get("detail"))
            if d is not None and mid is not None:
                at = int(r["time_ns"]) + d * 1_000_000
                if mid not in due or at < due[mid]:
                    due[mid], delay[mid] = at, d
        elif f == "publish" and t == "ok" and mid in due:
            confirmed.add(mid)
        elif f == "consume" and t == "ok" and mid in due:
            at = int(r["time_ns"])
            seen = {
                "id": mid,
                "index": int(r["index"]),
                "delay_ms": delay[mid],
                "due_ns": due[mid],
                "delivered_ns": at,
                "node": r.get("node"),
                "process": r.get("process"),
            }
            if at < due[mid]:
                early.append(seen | {"early_ms": (due[mid] - at) // 1_000_000})
            if mid not in first:
                first[mid] = seen
    return {"due": due, "confirmed": confirmed, "first": first, "early": early}, n


def lateness_ms_of_first_deliveries(state: dict[str, Any]) -> list[int]:
    """Whole milliseconds past due of each delayed id's first delivery (negative: it was early)."""
    return sorted((d["delivered_ns"] - d["due_ns"]) // 1_000_000 for d in state["first"].values())


def check_rows(rows: Iterable[dict[str, Any]], late_after_ms: int = DEFAULT_LATE_MS) -> dict[str, Any]:
    state, n = lateness(rows)
    lat = lateness_ms_of_first_deliveries(state)
    late = sorted(
        (
            {**d, "late_ms": (d["delivered_ns"] - d["due_ns"]) // 1_000_000}
            for d in state["first"].values()
            if (d["delivered_ns"] - d["due_ns"]) // 1_000_000 > late_after_ms
        ),
        key=lambda d: (-d["late_ms"], d["index"]),
    )
    early = state["early"]
    counts = {
        "delayed_publishes": len(state["due"]),
        "delayed_confirmed": len(state["confirmed"]),
        "delayed_delivered": len(state["first"]),
        "early": len(early),
        "early_ids": len({e["id"] for e in early}),
        "late": len(late),
        "lateness_max_ms": lat[-1] if lat else None,
        "history_ops": n,
    } | {f"lateness_p{p}_ms": nearest_rank(lat, p) for p in PERCENTILES}
    return results(
        counts,
        {"early": sorted(early, key=lambda e: e["index"]), "late": late},
        late_after_ms,
        engine="python",
    )


def results(
    counts: dict[str, Any], examples: dict[str, list[dict[str, Any]]], late_after_ms: int, *, engine: str
) -> dict[str, Any]:
    counts = {k: counts[k] for k in COUNT_KEYS}
    notes = []
    if counts["early"]:
        valid: bool | str = False
        verdict = "INTEGRITY"
        notes.append(
            f"{counts['early']} deliveries of {counts['early_ids']} delayed message(s) came before "
            "their due time"
        )
    elif not counts["delayed_publishes"]:
        valid, verdict = "unknown", "unknown"
        notes.append("no delayed publishes in the history (is workload.delay set?)")
    else:
        valid, verdict = True, "durable"
    if counts["late"]:
        notes.append(
            f"{counts['late']} delayed message(s) first delivered more than {late_after_ms} ms after due "
            f"(at most {counts['lateness_max_ms']} ms)"
        )
    return {
        "valid": valid,
        "verdict": verdict,
        "reason": notes[0]
        if notes
        else f"none of {counts['delayed_delivered']:,} delayed message(s) delivered before its due time",
        "engine": engine,
        "counts": counts,
        "late_after_ms": late_after_ms,
        "anomalies": {k: v[:EXAMPLES] for k, v in examples.items()},
        "notes": notes,
    }


def check_delay_python(run_dir: Path, scenario: dict[str, Any] | None = None) -> dict[str, Any]:
    return check_rows(iter_rows(history_path(Path(run_dir))), late_ms(scenario))


# -- the same checks in Spark SQL ------------------------------------------------------------------

_SQL = {
    "due": """
        SELECT value AS id, min_by(struct(due_ns, delay_ms), due_ns) AS d FROM (
          SELECT value, time_ns + CAST(get_json_object(detail, '$.delay_ms') AS BIGINT) * 1000000 AS due_ns,
                 CAST(get_json_object(detail, '$.delay_ms') AS BIGINT) AS delay_ms
          FROM h WHERE f = 'publish' AND type = 'invoke' AND value IS NOT NULL
            AND get_json_object(detail, '$.delay_ms') RLIKE '^-?[0-9]+$')
        GROUP BY value""",
    "deliveries": """
        SELECT c.index, c.value AS id, c.time_ns AS delivered_ns, c.node, c.process, u.d.due_ns AS due_ns,
               u.d.delay_ms AS delay_ms
        FROM h c JOIN due u ON c.value = u.id WHERE c.f = 'consume' AND c.type = 'ok'""",
    "first": """
        SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY id ORDER BY index) AS rn FROM dl) WHERE rn = 1""",
    "ranked": """
        SELECT lat, row_number() OVER (ORDER BY lat) AS rn, count(*) OVER () AS n
        FROM (SELECT floor((delivered_ns - due_ns) / 1000000) AS lat FROM fd)""",
}


def check_delay_spark(
    run_dir: Path, scenario: dict[str, Any] | None = None, *, spark: Any = None
) -> dict[str, Any]:
    """The delay checks as Spark SQL over the Parquet history; only examples and percentiles come back."""
    after = late_ms(scenario)
    spark, h = spark_history(run_dir, spark)
    spark.sql(_SQL["due"]).createOrReplaceTempView("due")
    spark.sql(_SQL["deliveries"]).createOrReplaceTempView("dl")
    spark.sql(_SQL["first"]).createOrReplaceTempView("fd")
    spark.sql(_SQL["ranked"]).createOrReplaceTempView("rk")

    def one(sql: str) -> Any:
        return spark.sql(sql).collect()[0][0]

    cols = "id, index, delay_ms, due_ns, delivered_ns, node, process"
    early = [
        _example(r.asDict()) | {"early_ms": (r["due_ns"] - r["delivered_ns"]) // 1_000_000}
        for r in spark.sql(
            f"SELECT {cols} FROM dl WHERE delivered_ns < due_ns ORDER BY index LIMIT {EXAMPLES}"
        ).collect()
    ]
    late = [
        _example(r.asDict()) | {"late_ms": int(r["late_ms"])}
        for r in spark.sql(
            f"SELECT {cols}, floor((delivered_ns - due_ns) / 1000000) AS late_ms FROM fd "
            f"WHERE floor((delivered_ns - due_ns) / 1000000) > {int(after)} ORDER BY late_ms DESC, index LIMIT {EXAMPLES}"
        ).collect()
    ]
    n_lat = one("SELECT count(*) FROM rk")
    pct = {}
    for p in PERCENTILES:
        rank = max(1, -(-p * n_lat // 100))
        pct[f"lateness_p{p}_ms"] = int(one(f"SELECT max(lat) FROM rk WHERE rn = {rank}")) if n_lat else None
    counts = {
        "delayed_publishes": one("SELECT count(*) FROM due"),
        "delayed_confirmed": one(
            "SELECT count(DISTINCT h.value) FROM h JOIN due ON h.value = due.id "
            "WHERE h.f = 'publish' AND h.type = 'ok'"
        ),
        "delayed_delivered": n_lat,
        "early": one("SELECT count(*) FROM dl WHERE delivered_ns < due_ns"),
        "early_ids": one("SELECT count(DISTINCT id) FROM dl WHERE delivered_ns < due_ns"),
        "late": one(f"SELECT count(*) FROM rk WHERE lat > {int(after)}"),
        "lateness_max_ms": int(one("SELECT max(lat) FROM rk")) if n_lat else None,
        "history_ops": h.count(),
    } | pct
    counts = {k: int(v) if v is not None else None for k, v in counts.items()}
    return results(counts, {"early": early, "late": late}, after, engine="spark")


def _example(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": r["id"],
        "index": int(r["index"]),
        "delay_ms": int(r["delay_ms"]),
        "due_ns": int(r["due_ns"]),
        "delivered_ns": int(r["delivered_ns"]),
        "node": r["node"],
        "process": r["process"],
    }
