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

from .stream import history_path, iter_rows

COUNT_KEYS = ("transactions", "publish_transactions", "ack_transactions", "committed", "rolled_back", "unknown",
              "incomplete_commits", "rolled_back_delivered", "partial_transactions", "acks_undone",
              "unfinished_drains", "history_ops")
ANOMALIES = ("incomplete_commits", "rolled_back_delivered", "partial_transactions", "acks_undone")
EXAMPLES = 20
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
    d = detail if isinstance(detail, dict) else json.loads(detail) if isinstance(detail, str) and detail else {}
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
        examples[name].append({"process": tx.process, "tx": tx.id, "queue": tx.queue, "kind": tx.kind,
                               "state": tx.state, "index": tx.invoked, "ids": sorted(ids), "size": len(tx.ids)})

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
    return _results(counts, examples, engine="python")


def _results(counts: dict[str, int], examples: dict[str, list[dict[str, Any]]], *, engine: str) -> dict[str, Any]:
    bad = [k for k in ANOMALIES if counts[k]]
    if bad:
        valid: bool | str = False
        verdict = "INTEGRITY"
    elif counts["unfinished_drains"]:
        valid, verdict = "unknown", "unknown"
    else:
        valid, verdict = True, "durable"
    notes = [f"atomicity {k.replace('_', ' ')}: {counts[k]}" for k in bad]
    if counts["unfinished_drains"]:
        notes.append(f"{counts['unfinished_drains']} drain(s) unfinished: whether committed transactions were "
                     "delivered whole is not judged")
    if not counts["transactions"]:
        notes.append("no transactions in the history (workload.transactions not set?)")
    return {"valid": valid, "verdict": verdict, "engine": engine, "counts": counts,
            "anomalies": {k: sorted(v, key=lambda e: e["index"])[:EXAMPLES] for k, v in examples.items()},
            "notes": notes}


def check_atomicity_python(run_dir: Path, scenario: dict[str, Any] | None = None) -> dict[str, Any]:
    return check_rows(iter_rows(history_path(Path(run_dir))))
