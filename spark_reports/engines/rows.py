"""What the small checkers (stream, delay, atomicity) share: the history rows their Python engine
reads (a few columns in index order), the history as their Spark engine's view, and the shape of
their results (Jepsen's: valid, the anomalies found with examples, notes)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_reports.engines.common import history_path

EXAMPLES = 20
"""Examples kept per anomaly."""


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


def spark_history(run_dir: Path, spark: Any = None) -> tuple[Any, Any]:
    """The run's history as the Spark SQL view ``h``, in ``spark`` (by default the one session every
    checker of this process shares); returns the session and the history's DataFrame."""
    path = history_path(Path(run_dir))
    if spark is None:
        from spark_reports.service.session import spark_session

        spark = spark_session()
    h = spark.read.parquet(str(path)) if path.suffix == ".parquet" else spark.read.json(str(path))
    h.createOrReplaceTempView("h")
    return spark, h


@dataclass(frozen=True)
class Wording:
    """How one small checker words its results: its name, the anomalies it looks for (with labels),
    the count of what it checks (``subject``), and the sentences for an unfinished drain, an empty
    history and a clean one (``{n}``: the count they are about)."""

    name: str
    anomalies: Sequence[str]
    labels: dict[str, str]
    subject: str
    undrained: str
    undrained_note: str
    nothing: str
    clean: str
    order: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] = lambda examples: examples


def small_results(
    wording: Wording,
    counts: dict[str, int],
    examples: dict[str, list[dict[str, Any]]],
    *,
    engine: str,
    not_judged: str = "",
) -> dict[str, Any]:
    """The results of a small checker, the same from either engine. ``not_judged`` names the checks
    the history gave nothing to judge (and why): the reason line says so after its own words, so a
    check that saw nothing never reads as one that found nothing."""
    valid, verdict, bad = verdict_of(counts, wording.anomalies)
    notes = [f"{wording.name} {k.replace('_', ' ')}: {counts[k]}" for k in bad]
    unfinished = counts["unfinished_drains"]
    if unfinished:
        notes.append(wording.undrained_note.format(n=unfinished))
    if not counts[wording.subject]:
        notes.append(wording.nothing)
    if not_judged:
        notes.append(f"{wording.name} not judged: {not_judged}")
    if verdict == "unknown":
        otherwise = wording.undrained.format(n=unfinished)
    else:
        otherwise = wording.clean.format(n=counts[wording.subject])
    reason = reason_of(counts, bad, wording.labels, otherwise)
    return {
        "valid": valid,
        "verdict": verdict,
        "reason": f"{reason}; not judged: {not_judged}" if not_judged else reason,
        "engine": engine,
        "counts": counts,
        "anomalies": {k: wording.order(v)[:EXAMPLES] for k, v in examples.items()},
        "notes": notes,
    }
