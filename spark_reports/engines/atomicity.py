"""Atomicity checks: what AMQP transactions promise beyond a confirm (``workload.transactions``).

The queue checks (``python``/``spark``) judge each message on its own; a
transaction is a unit. From the history's ``commit`` and ``rollback`` ops (their
``detail`` lists the ids they cover, ``harness.spec.history``) and the
deliveries (``consume`` ``ok``):

- ``incomplete_commits``: a publish transaction that committed (commit ``ok``)
  with some of its messages never delivered (only judged when every drain
  finished, else the queue was not fully read);
- ``rolled_back_delivered``: a publish transaction that certainly did not commit
  (a ``rollback``, or a commit ``fail``) with any of its messages delivered;
- ``partial_transactions``: a transaction whose outcome the client never learnt
  (commit ``info`` or never completed) that shows as half applied: a publish
  transaction with some but not all of its messages delivered (drains finished),
  or an ack transaction with some but not all of its messages delivered again
  after its tx.commit was sent (the other acks held);
- ``acks_undone``: an ack transaction that committed whose messages were
  delivered again after its tx.commit was sent (committed acks taken back).

Two engines, one answer: ``check_atomicity_python`` and ``check_atomicity_spark``
(Spark SQL on the Parquet history) return the same dictionary; a differential
test compares them on generated histories.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_reports.engines.common import history_path
from spark_reports.engines.rows import EXAMPLES, Wording, small_results, spark_history
from spark_reports.engines.stream import iter_rows

COUNT_KEYS = (
    "transactions",
    "publish_transactions",
    "ack_transactions",
    "committed",
    "rolled_back",
    "unknown",
    "incomplete_commits",
    "rolled_back_delivered",
    "partial_transactions",
    "acks_undone",
    "unfinished_drains",
    "history_ops",
)
ANOMALIES = ("incomplete_commits", "rolled_back_delivered", "partial_transactions", "acks_undone")
LABELS = {
    "incomplete_commits": "committed publish transaction(s) with messages never delivered",
    "rolled_back_delivered": "rolled-back publish transaction(s) with messages delivered",
    "partial_transactions": "transaction(s) of unknown outcome applied in part",
    "acks_undone": "committed ack transaction(s) whose messages came again",
}
TX_OPS = ("commit", "rollback")


@dataclass
class _Tx:
    process: str
    id: str
    f: str
    queue: str | None
    kind: str  # publish | ack
    ids: list[str]
    invoked: int
    outcome: str | None = None

    @property
    def state(self) -> str:
        if self.f == "rollback" or self.outcome == "fail":
            return "rolled_back"
        return "committed" if self.outcome == "ok" else "unknown"


@dataclass
class _Seen:
    txs: dict[tuple[str, str], _Tx] = field(default_factory=dict)
    deliveries: dict[str, list[int]] = field(default_factory=dict)
    drains: dict[tuple[str, str | None], bool] = field(default_factory=dict)
    n: int = 0


def _ids(detail: Any) -> tuple[str, list[str]]:
    d = (
        detail
        if isinstance(detail, dict)
        else json.loads(detail)
        if isinstance(detail, str) and detail
        else {}
    )
    for kind in ("publish", "ack"):
        if isinstance(d.get(kind), list):
            return kind, [str(x) for x in d[kind]]
    return "publish", []


def _scan(rows: Iterable[dict[str, Any]]) -> _Seen:
    seen = _Seen()
    for r in rows:
        seen.n += 1
        f, t = r.get("f"), r.get("type")
        if f in TX_OPS:
            key = (r["process"], r["value"])
            if t == "invoke":
                kind, ids = _ids(r.get("detail"))
                seen.txs[key] = _Tx(r["process"], r["value"], f, r.get("queue"), kind, ids, r["index"])
            elif key in seen.txs and seen.txs[key].outcome is None:
                seen.txs[key].outcome = t
        elif f == "consume" and t == "ok" and r.get("value") is not None:
            seen.deliveries.setdefault(r["value"], []).append(r["index"])
        elif f == "drain" and t in ("ok", "info"):
            key2 = (r["process"], r.get("queue"))
            seen.drains[key2] = seen.drains.get(key2, True) and t == "ok"
    return seen


def check_rows(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The atomicity checks over history rows (dicts with the history's columns, in index order)."""
    seen = _scan(rows)
    drained = all(seen.drains.values())
    counts = dict.fromkeys(COUNT_KEYS, 0)
    counts["history_ops"] = seen.n
    counts["unfinished_drains"] = sum(not ok for ok in seen.drains.values())
    examples: dict[str, list[dict[str, Any]]] = {k: [] for k in ANOMALIES}

    def flag(name: str, tx: _Tx, ids: list[str]) -> None:
        counts[name] += 1
        examples[name].append(
            {
                "process": tx.process,
                "tx": tx.id,
                "queue": tx.queue,
                "kind": tx.kind,
                "state": tx.state,
                "index": tx.invoked,
                "ids": sorted(ids),
                "size": len(tx.ids),
            }
        )

    for tx in sorted(seen.txs.values(), key=lambda x: x.invoked):
        counts["transactions"] += 1
        counts[f"{tx.kind}_transactions"] += 1
        state = tx.state
        counts[state] += 1
        if not tx.ids:
            continue
        if tx.kind == "publish":
            got = [i for i in tx.ids if i in seen.deliveries]
            if state == "committed" and drained and len(got) < len(tx.ids):
                flag("incomplete_commits", tx, [i for i in tx.ids if i not in seen.deliveries])
            elif state == "rolled_back" and got:
                flag("rolled_back_delivered", tx, got)
            elif state == "unknown" and drained and 0 < len(got) < len(tx.ids):
                flag("partial_transactions", tx, got)
        elif state != "rolled_back":
            back = [i for i in tx.ids if any(ix > tx.invoked for ix in seen.deliveries.get(i, ()))]
            if state == "committed" and back:
                flag("acks_undone", tx, back)
            elif state == "unknown" and 0 < len(back) < len(tx.ids):
                flag("partial_transactions", tx, back)
    return small_results(WORDING, counts, examples, engine="python")


