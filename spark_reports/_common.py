"""What both engines share: the rules that are cheap, and the final assembly.

The expensive part of reconciliation (grouping millions of operations by message id)
differs per engine; everything that works on small inputs (fault windows, drain
status, verdicts, attribution of a capped list, percentile ranks, rounding) lives
here once, so the two engines cannot drift on it.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .schema import (
    LIST_CAP,
    SCHEMA_VERSION,
    AttributionRow,
    Counts,
    Delivery,
    Drain,
    ExposureRow,
    FaultWindow,
    LostAttribution,
    MessageDetail,
    Percentiles,
    Results,
)

HISTORY_COLUMNS = ("index", "time_ns", "process", "node", "type", "f", "queue", "value", "redelivered")
NEMESIS = "nemesis"
DELIVERY_CAP = 10
"""Deliveries listed per message in detail lists; the count is always complete."""
MAX_TIMELINE_BUCKETS = 3600
"""Timeline buckets are one second wide until a run is longer than this many seconds."""
ID_RE = re.compile(r"(.*):([0-9]{1,18})", re.S)
"""producer:seq; the Spark job uses the same pattern in Java syntax (_spark.ID_RE_JAVA)."""
NS_PER_S = 1_000_000_000


class HistoryError(Exception):
    """A run directory without a readable history: the user passed the wrong directory."""


_T0 = time.monotonic()


def progress(engine: str, stage: str, **numbers: Any) -> None:
    """One short line per stage on stderr, so a long job visibly moves."""
    numbers["t"] = f"{time.monotonic() - _T0:.1f}s"
    extra = " ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in numbers.items())
    print(f"spark_reports[{engine}]: {stage} {extra}".rstrip(), file=sys.stderr, flush=True)


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
        n=n, p50=ms(values_us.get("p50")), p95=ms(values_us.get("p95")),
        p99=ms(values_us.get("p99")), max=ms(values_us.get("max")),
    )


def _load_json(text: str | None) -> dict:
    if not text:
        return {}
    try:
        obj = json.loads(text)
    except (ValueError, TypeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def fault_windows(nemesis_rows: list[dict], end_ns: int) -> list[FaultWindow]:
    """Fault windows from the nemesis ops, which are few enough to handle anywhere.

    A window opens at the fault's invoke and closes at the ok of the first heal that
    names it; a fault nobody healed stays open to the end of the history.
    """
    rows = sorted(nemesis_rows, key=lambda r: r["index"])
    windows: dict[str, dict] = {}
    order: list[str] = []
    heals: list[tuple[int, list[str]]] = []
    for r in rows:
        value = _load_json(r.get("value"))
        f = r.get("f") or "?"
        if f == "heal":
            if r.get("type") == "ok":
                ids = value.get("fault_ids") or []
                heals.append((r["time_ns"], [str(i) for i in ids] if isinstance(ids, list) else []))
            continue
        fid = str(value.get("fault_id") or f"{f}@{r['index']}")
        if r.get("type") == "invoke":
            if fid in windows:
                continue
            params = {k: v for k, v in value.items() if k not in ("fault_id", "kind")}
            windows[fid] = {"fault_id": fid, "kind": str(value.get("kind") or f), "node": r.get("node"),
                            "start_ns": r["time_ns"], "applied": False, "params": params}
            order.append(fid)
        elif fid in windows and r.get("type") == "ok":
            windows[fid]["applied"] = True
    out: list[FaultWindow] = []
    for fid in order:
        w = windows[fid]
        ends = [t for t, ids in heals if fid in ids and t >= w["start_ns"]]
        out.append(FaultWindow(
            fault_id=fid, kind=w["kind"], node=w["node"], start_ns=w["start_ns"],
            end_ns=min(ends) if ends else max(end_ns, w["start_ns"]), applied=w["applied"],
            healed=bool(ends), params=w["params"],
        ))
    return out


def drain_status(drain_rows: list[dict]) -> Drain:
    """A drain counts as complete only if every drainer's last drain ended ok."""
    per_proc: dict[str, list[dict]] = {}
    for r in sorted(drain_rows, key=lambda r: r["index"]):
        per_proc.setdefault(r["process"], []).append(r)
    invoked = sum(1 for r in drain_rows if r.get("type") == "invoke")
    completed = invoked > 0
    for ops in per_proc.values():
        inv = sum(1 for r in ops if r.get("type") == "invoke")
        done = [r for r in ops if r.get("type") != "invoke"]
        if inv and (len(done) < inv or done[-1].get("type") != "ok"):
            completed = False
    oks = [r["time_ns"] for r in drain_rows if r.get("type") == "ok"]
    return Drain(invoked=invoked, completed=completed, end_ns=max(oks) if oks else None)


