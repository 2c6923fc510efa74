"""Hand-written and generated histories, written with the contract's Arrow schema.

The checkers only ever see files; tests and benchmarks build histories here so a
planted anomaly goes through exactly the same reading path as a real run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.spec.history import FIELDS, SCHEMA_VERSION, arrow_schema, body_digest, message_body
from harness.spec.rundir import DISJOINT_NODES, HISTORY_JSONL, HISTORY_PARQUET, SCENARIO_JSON

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
        with (run_dir / HISTORY_JSONL).open("w") as fh:
            for r in full:
                fh.write(json.dumps(r) + "\n")
    if parquet:
        pq.write_table(pa.Table.from_pylist(full, schema=arrow_schema()), run_dir / HISTORY_PARQUET)
    return run_dir


@dataclass
class HistoryBuilder:
    """Appends ops with increasing index and time; each helper is one invoke/completion pair.

    The helpers are deliberately literal: ``publish("p1:1", "ok")`` is an invoke and an
    ok at the next tick, so a test reads like the history it describes. With ``seed``
    and ``message_size`` set (the scenario's), deliveries carry the digest of the body
    the producer sent, as a schema-2 consumer records it.
    """

    step_ns: int = 1_000_000
    rows: list[dict] = field(default_factory=list)
    t: int = 0
    seed: int | None = None
    message_size: int | None = None
    #: written as the run's ``scenario.json`` ``broker.disjoint_nodes`` (``BrokerPlugin.disjoint_nodes``)
    disjoint: bool = False

    def op(
        self,
        process: str,
        type_: str,
        f: str,
        value: Any = None,
        *,
        node: str | None = "n1",
        queue: str | None = None,
        redelivered: bool | None = None,
        at: int | None = None,
        error: str | None = None,
        digest: str | None = None,
        detail: Any = None,
    ) -> dict:
        self.t = self.t + self.step_ns if at is None else at
        if not isinstance(value, str) and value is not None:
            value = json.dumps(value)
        if not isinstance(detail, str) and detail is not None:
            detail = json.dumps(detail)
        row = {
            "index": len(self.rows),
            "time_ns": self.t,
            "process": process,
            "node": node,
            "type": type_,
            "f": f,
            "queue": queue,
            "value": value,
            "redelivered": redelivered,
            "error": error,
            "digest": digest,
            "detail": detail,
        }
        self.rows.append(row)
        return row

    def publish(self, mid: str, outcome: str | None = "ok", *, node: str = "n1", queue: str = "q") -> None:
        producer = mid.rsplit(":", 1)[0]
        self.op(producer, "invoke", "publish", mid, node=node, queue=queue)
        if outcome is not None:
            self.op(producer, outcome, "publish", mid, node=node, queue=queue)

    def body(self, mid: str) -> bytes:
        """What the producer sent for mid (needs seed and message_size)."""
        assert self.seed is not None and self.message_size is not None, "set seed and message_size"
        return message_body(mid, self.seed, self.message_size)

    def deliver(
        self,
        mid: str,
        *,
        consumer: str = "c1",
        node: str | None = "n1",
        queue: str | None = "q",
        redelivered: bool = False,
        body: bytes | None = None,
    ) -> dict:
        """A delivery (consume invoke and ok). ``body``: what arrived, when it is not what was sent."""
        digest, detail = None, None
        known = self.seed is not None and self.message_size is not None
        if body is not None:
            digest = body_digest(body)
            if not known or body != self.body(mid):
                detail = {"body": body[:200].decode(errors="backslashreplace"), "length": len(body)}
        elif known:
            digest = body_digest(self.body(mid))
        self.op(consumer, "invoke", "consume", None, node=node, queue=queue)
        return self.op(
            consumer,
            "ok",
            "consume",
            mid,
            node=node,
            queue=queue,
            redelivered=redelivered,
            digest=digest,
            detail=detail,
        )

    def ack(
        self,
        mid: str,
        outcome: str | None = "ok",
        *,
        consumer: str = "c1",
        node: str | None = "n1",
        queue: str | None = "q",
    ) -> None:
        """An ack written (invoke) and, unless outcome is None, its completion."""
        self.op(consumer, "invoke", "ack", mid, node=node, queue=queue)
        if outcome is not None:
            self._settled(consumer, outcome, "ack", mid, node, queue)

    def abandon(
        self,
        mid: str,
        cause: str = "requeue",
        outcome: str = "ok",
        *,
        consumer: str = "c1",
        node: str | None = "n1",
        queue: str | None = "q",
    ) -> None:
        """A delivery given back unacked; the cause is on the invoke, as the contract has it."""
        self.op(consumer, "invoke", "abandon", mid, node=node, queue=queue, detail={"cause": cause})
        self._settled(consumer, outcome, "abandon", mid, node, queue)

    def _settled(
        self, consumer: str, outcome: str, f: str, mid: str, node: str | None, queue: str | None
    ) -> None:
        """A delivery's ack or give-back completed: ``ok``, or failed as a closed channel fails it."""
        error = None if outcome == "ok" else "channel closed"
        self.op(consumer, outcome, f, mid, node=node, queue=queue, error=error)

    def consume(
        self,
        mid: str,
        *,
        consumer: str = "c1",
        node: str | None = "n1",
        queue: str | None = "q",
        redelivered: bool = False,
        ack: str | None = "ok",
        body: bytes | None = None,
    ) -> None:
        """A delivery and its ack (``ack=None``: delivered, never acked)."""
        self.deliver(mid, consumer=consumer, node=node, queue=queue, redelivered=redelivered, body=body)
        if ack is not None:
            self.ack(mid, ack, consumer=consumer, node=node, queue=queue)

    def fault(
        self, fault_id: str, kind: str, *, node: str | None = "n1", applied: bool = True, **params: Any
    ) -> None:
        value = {"fault_id": fault_id, "kind": kind, **params}
        self.op("nemesis", "invoke", kind, value, node=node)
        if applied:
            self.op("nemesis", "ok", kind, value, node=node)

    def heal(self, *fault_ids: str) -> None:
        value = {"fault_ids": list(fault_ids)}
        self.op("nemesis", "invoke", "heal", value, node=None)
        self.op("nemesis", "ok", "heal", value, node=None)

    def drain_invoke(self, *, drainer: str = "d1", queue: str | None = "q") -> None:
        self.op(drainer, "invoke", "drain", {}, node=None, queue=queue)

    def drain_done(
        self,
        *,
        drainer: str = "d1",
        queue: str | None = "q",
        outcome: str = "ok",
        consumed: int = 0,
        nodes: dict[str, dict] | None = None,
        error: str | None = None,
        gone: dict[str, str] | None = None,
    ) -> None:
        """The drain's completion; nodes: per node what the drainer saw (contract item 4); gone:
        the nodes that answered that the queue does not exist, with what they said."""
        value: dict[str, Any] = {"consumed": consumed}
        if nodes is not None:
            value["nodes"] = nodes
        if gone is not None:
            value["gone"] = gone
        self.op(
            drainer,
            outcome,
            "drain",
            value,
            node=None,
            queue=queue,
            error=error if error is not None or outcome == "ok" else "drain did not finish",
        )

    def depth(
        self,
        node: str,
        ready: int = 0,
        unacked: int = 0,
        *,
        clients: int | None = 0,
        own_unacked: int = 0,
        drainer: str = "d1",
        queue: str | None = "q",
        outcome: str = "ok",
    ) -> None:
        """One look of the drain at a node's queue depth (``depth`` op), as the AMQP drain records it."""
        self.op(drainer, "invoke", "depth", None, node=node, queue=queue)
        value: dict[str, Any] = {"ready": ready, "unacked": unacked, "own_unacked": own_unacked}
        if clients is not None:
            value["clients"] = clients
        self.op(
            drainer,
            outcome,
            "depth",
            value if outcome == "ok" else None,
            node=node,
            queue=queue,
            error=None if outcome == "ok" else "queue depth: exec failed",
        )

    def drain(
        self,
        *,
        drainer: str = "d1",
        complete: bool = True,
        consumed: int = 0,
        queue: str | None = "q",
        nodes: dict[str, dict] | None = None,
        outcome: str = "ok",
        gone: dict[str, str] | None = None,
    ) -> None:
        """A whole drain op; complete=False leaves it without a completion."""
        self.drain_invoke(drainer=drainer, queue=queue)
        if complete:
            self.drain_done(
                drainer=drainer, queue=queue, outcome=outcome, consumed=consumed, nodes=nodes, gone=gone
            )

    def holdings(
        self,
        node: str,
        entries: Sequence[tuple[int | None, str]] | None,
        *,
        queue: str | None = "q",
        error: str = "holdings: cannot tell",
    ) -> None:
        """What ``node``'s own copy of ``queue`` holds after the drain (``holdings`` op): (offset,
        id) pairs, or None for an ``info`` completion (the plugin could not tell)."""
        self.op("holdings", "invoke", "holdings", None, node=node, queue=queue)
        if entries is None:
            self.op("holdings", "info", "holdings", None, node=node, queue=queue, error=error)
        else:
            value = {"entries": [[o, m] for o, m in entries]}
            self.op("holdings", "ok", "holdings", value, node=node, queue=queue)

    def read(
        self, mid: str, offset: int, *, reader: str = "r1", node: str | None = "n1", queue: str = "q"
    ) -> None:
        """An ordered reader's read of the entry at ``offset`` (invoke and ok together)."""
        for t in ("invoke", "ok"):
            self.op(reader, t, "read", mid, node=node, queue=queue, detail={"stream_seq": offset})

    def seek(self, offset: int, *, reader: str = "r1", node: str | None = "n1", queue: str = "q") -> None:
        """A reader restarting on purpose from ``offset``."""
        for t in ("invoke", "ok"):
            self.op(reader, t, "seek", None, node=node, queue=queue, detail={"stream_seq": offset})

    def write(self, run_dir: Path, **kw: Any) -> Path:
        out = write_history(run_dir, self.rows, **kw)
        if self.disjoint:
            (out / SCENARIO_JSON).write_text(json.dumps({"broker": {DISJOINT_NODES: True}}))
        return out
