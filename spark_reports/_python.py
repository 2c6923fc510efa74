"""The pure-Python reconciliation: the reference the Spark job is checked against.

It holds one small record per message id in memory, so it is meant for histories
up to a few million operations; the Spark job is the one that scales.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from ._common import (
    DELIVERY_CAP,
    HISTORY_COLUMNS,
    NEMESIS,
    Context,
    Facts,
    assemble,
    bucket_of,
    cap,
    kinds_for,
    latency_us,
    make_context,
    order_stats,
    outcome_of,
    parse_id,
    progress,
    window_ids_at,
)
from .schema import LIST_CAP, Results


def iter_history(path: Path) -> Iterator[dict]:
    """Rows in index order, from Parquet or (for a run still being written) JSONL."""
    if path.suffix == ".jsonl":
        rows = []
        with path.open() as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    rows.append({k: rec.get(k) for k in HISTORY_COLUMNS})
        rows.sort(key=lambda r: r["index"])
        yield from rows
        return
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=list(HISTORY_COLUMNS)).sort_by("index")
    for batch in table.to_batches(max_chunksize=65536):
        cols = [batch.column(name).to_pylist() for name in HISTORY_COLUMNS]
        for values in zip(*cols, strict=True):
            yield dict(zip(HISTORY_COLUMNS, values, strict=True))


class _Msg:
    __slots__ = ("attempts", "outcomes", "first_inv", "confirm", "pending", "deliveries", "consumed")

    def __init__(self) -> None:
        self.attempts = 0
        self.outcomes: set[str] = set()
        self.first_inv: tuple[int, int] | None = None  # (index, time)
        self.confirm: tuple[int, int, str | None] | None = None  # (index, time, node)
        self.pending: deque[tuple[int, int]] = deque()
        self.deliveries: list[dict] = []
        self.consumed = 0

    @property
    def outcome(self) -> str:
        if self.attempts == 0:
            return "none"
        for o in ("ok", "info", "fail"):
            if o in self.outcomes:
                return o
        return "info"


def check_python(run_dir: Path, scenario: dict) -> Results:
    """Reconcile a stored run in plain Python (same results schema as check_spark)."""
    from ._common import history_path

    path = history_path(Path(run_dir), allow_jsonl=True)
    rows = list(iter_history(path)) if path.suffix == ".jsonl" else None
    source = rows if rows is not None else iter_history(path)
    # First pass over the small rows and the end time, exactly like the Spark job's prelude.
    ops, end_ns, small = 0, None, []
    for r in source:
        ops += 1
        end_ns = r["time_ns"] if end_ns is None else max(end_ns, r["time_ns"])
        if r["process"] == NEMESIS or r["f"] == "drain":
            small.append(r)
    ctx = make_context(ops, end_ns, small)
    progress("python", "prelude", ops=ops, faults=len(ctx.windows))
    facts = _reconcile(rows if rows is not None else iter_history(path), ctx)
    progress("python", "done", lost=facts.counts["lost"])
    return assemble("python", ctx, facts)


def _reconcile(source: Iterator[dict] | list[dict], ctx: Context) -> Facts:
    msgs: dict[str, _Msg] = {}
    timeline: dict[tuple[int, str | None, str | None], int] = {}
    lat_tl: dict[int, list[int]] = {}
    availability: dict[str, list[int]] = {}
    confirm_lat: list[int] = []
    max_seq: dict[tuple[str, str | None, str], int] = {}
    violations: list[dict] = []
    n_violations = 0
    consumed_total = 0
    publish_attempts = 0
    bw = ctx.bucket_s
    windows = ctx.windows

    for r in source:
        key = (bucket_of(r["time_ns"], bw), r["f"], r["type"])
        timeline[key] = timeline.get(key, 0) + 1
        f, ty, value = r["f"], r["type"], r["value"]
        if r["process"] == NEMESIS or value is None:
            continue
        if f == "publish":
            m = msgs.get(value)
            if ty == "invoke":
                if m is None:
                    m = msgs[value] = _Msg()
                m.attempts += 1
                publish_attempts += 1
                if m.first_inv is None:
                    m.first_inv = (r["index"], r["time_ns"])
                m.pending.append((r["index"], r["time_ns"]))
            elif m is not None and m.pending:
                _inv_index, inv_time = m.pending.popleft()
                outcome = outcome_of(ty)
                m.outcomes.add(outcome)
                _count_attempt(availability, windows, inv_time, outcome == "ok")
                if outcome == "ok":
                    if m.confirm is None:
                        m.confirm = (r["index"], r["time_ns"], r["node"])
                    lat = latency_us(r["time_ns"], inv_time)
                    confirm_lat.append(lat)
                    b = lat_tl.setdefault(bucket_of(r["time_ns"], bw), [0, 0, 0])
                    b[0] += 1
                    b[1] += lat
                    b[2] = max(b[2], lat)
        elif f == "consume" and ty == "ok":
            consumed_total += 1
            m = msgs.get(value)
            if m is None:
                m = msgs[value] = _Msg()
            m.consumed += 1
            if len(m.deliveries) < DELIVERY_CAP:
                m.deliveries.append({k: r[k] for k in ("index", "time_ns", "node", "queue", "process", "redelivered")})
            parsed = parse_id(value)
            if parsed is not None and r["redelivered"] is not True:
                producer, seq = parsed
                okey = (r["process"], r["queue"], producer)
                prev = max_seq.get(okey)
                if prev is not None and seq < prev:
                    n_violations += 1
                    if len(violations) < LIST_CAP:
                        violations.append({"consumer": r["process"], "queue": r["queue"], "producer": producer,
                                           "id": value, "seq": seq, "after_seq": prev, "index": r["index"]})
                max_seq[okey] = seq if prev is None else max(prev, seq)

    progress("python", "grouped", messages=len(msgs))
    # Invokes that never completed are indeterminate attempts.
    for m in msgs.values():
        while m.pending:
            _, inv_time = m.pending.popleft()
            m.outcomes.add("info")
            _count_attempt(availability, windows, inv_time, False)

    counts = dict.fromkeys(("attempted", "confirmed", "failed", "unknown", "consumed_unique", "lost",
                            "unexpected", "duplicated", "recovered"), 0)
    lost, unexpected, duplicated, recovered = [], [], [], []
    e2e: list[int] = []
    attribution: dict[tuple[str, str | None], int] = {}
    exposure: dict[str, list[int]] = {}
    drain_end = ctx.drain_end_ns
    for mid, m in msgs.items():
        outcome = m.outcome
        counts["attempted"] += m.attempts > 0
        counts["confirmed"] += outcome == "ok"
        counts["failed"] += outcome == "fail"
        counts["unknown"] += outcome == "info"
        counts["consumed_unique"] += m.consumed > 0
        if m.attempts and m.consumed:
            assert m.first_inv is not None
            e2e.append(latency_us(m.deliveries[0]["time_ns"], m.first_inv[1]))
        is_lost = outcome == "ok" and m.consumed == 0
        if outcome == "ok":
            assert m.confirm is not None
            for kind in kinds_for(windows, m.confirm[1], drain_end):
                ex = exposure.setdefault(kind, [0, 0])
                ex[0] += 1
                ex[1] += is_lost
                if is_lost:
                    akey = (kind, m.confirm[2])
                    attribution[akey] = attribution.get(akey, 0) + 1
        detail = None
        if is_lost:
            counts["lost"] += 1
            lost.append(detail := _detail(mid, m))
        if m.attempts == 0 and m.consumed:
            counts["unexpected"] += 1
            unexpected.append(detail or (detail := _detail(mid, m)))
        if m.consumed > 1:
            counts["duplicated"] += 1
            duplicated.append(detail or (detail := _detail(mid, m)))
        if outcome in ("fail", "info") and m.consumed:
            counts["recovered"] += 1
            recovered.append(detail or _detail(mid, m))

    counts["publish_attempts"] = publish_attempts
    counts["consumed_total"] = consumed_total
    counts["order_violations"] = n_violations
    confirm_lat.sort()
    e2e.sort()
    for lst in (unexpected, duplicated, recovered):
        for d in lst:
            d["first_delivery_index"] = d["deliveries"][0]["index"]
    return Facts(
        counts=counts,
        lost=cap(lost, "confirm_index"),
        unexpected=cap(unexpected, "first_delivery_index"),
        duplicated=cap(duplicated, "first_delivery_index"),
        recovered=cap(recovered, "first_delivery_index"),
        order_violations=violations,
        attribution_rows=[(k, n, c) for (k, n), c in attribution.items()],
        exposure_rows=[(k, v[0], v[1]) for k, v in exposure.items()],
        confirm_us=order_stats(confirm_lat),
        e2e_us=order_stats(e2e),
        availability={k: (v[0], v[1]) for k, v in availability.items()},
        timeline=[(t, f, ty, n) for (t, f, ty), n in timeline.items()],
        latency_timeline=[(t, v[0], v[1], v[2]) for t, v in lat_tl.items()],
    )


def _count_attempt(availability: dict[str, list[int]], windows: list, inv_time: int, ok: bool) -> None:
    for wid in window_ids_at(windows, inv_time) or ["outside"]:
        a = availability.setdefault(wid, [0, 0])
        a[0] += 1
        a[1] += ok


def _detail(mid: str, m: _Msg) -> dict:
    return {
        "id": mid, "attempts": m.attempts, "outcome": m.outcome,
        "first_invoke_ns": m.first_inv[1] if m.first_inv else None,
        "confirm_ns": m.confirm[1] if m.confirm else None,
        "confirm_node": m.confirm[2] if m.confirm else None,
        "confirm_index": m.confirm[0] if m.confirm else None,
        "consumed": m.consumed, "deliveries": list(m.deliveries),
    }