WORDING = Wording(
    name="atomicity",
    anomalies=ANOMALIES,
    labels=LABELS,
    subject="transactions",
    undrained="{n} drain(s) unfinished",
    undrained_note="{n} drain(s) unfinished: whether committed transactions were delivered whole is not judged",
    nothing="no transactions in the history (workload.transactions not set?)",
    clean="every one of {n:,} transaction(s) applied whole or not at all",
    order=lambda examples: sorted(examples, key=lambda e: e["index"]),
)


def check_atomicity_python(run_dir: Path, scenario: dict[str, Any] | None = None) -> dict[str, Any]:
    return check_rows(iter_rows(history_path(Path(run_dir))))


# -- the same checks in Spark SQL ------------------------------------------------------------------

_SQL = {
    "tx": """
        SELECT t.process, t.tx, t.f, t.queue, t.invoked, t.kind, t.ids, o.outcome,
               CASE WHEN t.f = 'rollback' OR o.outcome = 'fail' THEN 'rolled_back'
                    WHEN o.outcome = 'ok' THEN 'committed' ELSE 'unknown' END AS state
        FROM (SELECT process, value AS tx, f, queue, index AS invoked,
                     CASE WHEN d.publish IS NULL AND d.ack IS NOT NULL THEN 'ack' ELSE 'publish' END AS kind,
                     coalesce(d.publish, d.ack, array()) AS ids
              FROM (SELECT *, from_json(detail, 'publish array<string>, ack array<string>') AS d FROM h)
              WHERE f IN ('commit', 'rollback') AND type = 'invoke') t
        LEFT JOIN (SELECT process, value AS tx, min_by(type, index) AS outcome FROM h
                   WHERE f IN ('commit', 'rollback') AND type <> 'invoke' GROUP BY process, value) o
          ON t.process = o.process AND t.tx = o.tx""",
    "per": """
        SELECT process, tx, queue, kind, state, invoked, size,
               sort_array(collect_list(CASE WHEN last IS NOT NULL THEN id END)) AS got,
               sort_array(collect_list(CASE WHEN last IS NULL THEN id END)) AS missing,
               sort_array(collect_list(CASE WHEN last > invoked THEN id END)) AS back
        FROM (SELECT e.*, d.last
              FROM (SELECT process, tx, queue, kind, state, invoked, size(ids) AS size, id
                    FROM tx LATERAL VIEW explode(ids) x AS id) e
              LEFT JOIN (SELECT value AS id, MAX(index) AS last FROM h
                         WHERE f = 'consume' AND type = 'ok' AND value IS NOT NULL GROUP BY value) d
                ON e.id = d.id)
        GROUP BY process, tx, queue, kind, state, invoked, size""",
    "flags": """
        SELECT 'incomplete_commits' AS anomaly, *, missing AS ids FROM per
          WHERE kind = 'publish' AND state = 'committed' AND {drained} AND size(got) < size
        UNION ALL SELECT 'rolled_back_delivered', *, got FROM per
          WHERE kind = 'publish' AND state = 'rolled_back' AND size(got) > 0
        UNION ALL SELECT 'partial_transactions', *, got FROM per
          WHERE kind = 'publish' AND state = 'unknown' AND {drained} AND size(got) > 0 AND size(got) < size
        UNION ALL SELECT 'acks_undone', *, back FROM per
          WHERE kind = 'ack' AND state = 'committed' AND size(back) > 0
        UNION ALL SELECT 'partial_transactions', *, back FROM per
          WHERE kind = 'ack' AND state = 'unknown' AND size(back) > 0 AND size(back) < size""",
}