@dataclass
class Context:
    """What an engine needs to know before its big pass: windows, drain, buckets."""

    end_ns: int
    ops: int
    windows: list[FaultWindow]
    drain: Drain
    bucket_s: int

    @property
    def drain_end_ns(self) -> int:
        """Where a lost message's exposure ends: the completed drain, else the history's end."""
        if self.drain["completed"] and self.drain["end_ns"] is not None:
            return self.drain["end_ns"]
        return self.end_ns


def make_context(ops: int, end_ns: int | None, small_rows: list[dict]) -> Context:
    """small_rows: every nemesis op and every drain op of the history."""
    end = end_ns or 0
    nem = [r for r in small_rows if r.get("process") == NEMESIS]
    drains = [r for r in small_rows if r.get("f") == "drain" and r.get("process") != NEMESIS]
    return Context(end_ns=end, ops=ops, windows=fault_windows(nem, end), drain=drain_status(drains),
                   bucket_s=bucket_width_s(end))


def overlapping(windows: list[FaultWindow], start_ns: int, end_ns: int) -> list[FaultWindow]:
    return [w for w in windows if w["start_ns"] <= end_ns and w["end_ns"] >= start_ns]


def kinds_for(windows: list[FaultWindow], confirm_ns: int, drain_end_ns: int) -> list[str]:
    """Fault kinds a confirmed message was exposed to; "none" when it met no fault."""
    kinds = sorted({w["kind"] for w in overlapping(windows, confirm_ns, drain_end_ns)})
    return kinds or ["none"]


def window_ids_at(windows: list[FaultWindow], t_ns: int) -> list[str]:
    return [w["fault_id"] for w in windows if w["start_ns"] <= t_ns <= w["end_ns"]]


@dataclass
class Facts:
    """The heavy results each engine computes its own way; assemble() does the rest."""

    counts: dict[str, int]
    lost: list[dict]  # capped, by confirm index; MessageDetail-like dicts
    unexpected: list[dict]  # capped, by first delivery index
    duplicated: list[dict]
    recovered: list[dict]
    order_violations: list[dict]  # capped, by index
    attribution_rows: list[tuple[str, str | None, int]]
    exposure_rows: list[tuple[str, int, int]]
    confirm_us: tuple[int, dict[str, int | None]]
    e2e_us: tuple[int, dict[str, int | None]]
    availability: dict[str, tuple[int, int]]  # window id or "outside" -> (attempts, confirmed)
    timeline: list[tuple[int, str | None, str | None, int]]
    latency_timeline: list[tuple[int, int, int, int]]  # bucket, n, sum_us, max_us
    extra: dict[str, Any] = field(default_factory=dict)


def _detail(d: dict) -> MessageDetail:
    deliveries = sorted(d.get("deliveries") or [], key=lambda x: x["index"])[:DELIVERY_CAP]
    return MessageDetail(
        id=d["id"], attempts=int(d.get("attempts") or 0), outcome=d.get("outcome") or "none",
        first_invoke_ns=d.get("first_invoke_ns"), confirm_ns=d.get("confirm_ns"),
        confirm_node=d.get("confirm_node"), consumed=int(d.get("consumed") or 0),
        deliveries=[Delivery(index=x["index"], time_ns=x["time_ns"], node=x.get("node"), queue=x.get("queue"),
                             process=x["process"], redelivered=x.get("redelivered")) for x in deliveries],
    )


def _verdict(counts: Counts, drain: Drain) -> tuple[Any, Any, str]:
    lost, unexpected = counts["lost"], counts["unexpected"]
    if lost and drain["completed"]:
        extra = f" and {unexpected:,} consumed but never attempted" if unexpected else ""
        return False, "LOST", f"{lost:,} confirmed messages never consumed after the final drain{extra}"
    if unexpected:
        return False, "INTEGRITY", f"{unexpected:,} messages consumed but never attempted"
    if lost:
        why = "no drain was recorded" if drain["invoked"] == 0 else "the final drain did not complete"
        return "unknown", "unknown", f"{lost:,} confirmed messages unconsumed, but {why}"
    return True, "durable", f"every one of {counts['confirmed']:,} confirmed messages was consumed"


