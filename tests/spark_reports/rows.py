"""Histories written by hand for the checker tests: a builder's helpers append the rows a driver would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harness.spec.history import FIELDS, arrow_schema

Q = "chaos-1"


class Rows:
    """The rows written so far; ``_row`` appends one (value and detail encoded as the history does)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def _row(
        self, process: str, type_: str, f: str, value: Any = None, detail: Any = None, queue: str | None = Q
    ) -> None:
        self.rows.append(
            {
                "index": len(self.rows),
                "process": process,
                "type": type_,
                "f": f,
                "queue": queue,
                "value": value if value is None or isinstance(value, str) else json.dumps(value),
                "detail": None if detail is None else json.dumps(detail),
            }
        )

    def write(self, run_dir: Path) -> Path:
        """The rows as a run directory's ``history.parquet`` (time is the index; every op on n1)."""
        full = [{k: r.get(k) for k in FIELDS} for r in self.rows]
        for r in full:
            r.update(time_ns=r["index"], wall_time="", node="n1", schema=2)
        pq.write_table(pa.Table.from_pylist(full, schema=arrow_schema()), run_dir / "history.parquet")
        return run_dir