def check_atomicity_spark(
    run_dir: Path, scenario: dict[str, Any] | None = None, *, spark: Any = None
) -> dict[str, Any]:
    """The atomicity checks as Spark SQL over the Parquet history: the join of every transaction's ids
    with the deliveries runs in Spark; only the transactions flagged come back to the driver."""
    spark, h = spark_history(run_dir, spark)
    spark.sql(_SQL["tx"]).createOrReplaceTempView("tx")
    spark.sql(_SQL["per"]).createOrReplaceTempView("per")
    drains = spark.sql(
        "SELECT process, queue, bool_and(type = 'ok') AS ok FROM h "
        "WHERE f = 'drain' AND type IN ('ok', 'info') GROUP BY process, queue"
    ).collect()
    unfinished = sum(not r["ok"] for r in drains)
    counts = dict.fromkeys(COUNT_KEYS, 0)
    counts["history_ops"] = h.count()
    counts["unfinished_drains"] = unfinished
    for r in spark.sql("SELECT kind, state, COUNT(*) AS n FROM tx GROUP BY kind, state").collect():
        counts["transactions"] += r["n"]
        counts[f"{r['kind']}_transactions"] += r["n"]
        counts[r["state"]] += r["n"]
    examples: dict[str, list[dict[str, Any]]] = {k: [] for k in ANOMALIES}
    flagged = spark.sql(_SQL["flags"].format(drained="true" if not unfinished else "false"))
    for r in flagged.orderBy("invoked").collect():
        counts[r["anomaly"]] += 1
        if len(examples[r["anomaly"]]) < EXAMPLES:
            examples[r["anomaly"]].append(
                {
                    "process": r["process"],
                    "tx": r["tx"],
                    "queue": r["queue"],
                    "kind": r["kind"],
                    "state": r["state"],
                    "index": r["invoked"],
                    "ids": list(r["ids"]),
                    "size": r["size"],
                }
            )
    return small_results(WORDING, counts, examples, engine="spark")
