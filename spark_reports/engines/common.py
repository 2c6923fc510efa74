"""What both engines share that belongs to no one subject: the names of a message's fates, ids,
outcomes, time buckets, percentile ranks, JSON fields, caps, and where a run's history is.

The expensive part of reconciliation (grouping millions of operations by message id) differs
per engine; everything that works on small inputs lives once, by subject: ``params`` (the
scenario's values), ``windows`` (fault windows), ``drain`` (the final drain), ``context`` (what a
check knows before its big pass), ``verdict`` (the verdict and the assembled results), so the two
engines cannot drift on it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.spec.history import DEPTH
from harness.spec.results import (
    LIST_CAP,
    Percentiles,
)
from harness.spec.rundir import (
    HISTORY_JSONL,
    HISTORY_PARQUET,
    history_file,
)
from spark_reports.engines.liveness import (
    NS_PER_S,
)

NEMESIS = "nemesis"
SMALL_OPS = ("drain", DEPTH)
"""Client ops both engines read on the side, with the nemesis's, before the big pass."""
DELIVERY_CAP = 10
"""Deliveries listed per message in detail lists; the count is always complete."""
MAX_TIMELINE_BUCKETS = 3600
"""Timeline buckets are one second wide until a run is longer than this many seconds."""
ID_RE = re.compile(r"(.*):([0-9]{1,18})", re.S)
"""producer:seq; the Spark job splits ids by the same rule in string functions (_spark_sql.producer_and_seq)."""


NEVER_DELIVERED = "never delivered"
ABANDONED = "abandoned delivery never redelivered"
UNACKED = "delivered, never acked"
NO_LIMIT_INDEX = (1 << 63) - 1


class HistoryError(Exception):
    """A run directory without a readable history: the user passed the wrong directory."""


class ScenarioError(ValueError):
    """A scenario value the checkers need (seed, message size, budgets) is malformed."""


def parse_id(value: str | None) -> tuple[str, int] | None:
    """Split ``producer:seq``; ids that do not fit take no part in order checks."""
    if value is None:
        return None
    m = ID_RE.fullmatch(value)
    if m is None:
        return None
    return m.group(1), int(m.group(2))


def outcome_of(completion_type: str | None) -> str:
    """Anything that is not a definite ok or fail is indeterminate."""
    if completion_type in ("ok", "fail"):
        return completion_type
    return "info"


def bucket_width_s(end_ns: int) -> int:
    end_s = max(end_ns, 0) // NS_PER_S
    return max(1, -(-(end_s + 1) // MAX_TIMELINE_BUCKETS))


def bucket_of(time_ns: int, width_s: int) -> int:
    return (time_ns // NS_PER_S) // width_s * width_s


def latency_us(later_ns: int, earlier_ns: int) -> int:
    """Whole microseconds, never negative (a negative lag means a malformed history)."""
    return max((later_ns - earlier_ns) // 1000, 0)


def rank_for(p: int, n: int) -> int:
    """Nearest-rank percentile: the 1-based rank of the p-th percentile of n values."""
    return max(1, (p * n + 99) // 100)


PERCENTILES = (50, 95, 99)


def percentiles_ms(n: int, values_us: dict[str, int | None]) -> Percentiles:
    """Turn exact microsecond order statistics into the schema's milliseconds."""

    def ms(v: int | None) -> float | None:
        return None if v is None or n == 0 else v / 1000

    return Percentiles(
        n=n,
        p50=ms(values_us.get("p50")),
        p95=ms(values_us.get("p95")),
        p99=ms(values_us.get("p99")),
        max=ms(values_us.get("max")),
    )


def load_json(text: str | None) -> dict:
    if not text:
        return {}
    try:
        obj = json.loads(text)
    except (ValueError, TypeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def json_field(text: str | None, key: str) -> str | None:
    """A top-level field of a JSON object as text, the way Spark's get_json_object returns it.

    Strings come back unquoted, other values as compact JSON, a missing key, a JSON null,
    a non-object or malformed text as None: the Python engine reads ``detail`` exactly as
    the Spark job does.
    """
    v = load_json(text).get(key)
    if v is None or isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"))


def json_int(text: str | None, key: str) -> int | None:
    """A whole-number JSON field, or None (also for floats, booleans and strings)."""
    v = load_json(text).get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def cap(items: list[dict], key: str) -> list[dict]:
    return sorted(items, key=lambda d: d[key])[:LIST_CAP]


def order_stats(sorted_values: list[int]) -> tuple[int, dict[str, int | None]]:
    """Nearest-rank order statistics from an ascending list."""
    n = len(sorted_values)
    if n == 0:
        return 0, {}
    out: dict[str, int | None] = {f"p{p}": sorted_values[rank_for(p, n) - 1] for p in PERCENTILES}
    out["max"] = sorted_values[-1]
    return n, out


def history_path(run_dir: Path, *, allow_jsonl: bool = True) -> Path:
    """Find the history, or say in one line what is missing."""
    found = history_file(run_dir, allow_jsonl=allow_jsonl)
    if found is not None:
        return found
    want = f"{HISTORY_PARQUET} or {HISTORY_JSONL}" if allow_jsonl else HISTORY_PARQUET
    raise HistoryError(f"no {want} in {run_dir}: pass a run directory (store/<scenario>/<timestamp>)")
