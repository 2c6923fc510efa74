"""Hand-written and generated histories, written with the contract's Arrow schema.

The checkers only ever see files; tests and benchmarks build histories here so a
planted anomaly goes through exactly the same reading path as a real run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.spec.history import FIELDS, SCHEMA_VERSION, arrow_schema

__all__ = ["FIELDS", "HistoryBuilder", "arrow_schema", "write_history"]


def write_history(run_dir: Path, rows: list[dict], *, jsonl: bool = True, parquet: bool = True) -> Path:
    """Write rows as history.jsonl and/or history.parquet in run_dir."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    full = [{name: r.get(name) for name in FIELDS} for r in rows]
    for r in full:
        r["schema"] = SCHEMA_VERSION if r["schema"] is None else r["schema"]
        if r["wall_time"] is None:
            r["wall_time"] = f"1970-01-01T00:00:{int(r['time_ns'] or 0) / 1e9:09.6f}Z"
    if jsonl:
        with (run_dir / "history.jsonl").open("w") as fh:
            for r in full:
                fh.write(json.dumps(r) + "\n")
    if parquet:
        pq.write_table(pa.Table.from_pylist(full, schema=arrow_schema()), run_dir / "history.parquet")
    return run_dir


@dataclass
class HistoryBuilder:
    """Appends ops with increasing index and time; each helper is one invoke/completion pair.

    The helpers are deliberately literal: ``publish("p1:1", "ok")`` is an invoke and an
    ok at the next tick, so a test reads like the history it describes.
    """

    step_ns: int = 1_000_000
    rows: list[dict] = field(default_factory=list)
    t: int = 0

    def op(self, process: str, type_: str, f: str, value: Any = None, *, node: str | None = "n1",
           queue: str | None = None, redelivered: bool | None = None, at: int | None = None) -> dict:
        self.t = self.t + self.step_ns if at is None else at
        if not isinstance(value, str) and value is not None:
            value = json.dumps(value)
        row = {"index": len(self.rows), "time_ns": self.t, "process": process, "node": node, "type": type_,
               "f": f, "queue": queue, "value": value, "redelivered": redelivered, "error": None}
        self.rows.append(row)
        return row

    def publish(self, mid: str, outcome: str | None = "ok", *, node: str = "n1", queue: str = "q") -> None:
        producer = mid.rsplit(":", 1)[0]
        self.op(producer, "invoke", "publish", mid, node=node, queue=queue)
        if outcome is not None:
            self.op(producer, outcome, "publish", mid, node=node, queue=queue)

    def consume(self, mid: str, *, consumer: str = "c1", node: str = "n1", queue: str = "q",
                redelivered: bool = False) -> None:
        self.op(consumer, "invoke", "consume", None, node=node, queue=queue)
        self.op(consumer, "ok", "consume", mid, node=node, queue=queue, redelivered=redelivered)
        self.op(consumer, "invoke", "ack", mid, node=node, queue=queue)
        self.op(consumer, "ok", "ack", mid, node=node, queue=queue)

    def fault(self, fault_id: str, kind: str, *, node: str | None = "n1", applied: bool = True,
              **params: Any) -> None:
        value = {"fault_id": fault_id, "kind": kind, **params}
        self.op("nemesis", "invoke", kind, value, node=node)
        if applied:
            self.op("nemesis", "ok", kind, value, node=node)

    def heal(self, *fault_ids: str) -> None:
        value = {"fault_ids": list(fault_ids)}
        self.op("nemesis", "invoke", "heal", value, node=None)
        self.op("nemesis", "ok", "heal", value, node=None)

    def drain(self, *, drainer: str = "d1", complete: bool = True, consumed: int = 0) -> None:
        self.op(drainer, "invoke", "drain", {}, node="n1")
        if complete:
            self.op(drainer, "ok", "drain", {"consumed": consumed}, node="n1")

    def write(self, run_dir: Path, **kw: Any) -> Path:
        return write_history(run_dir, self.rows, **kw)
