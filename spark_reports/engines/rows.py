"""The history rows the small pure-Python checkers (stream, delay, atomicity) read: a few columns in index order."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


def iter_rows(path: Path, columns: Sequence[str]) -> Iterator[dict[str, Any]]:
    """``columns`` of every record, in index order (Parquet, or JSONL while a run is written)."""
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.open() if line.strip()]
        rows.sort(key=lambda r: r["index"])
        for r in rows:
            yield {k: r.get(k) for k in columns}
        return
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=list(columns)).sort_by("index")
    yield from table.to_pylist()


def verdict_of(counts: dict[str, int], anomalies: Sequence[str]) -> tuple[bool | str, str, list[str]]:
    """(valid, verdict, the anomalies found) of a small checker: any anomaly is an integrity failure;
    otherwise an unfinished drain leaves the verdict unknown."""
    bad = [k for k in anomalies if counts[k]]
    if bad:
        return False, "INTEGRITY", bad
    if counts["unfinished_drains"]:
        return "unknown", "unknown", bad
    return True, "durable", bad


def reason_of(counts: dict[str, int], bad: Sequence[str], labels: dict[str, str], otherwise: str) -> str:
    """The reason line of a small checker: each anomaly found with its count, else ``otherwise``."""
    if bad:
        return "; ".join(f"{counts[k]:,} {labels[k]}" for k in bad)
    return otherwise