def assemble(engine: str, ctx: Context, facts: Facts) -> Results:
    """Build the results dict identically for both engines."""
    c = facts.counts
    counts = Counts(
        attempted=c["attempted"], confirmed=c["confirmed"], failed=c["failed"], unknown=c["unknown"],
        publish_attempts=c["publish_attempts"], consumed_unique=c["consumed_unique"],
        consumed_total=c["consumed_total"], lost=c["lost"], unexpected=c["unexpected"],
        duplicated=c["duplicated"], recovered=c["recovered"], order_violations=c["order_violations"],
        history_ops=ctx.ops,
    )
    valid, verdict, reason = _verdict(counts, ctx.drain)
    lost_detail = [_detail(d) for d in facts.lost]
    drain_end = ctx.drain_end_ns
    messages: list[LostAttribution] = []
    for d in lost_detail:
        confirm = d["confirm_ns"] if d["confirm_ns"] is not None else 0
        ws = overlapping(ctx.windows, confirm, drain_end)
        messages.append(LostAttribution(
            id=d["id"], confirm_node=d["confirm_node"], confirm_ns=confirm,
            fault_ids=[w["fault_id"] for w in ws], fault_kinds=kinds_for(ctx.windows, confirm, drain_end),
        ))
    kind_of = {w["fault_id"]: w["kind"] for w in ctx.windows}
    availability = []
    for wid in [w["fault_id"] for w in ctx.windows] + ["outside"]:
        attempts, confirmed = facts.availability.get(wid, (0, 0))
        availability.append({"window": wid, "kind": kind_of.get(wid), "attempts": attempts,
                             "confirmed": confirmed, "share": (confirmed / attempts) if attempts else None})
    return Results(
        schema=SCHEMA_VERSION, engine=engine, valid=valid, verdict=verdict, reason=reason, counts=counts,  # type: ignore[typeddict-item]
        lost=[d["id"] for d in lost_detail], lost_truncated=counts["lost"] > len(lost_detail),
        lost_detail=lost_detail,
        unexpected=[d["id"] for d in facts.unexpected], unexpected_truncated=counts["unexpected"] > len(facts.unexpected),
        unexpected_detail=[_detail(d) for d in facts.unexpected],
        duplicated=[_detail(d) for d in facts.duplicated], recovered=[_detail(d) for d in facts.recovered],
        order_violations=sorted(facts.order_violations, key=lambda v: v["index"]),  # type: ignore[arg-type]
        attribution={
            "drain_end_ns": drain_end,
            "rows": [AttributionRow(fault_kind=k, node=n, count=cnt)
                     for k, n, cnt in sorted(facts.attribution_rows, key=lambda r: (r[0], r[1] or ""))],
            "exposure": [ExposureRow(fault_kind=k, confirmed=n, lost=lost)
                         for k, n, lost in sorted(facts.exposure_rows)],
            "messages": messages,
        },
        latency={"confirm_ms": percentiles_ms(*facts.confirm_us), "e2e_ms": percentiles_ms(*facts.e2e_us)},
        availability=availability,  # type: ignore[typeddict-item]
        timeline={
            "bucket_s": ctx.bucket_s,
            "rows": [{"t_s": t, "f": f, "type": ty, "count": n}  # type: ignore[typeddict-item]
                     for t, f, ty, n in sorted(facts.timeline, key=lambda r: (r[0], r[1] or "", r[2] or ""))],
            "latency": [{"t_s": t, "n": n, "mean_ms": round(s / n / 1000, 3), "max_ms": mx / 1000}
                        for t, n, s, mx in sorted(facts.latency_timeline)],
        },
        faults=ctx.windows, drain=ctx.drain, end_ns=ctx.end_ns,
    )


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


def history_path(run_dir: Path, *, allow_jsonl: bool) -> Path:
    """Find the history, or say in one line what is missing."""
    pq = Path(run_dir) / "history.parquet"
    if pq.is_file():
        return pq
    if allow_jsonl and (Path(run_dir) / "history.jsonl").is_file():
        return Path(run_dir) / "history.jsonl"
    want = "history.parquet or history.jsonl" if allow_jsonl else "history.parquet"
    raise HistoryError(f"no {want} in {run_dir}: pass a run directory (store/<scenario>/<timestamp>)")
