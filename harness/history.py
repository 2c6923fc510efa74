"""Recording the history: the one contract between workload, faults and checkers.

The schema (fields, operations, what each completion means) is written once, in
``harness.spec.history``; this module only writes it, one JSON object per line.

Every invoke gets exactly one completion from the same process: the recorder
hands out an ``Invocation`` whose completion methods can be used once, and
``close()`` completes any that are still open as ``info`` so nothing is dropped
when a run dies half-way.
"""

from __future__ import annotations

import datetime as _dt
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness.spec.history import FIELDS, SCHEMA_VERSION, TYPES, arrow_schema

__all__ = [
    "FIELDS",
    "SCHEMA_VERSION",
    "TYPES",
    "Invocation",
    "Recorder",
    "arrow_schema",
    "read_jsonl",
    "to_parquet",
]


def encode_value(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(eq=False, slots=True)
class Invocation:
    """An open operation. Complete it once with ``ok``, ``fail`` or ``info``."""

    recorder: Recorder
    process: str
    f: str
    node: str | None
    queue: str | None
    value: Any
    index: int
    time_ns: int
    done: bool = field(default=False, init=False)

    def _complete(
        self,
        type_: str,
        value: Any,
        error: str | None,
        redelivered: bool | None,
        node: str | None,
        digest: str | None = None,
        detail: Any = None,
    ) -> dict[str, Any]:
        if self.done:
            raise RuntimeError(f"operation {self.index} ({self.process} {self.f}) completed twice")
        self.done = True
        rec = self.recorder  # the recorder's companion: completes under its lock, as invoke opens
        with rec._lock:
            rec._open.pop(self.index, None)
            return rec._write_locked(
                self.process,
                type_,
                self.f,
                node if node is not None else self.node,
                self.queue,
                self.value if value is None else value,
                redelivered,
                error,
                digest=digest,
                detail=detail,
            )

    def ok(
        self,
        value: Any = None,
        *,
        redelivered: bool | None = None,
        node: str | None = None,
        digest: str | None = None,
        detail: Any = None,
    ) -> dict[str, Any]:
        return self._complete("ok", value, None, redelivered, node, digest, detail)

    def fail(self, error: str, value: Any = None, *, detail: Any = None) -> dict[str, Any]:
        return self._complete("fail", value, error, None, None, None, detail)

    def info(self, error: str, value: Any = None, *, detail: Any = None) -> dict[str, Any]:
        return self._complete("info", value, error, None, None, None, detail)


class _ParquetParts:
    """The history as Parquet while the run writes it: a row group per ``rows`` records.

    Rows are handed to one writer thread in batches, so the workload never waits for
    compression; ``close()`` writes the last group and the footer and moves the file
    into place, so the checkers read it directly, with no conversion after the drain.
    A run killed before that leaves no Parquet file, only the JSONL (``to_parquet``).
    """

    def __init__(self, path: Path, rows: int) -> None:
        import queue

        self.path = path
        self.tmp = path.with_suffix(".parquet.tmp")
        self.rows = rows
        self.batch: dict[str, list[Any]] = {name: [] for name in FIELDS}
        self.queue: queue.Queue[dict[str, list[Any]] | None] = queue.Queue(maxsize=8)
        self.error: BaseException | None = None
        self.sent = False
        self.thread = threading.Thread(target=self._write, name="history-parquet", daemon=True)
        self.thread.start()

    def add(self, rec: dict[str, Any]) -> None:
        for name in FIELDS:
            self.batch[name].append(rec[name])
        if len(self.batch["index"]) >= self.rows:
            self.queue.put(self.batch)
            self.sent = True
            self.batch = {name: [] for name in FIELDS}

    def _write(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = arrow_schema()
        try:
            with pq.ParquetWriter(self.tmp, schema, compression="zstd") as writer:
                while (batch := self.queue.get()) is not None:
                    writer.write_table(pa.table(batch, schema=schema))
        except BaseException as exc:  # noqa: BLE001 - reported by close(); the JSONL is still complete
            self.error = exc
            while self.queue.get() is not None:
                pass

    def close(self) -> None:
        if self.batch["index"] or not self.sent:  # an empty history is still a file with the schema
            self.queue.put(self.batch)
        self.queue.put(None)
        self.thread.join()
        if self.error is None:
            self.tmp.replace(self.path)


class Recorder:
    """Appends history records to ``history.jsonl`` and, given ``parquet``, to a Parquet file
    in row groups as the run goes; safe to call from several threads."""

    def __init__(
        self, path: Path, *, flush_every: int = 256, parquet: Path | None = None, row_group: int = 50_000
    ) -> None:
        self.path = path
        self._parquet = _ParquetParts(parquet, row_group) if parquet is not None else None
        self._fh: IO[str] = path.open("a", encoding="utf-8", buffering=1 << 16)
        self._lock = threading.Lock()
        self._index = 0
        self._t0 = time.monotonic_ns()
        self._open: dict[int, Invocation] = {}
        self._since_flush = 0
        self._flush_every = flush_every
        self.counts: dict[tuple[str, str], int] = {}
        self.closed = False

    def now_ns(self) -> int:
        return time.monotonic_ns() - self._t0

    def invoke(
        self,
        process: str,
        f: str,
        *,
        node: str | None = None,
        queue: str | None = None,
        value: Any = None,
        detail: Any = None,
    ) -> Invocation:
        with self._lock:
            rec = self._write_locked(process, "invoke", f, node, queue, value, None, None, detail=detail)
            inv = Invocation(self, process, f, node, queue, value, rec["index"], rec["time_ns"])
            self._open[inv.index] = inv
            return inv

    def _write_locked(
        self,
        process: str,
        type_: str,
        f: str,
        node: str | None,
        queue: str | None,
        value: Any,
        redelivered: bool | None,
        error: str | None,
        *,
        digest: str | None = None,
        detail: Any = None,
    ) -> dict[str, Any]:
        if self.closed:
            raise RuntimeError("history is closed")
        t = self.now_ns()
        rec = {
            "index": self._index,
            "time_ns": t,
            "wall_time": _dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds"),
            "process": process,
            "node": node,
            "type": type_,
            "f": f,
            "queue": queue,
            "value": encode_value(value),
            "redelivered": redelivered,
            "error": error,
            "digest": digest,
            "detail": encode_value(detail),
            "schema": SCHEMA_VERSION,
        }
        self._index += 1
        self._fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        if self._parquet is not None:
            self._parquet.add(rec)
        key = (f, type_)
        self.counts[key] = self.counts.get(key, 0) + 1
        self._since_flush += 1
        if self._since_flush >= self._flush_every:
            self._fh.flush()
            self._since_flush = 0
        return rec

    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    def close(self) -> None:
        """Complete every open operation as ``info`` and close the file."""
        with self._lock:
            if self.closed:
                return
            for inv in sorted(self._open.values(), key=lambda i: i.index):
                inv.done = True
                self._write_locked(
                    inv.process,
                    "info",
                    inv.f,
                    inv.node,
                    inv.queue,
                    inv.value,
                    None,
                    "no completion recorded before the run ended",
                )
            self._open.clear()
            self._fh.flush()
            self._fh.close()
            if self._parquet is not None:
                self._parquet.close()
            self.closed = True


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def to_parquet(jsonl: Path, parquet: Path, *, batch_rows: int = 200_000) -> int:
    """Convert a history to Parquet in bounded memory; returns the number of records."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema()
    total = 0
    tmp = parquet.with_suffix(".parquet.tmp")
    with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        batch: dict[str, list[Any]] = {name: [] for name in FIELDS}
        for rec in read_jsonl(jsonl):
            for name in FIELDS:
                batch[name].append(rec.get(name))
            if len(batch["index"]) >= batch_rows:
                writer.write_table(pa.table(batch, schema=schema))
                total += len(batch["index"])
                batch = {name: [] for name in FIELDS}
        if batch["index"] or total == 0:
            writer.write_table(pa.table(batch, schema=schema))
            total += len(batch["index"])
    tmp.replace(parquet)
    return total
