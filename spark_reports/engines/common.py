"""What both engines share: the rules that are cheap, and the final assembly.

The expensive part of reconciliation (grouping millions of operations by message id)
differs per engine; everything that works on small inputs (fault windows, drain
status, verdicts, attribution of a capped list, percentile ranks, rounding) lives
here once, so the two engines cannot drift on it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.spec.history import DEPTH, body_digest, message_body
from harness.spec.results import (
    LIST_CAP,
    SCHEMA_VERSION,
    STUCK_CAUSE,
    UNAVAILABLE_S,
    AttributionRow,
    Budgets,
    Corruption,
    Counts,
    Delivery,
    Drain,
    DrainOp,
    DrainRound,
    EmptyNode,
    ExposureRow,
    FaultWindow,
    Liveness,
    LostAttribution,
    LostCauseRow,
    MessageDetail,
    Percentiles,
    Results,
    Resurrection,
    SplitBrainCopy,
    StuckQueue,
    UnflaggedRedelivery,
)
from harness.spec.rundir import (
    HISTORY_JSONL,
    HISTORY_PARQUET,
    history_file,
)
from spark_reports.engines.anomalies import anomalies_of, empty_findings, integrity_findings
from spark_reports.engines.liveness import (
    NS_PER_S,
    LiveFacts,
    describe_overrun,
    describe_unavailable,
    liveness,
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
EXCERPT_CHARS = 200
"""The expected body shown beside a corrupted one: as much as a consumer records of what it got."""
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


def _load_json(text: str | None) -> dict:
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
    v = _load_json(text).get(key)
    if v is None or isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"))


def json_int(text: str | None, key: str) -> int | None:
    """A whole-number JSON field, or None (also for floats, booleans and strings)."""
    v = _load_json(text).get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Params:
    """What the checkers take from the scenario: how bodies were made, and the budgets."""

    seed: int | None
    message_size: int | None
    budgets: Budgets
    delays: bool = False  # workload.delay: delayed publishes are outside the per-producer order check

    @property
    def bodies_known(self) -> bool:
        return self.seed is not None and self.message_size is not None


def _whole(value: Any, where: str, *, null_ok: bool) -> int | None:
    if value is None and null_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        allowed = "a whole number >= 0" + (" or null" if null_ok else "")
        raise ScenarioError(f"scenario {where} must be {allowed}, not {value!r}: fix the scenario file")
    return value


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ScenarioError(
            f"scenario {where} must be a number of seconds > 0, not {value!r}: fix the scenario file"
        )
    return float(value)


def recovery_budget_of(value: Any) -> float | dict[str, float] | None:
    """``budgets.recovery_s``: seconds for every fault kind, or a mapping from fault kind to seconds."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {str(k): _seconds(v, f"budgets.recovery_s.{k}") for k, v in sorted(value.items())}
    return _seconds(value, "budgets.recovery_s")


def scenario_params(scenario: dict | None) -> Params:
    """Read seed, workload.message_size and budgets from a scenario dict.

    Accepts the scenario itself or a run directory's scenario.json, which wraps it as
    ``{"scenario": {...}, "seed": ...}``. A missing seed or size leaves bodies unverified
    (the results say so); a malformed one is the user's to fix.
    """
    s = scenario or {}
    if isinstance(s.get("scenario"), dict):
        s = s["scenario"]
    w = s.get("workload")
    workload: dict = w if isinstance(w, dict) else {}
    seed = _whole(s["seed"], "seed", null_ok=True) if "seed" in s else None
    size = (
        _whole(workload["message_size"], "workload.message_size", null_ok=True)
        if "message_size" in workload
        else None
    )
    raw = s.get("budgets")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError(f"scenario budgets must be a mapping, not {raw!r}: fix the scenario file")
    unknown = sorted(set(raw) - {"duplicated", "resurrected", "recovery_s"})
    if unknown:
        raise ScenarioError(
            f"scenario budgets: unknown key(s) {', '.join(map(str, unknown))}; "
            "use duplicated, resurrected and recovery_s"
        )
    budgets = Budgets(
        duplicated=_whole(raw.get("duplicated"), "budgets.duplicated", null_ok=True),
        resurrected=_whole(raw.get("resurrected"), "budgets.resurrected", null_ok=True),
        recovery_s=recovery_budget_of(raw.get("recovery_s")),
    )
    return Params(
        seed=seed, message_size=size, budgets=budgets, delays=isinstance(workload.get("delay"), dict)
    )


def expected_body(msg_id: str, params: Params) -> str:
    """The body the producer sent for msg_id, as text (message_body is ASCII apart from the id)."""
    assert params.seed is not None and params.message_size is not None
    return message_body(msg_id, params.seed, params.message_size).decode()


def expected_digest(msg_id: str, params: Params) -> str:
    assert params.seed is not None and params.message_size is not None
    return body_digest(message_body(msg_id, params.seed, params.message_size))


def fault_windows(nemesis_rows: list[dict], end_ns: int) -> list[FaultWindow]:
    """Fault windows from the nemesis ops, which are few enough to handle anywhere.

    A window opens at the fault's invoke and closes at the ok of the first heal that
    names it; a fault nobody healed stays open to the end of the history. ``heal_start_ns`` is
    that heal's invoke (where recovery is measured from).
    """
    rows = sorted(nemesis_rows, key=lambda r: r["index"])
    windows: dict[str, dict] = {}
    order: list[str] = []
    heals: list[tuple[int, list[str]]] = []
    heal_invokes: list[tuple[int, list[str]]] = []
    for r in rows:
        value = _load_json(r.get("value"))
        f = r.get("f") or "?"
        if f == "heal":
            ids = value.get("fault_ids") or []
            named = [str(i) for i in ids] if isinstance(ids, list) else []
            if r.get("type") == "ok":
                heals.append((r["time_ns"], named))
            elif r.get("type") == "invoke":
                heal_invokes.append((r["time_ns"], named))
            continue
        fid = str(value.get("fault_id") or f"{f}@{r['index']}")
        if r.get("type") == "invoke":
            if fid in windows:
                continue
            params = {k: v for k, v in value.items() if k not in ("fault_id", "kind")}
            windows[fid] = {
                "fault_id": fid,
                "kind": str(value.get("kind") or f),
                "node": r.get("node"),
                "start_ns": r["time_ns"],
                "applied": False,
                "params": params,
            }
            order.append(fid)
        elif fid in windows and r.get("type") == "ok":
            windows[fid]["applied"] = True
    out: list[FaultWindow] = []
    for fid in order:
        w = windows[fid]
        ends = [t for t, ids in heals if fid in ids and t >= w["start_ns"]]
        end = min(ends) if ends else None
        began = [t for t, ids in heal_invokes if fid in ids and end is not None and w["start_ns"] <= t <= end]
        out.append(
            FaultWindow(
                fault_id=fid,
                kind=w["kind"],
                node=w["node"],
                start_ns=w["start_ns"],
                end_ns=end if end is not None else max(end_ns, w["start_ns"]),
                heal_start_ns=max(began) if began else end,
                applied=w["applied"],
                healed=bool(ends),
                params=w["params"],
            )
        )
    return out


@dataclass(frozen=True)
class DrainSpan:
    """A node that reported a drained queue empty, within one drain op's index range."""

    process: str
    queue: str | None
    lo: int  # the drain's invoke index
    hi: int  # its completion's index
    node: str
    empty_at_ns: int


def _node_view(v: Any) -> dict:
    view = v if isinstance(v, dict) else {}
    return {k: view.get(k) for k in ("consumed", "ready", "unacked", "empty_at_ns", "error")}


def _round(x: dict) -> DrainRound:
    errors = x.get("errors")
    empty = x.get("empty")
    return DrainRound(
        end_ns=_int_or(x.get("end_ns"), 0),
        consumed=_int_or(x.get("consumed"), 0),
        empty=[str(n) for n in empty] if isinstance(empty, list) else [],
        errors={str(n): str(e) for n, e in errors.items()} if isinstance(errors, dict) else {},
    )


def _int_or(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def drain_ops(drain_rows: list[dict]) -> tuple[list[DrainOp], list[DrainSpan]]:
    """Pair each drain invoke with the next completion of the same drainer and queue."""
    ops: list[DrainOp] = []
    spans: list[DrainSpan] = []
    open_ops: dict[tuple[str, str | None], list[tuple[int, DrainOp]]] = {}
    for r in sorted(drain_rows, key=lambda r: r["index"]):
        key = (r["process"], r.get("queue"))
        if r.get("type") == "invoke":
            op = DrainOp(
                process=r["process"],
                queue=r.get("queue"),
                outcome="open",
                error=None,
                consumed=None,
                nodes={},
                rounds=[],
                end_ns=None,
            )
            ops.append(op)
            open_ops.setdefault(key, []).append((r["index"], op))
            continue
        waiting = open_ops.get(key)
        if not waiting:
            continue
        lo, op = waiting.pop(0)
        value = _load_json(r.get("value"))
        raw_nodes = value.get("nodes")
        nodes: dict = raw_nodes if isinstance(raw_nodes, dict) else {}
        consumed = value.get("consumed")
        op["outcome"] = outcome_of(r.get("type"))  # type: ignore[typeddict-item]
        op["error"] = r.get("error")
        op["consumed"] = consumed if isinstance(consumed, int) and not isinstance(consumed, bool) else None
        op["nodes"] = {str(n): _node_view(v) for n, v in sorted(nodes.items())}
        op["end_ns"] = r["time_ns"]
        rounds = value.get("rounds")
        op["rounds"] = [_round(x) for x in rounds if isinstance(x, dict)] if isinstance(rounds, list) else []
        for n, v in op["nodes"].items():
            t = v["empty_at_ns"]
            if isinstance(t, int) and not isinstance(t, bool):
                spans.append(
                    DrainSpan(
                        process=r["process"],
                        queue=r.get("queue"),
                        lo=lo,
                        hi=r["index"],
                        node=n,
                        empty_at_ns=t,
                    )
                )
    return ops, spans


def drain_status(drain_rows: list[dict]) -> Drain:
    """A drain counts as complete only if every drain op's last completion, per drainer and queue, is ok."""
    ops, _ = drain_ops(drain_rows)
    last: dict[tuple[str, str | None], DrainOp] = {}
    for op in ops:
        last[(op["process"], op["queue"])] = op
    completed = bool(ops) and all(op["outcome"] == "ok" for op in last.values())
    oks = [r["time_ns"] for r in drain_rows if r.get("type") == "ok"]
    return Drain(invoked=len(ops), completed=completed, end_ns=max(oks) if oks else None, ops=ops)


def split_brain_nodes(
    spans: list[DrainSpan], process: str, queue: str | None, index: int, time_ns: int, node: str | None
) -> list[EmptyNode]:
    """The other nodes of the drain op holding this ack that had reported empty before it."""
    hits = {
        (s.empty_at_ns, s.node)
        for s in spans
        if s.process == process
        and s.queue == queue
        and s.lo < index < s.hi
        and s.node != node
        and time_ns > s.empty_at_ns
    }
    return [EmptyNode(node=n, empty_at_ns=t) for t, n in sorted(hits)]


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _held_for_no_one(look: dict) -> bool:
    """A look that found unacked deliveries nobody of the harness's could hold: no other client
    connection open on the queue, none held by the drain, nothing ready."""
    return (
        look["ready"] == 0
        and (look["unacked"] or 0) > 0
        and look["clients"] == 0
        and look["own_unacked"] == 0
    )


def stuck_queues(drain_rows: list[dict], depth_rows: list[dict]) -> tuple[list[StuckQueue], bool]:
    """Nodes whose last look (``depth`` op) within a drain that did not finish found deliveries held
    for no consumer, and whether that explains every drain that did not finish.

    A drain op (drainer, queue) whose last completion is not ok is explained when its completion
    names its nodes and each node's last look in it was ok and found the queue either empty
    (nothing ready or unacked) or held for no one (``_held_for_no_one``), at least one so. A
    node never looked at, a look that failed, or ready messages leave it unexplained: what the
    harness could not establish stays unknown.
    """
    looks: dict[tuple[str, str | None], list[dict]] = {}
    pending: dict[tuple[str, str | None, str | None], int] = {}
    for r in sorted(depth_rows, key=lambda r: r["index"]):
        key = (r["process"], r.get("queue"), r.get("node"))
        if r.get("type") == "invoke":
            pending[key] = r["index"]
            continue
        if pending.pop(key, None) is None:
            continue
        v = _load_json(r.get("value")) if r.get("type") == "ok" else {}
        looks.setdefault((r["process"], r.get("queue")), []).append(
            {
                "index": r["index"],
                "time_ns": r["time_ns"],
                "node": r.get("node"),
                "ok": r.get("type") == "ok",
                "ready": _count(v.get("ready")),
                "unacked": _count(v.get("unacked")),
                "own_unacked": _count(v.get("own_unacked")),
                "clients": _count(v.get("clients")),
                "holders": v.get("holders") if isinstance(v.get("holders"), list) else None,
            }
        )
    last_op: dict[tuple[str, str | None], tuple[int, int, str, list[str]]] = {}
    invoked: dict[tuple[str, str | None], int] = {}
    for r in sorted(drain_rows, key=lambda r: r["index"]):
        op = (r["process"], r.get("queue"))
        if r.get("type") == "invoke":
            invoked[op] = r["index"]
            last_op[op] = (r["index"], NO_LIMIT_INDEX, "open", [])
        elif op in invoked:
            nodes = _load_json(r.get("value")).get("nodes")
            names = sorted(str(n) for n in nodes) if isinstance(nodes, dict) else []
            last_op[op] = (invoked.pop(op), r["index"], outcome_of(r.get("type")), names)
    out: list[StuckQueue] = []
    unfinished = explained = 0
    for (process, queue), (lo, hi, outcome, names) in sorted(last_op.items(), key=lambda kv: kv[1][0]):
        if outcome == "ok":
            continue
        unfinished += 1
        mine = [x for x in looks.get((process, queue), []) if lo < x["index"] < hi]
        found: list[StuckQueue] = []
        whole = bool(names)
        for node in names:
            at = [x for x in mine if x["node"] == node]
            last = at[-1] if at else None
            if last is None or not last["ok"]:
                whole = False
                continue
            if _held_for_no_one(last):
                run = []
                for x in reversed(at):
                    if not (x["ok"] and _held_for_no_one(x)):
                        break
                    run.append(x)
                found.append(
                    StuckQueue(
                        queue=queue,
                        node=node,
                        drainer=process,
                        unacked=last["unacked"] or 0,
                        ready=0,
                        since_ns=run[-1]["time_ns"],
                        last_ns=last["time_ns"],
                        looks=len(run),
                        holders=last["holders"],
                    )
                )
            elif not (last["ready"] == 0 and last["unacked"] == 0):
                whole = False
        out += found
        explained += whole and bool(found)
    return out, bool(out) and unfinished > 0 and explained == unfinished


@dataclass
class Context:
    """What an engine needs to know before its big pass: windows, drain, buckets, the model."""

    end_ns: int
    ops: int
    windows: list[FaultWindow]
    drain: Drain
    bucket_s: int
    history_schema: int
    params: Params
    spans: list[DrainSpan]
    notes: list[str]
    stuck: list[StuckQueue] = field(default_factory=list)
    stuck_drain: bool = False  # every unfinished drain was held up only by nodes in ``stuck``

    @property
    def drain_end_ns(self) -> int:
        """Where a lost message's exposure ends: the completed drain, else the history's end."""
        if self.drain["completed"] and self.drain["end_ns"] is not None:
            return self.drain["end_ns"]
        return self.end_ns

    @property
    def acks(self) -> bool:
        """Schema 2: consumption is an ack that completed ok; schema 1: a delivery."""
        return self.history_schema >= 2

    @property
    def check_bodies(self) -> bool:
        return self.acks and self.params.bodies_known


def make_context(
    ops: int, end_ns: int | None, small_rows: list[dict], scenario: dict | None, history_schema: int | None
) -> Context:
    """small_rows: every nemesis op and every drain op of the history.

    history_schema: the lowest ``schema`` of the history's records (None when it has none).
    """
    end = end_ns or 0
    version = SCHEMA_VERSION if history_schema is None else history_schema
    params = scenario_params(scenario)
    nem = [r for r in small_rows if r.get("process") == NEMESIS]
    drains = [r for r in small_rows if r.get("f") == "drain" and r.get("process") != NEMESIS]
    depths = [r for r in small_rows if r.get("f") == DEPTH and r.get("process") != NEMESIS]
    _, spans = drain_ops(drains)
    stuck, stuck_drain = stuck_queues(drains, depths)
    notes = []
    if version < 2:
        notes.append(
            f"schema-{version} history: acks were recorded ok when written, not once the broker had "
            "them, so a delivery counts as consumed; ack outcomes, abandons, resurrections, bodies and "
            "split-brain copies are not checked"
        )
        spans = []
    elif not params.bodies_known:
        notes.append("bodies not verified: the scenario gives no seed and workload.message_size")
    return Context(
        end_ns=end,
        ops=ops,
        windows=fault_windows(nem, end),
        drain=drain_status(drains),
        bucket_s=bucket_width_s(end),
        history_schema=version,
        params=params,
        spans=spans,
        notes=notes,
        stuck=stuck,
        stuck_drain=stuck_drain,
    )


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
    lost: list[dict]  # capped, by confirm index; MessageDetail-like dicts with a cause
    lost_by_cause: list[tuple[str, str | None, int]]
    ack_unknown: list[dict]  # capped, by confirm index
    unexpected: list[dict]  # capped, by first consumption index
    duplicated: list[dict]  # capped, by first delivery index
    recovered: list[dict]  # capped, by first consumption index
    resurrected: list[dict]  # capped, by first delivery after the ack
    corrupted: list[dict]  # capped, by first corrupted delivery
    split_brain: list[dict]  # capped, by ack index
    unflagged: list[dict]  # capped, by index
    undigested: int  # deliveries without a digest, when bodies are checked
    order_violations: list[dict]  # capped, by index
    attribution_rows: list[tuple[str, str | None, int]]
    exposure_rows: list[tuple[str, int, int]]
    confirm_us: tuple[int, dict[str, int | None]]
    e2e_us: tuple[int, dict[str, int | None]]
    availability: dict[str, tuple[int, int]]  # window id or "outside" -> (attempts, confirmed)
    timeline: list[tuple[int, str | None, str | None, int]]
    latency_timeline: list[tuple[int, int, int, int]]  # bucket, n, sum_us, max_us
    live: LiveFacts = field(default_factory=LiveFacts)
    extra: dict[str, Any] = field(default_factory=dict)
    positions: list[dict] = field(default_factory=list)  # ``_anomalies.lost_positions``
    stream: dict[str, Any] = field(default_factory=empty_findings)  # ``_anomalies.stream_findings``


def _delivery(x: dict) -> Delivery:
    return Delivery(
        index=x["index"],
        time_ns=x["time_ns"],
        node=x.get("node"),
        queue=x.get("queue"),
        process=x["process"],
        redelivered=x.get("redelivered"),
    )


def _detail(d: dict) -> MessageDetail:
    deliveries = sorted(d.get("deliveries") or [], key=lambda x: x["index"])[:DELIVERY_CAP]
    return MessageDetail(
        id=d["id"],
        attempts=int(d.get("attempts") or 0),
        outcome=d.get("outcome") or "none",
        first_invoke_ns=d.get("first_invoke_ns"),
        confirm_ns=d.get("confirm_ns"),
        confirm_node=d.get("confirm_node"),
        delivered=int(d.get("delivered") or 0),
        consumed=int(d.get("consumed") or 0),
        deliveries=[_delivery(x) for x in deliveries],
        cause=d.get("cause"),
        abandon_cause=d.get("abandon_cause"),
    )


def _resurrection(d: dict) -> Resurrection:
    a = d["ack"]
    return Resurrection(
        id=d["id"],
        ack_index=a["index"],
        ack_ns=a["time_ns"],
        ack_node=a.get("node"),
        ack_process=a["process"],
        deliveries_after=int(d["deliveries_after"]),
        delivery=_delivery(d["delivery"]),
    )


def _corruption(d: dict, params: Params) -> Corruption:
    x = d["delivery"]
    return Corruption(
        id=d["id"],
        deliveries=int(d["deliveries"]),
        delivery=_delivery(x),
        expected_digest=expected_digest(d["id"], params),
        digest=x["digest"],
        expected=expected_body(d["id"], params)[:EXCERPT_CHARS],
        received=json_field(x.get("detail"), "body"),
        received_length=json_int(x.get("detail"), "length"),
    )


def _split_brain(d: dict, spans: list[DrainSpan]) -> SplitBrainCopy:
    a = d["ack"]
    return SplitBrainCopy(
        id=d["id"],
        drainer=a["process"],
        queue=a.get("queue"),
        node=a.get("node"),
        ack_index=a["index"],
        ack_ns=a["time_ns"],
        empty=split_brain_nodes(spans, a["process"], a.get("queue"), a["index"], a["time_ns"], a.get("node")),
    )


def _unflagged(d: dict) -> UnflaggedRedelivery:
    return UnflaggedRedelivery(
        id=d["id"],
        delivery=_delivery(d),
        abandon_index=d["abandon_index"],
        abandon_cause=d.get("abandon_cause"),
    )


def _over(count: int, budget: int | None) -> bool:
    return budget is not None and count > budget


def held_text(stuck: list[StuckQueue]) -> str:
    """Where the stuck deliveries are, for a reason line: node, queue, count reported, since when."""
    return "; ".join(
        f"{q['node']} reported {q['unacked']:,} unacked on {q['queue']} from {q['since_ns'] / NS_PER_S:.1f} s "
        f"to {q['last_ns'] / NS_PER_S:.1f} s with no client connection of the harness open"
        for q in stuck
    )


def _verdict(
    counts: Counts,
    drain: Drain,
    budgets: Budgets,
    live: Liveness,
    stuck: list[StuckQueue] | None = None,
    integrity: list[str] | None = None,
) -> tuple[Any, Any, str]:
    """LOST (lost after a finished drain, or stuck) and INTEGRITY first, then the budgets (certain
    even when the drain is not), then a queue that never came back or came back over its recovery
    budget, then unknown. A safety verdict says the liveness finding beside it. ``integrity``: the
    stream classes that make a run INTEGRITY (``_anomalies.integrity_findings``)."""
    lost, unexpected, corrupted = counts["lost"], counts["unexpected"], counts["corrupted"]
    unreachable = counts["unreachable"]
    down = [describe_unavailable(u, unreachable if i == 0 else 0) for i, u in enumerate(live["unavailable"])]
    named = {(u["fault_id"], u["queue"]) for u in live["unavailable"]}
    down += [
        describe_overrun(r)
        for r in live["recovery"]
        if r["over_budget"] and (r["fault_id"], r["queue"]) not in named
    ]
    also = (
        f"; also unavailable: {down[0]}" + (f" (and {len(down) - 1} more)" if len(down) > 1 else "")
        if down
        else ""
    )
    bad = [f"{unexpected:,} consumed but never attempted"] if unexpected else []
    bad += [f"{corrupted:,} delivered with a body other than the one sent"] if corrupted else []
    bad += integrity or []
    extra = f" (and {'; '.join(bad)})" if bad else ""
    if lost and drain["completed"]:
        return False, "LOST", f"{lost:,} confirmed messages never consumed after the final drain{extra}{also}"
    if counts["stuck"]:
        return (
            False,
            "LOST",
            f"{counts['stuck']:,} confirmed messages {STUCK_CAUSE}: {held_text(stuck or [])}{extra}{also}",
        )
    if bad:
        return False, "INTEGRITY", ("messages: " if unexpected or corrupted else "") + "; ".join(bad) + also
    for name, verdict, what in (
        ("resurrected", "RESURRECTED", "delivered again after an ack of them completed ok"),
        ("duplicated", "DUPLICATED", "consumed (acked ok) more than once"),
    ):
        budget, count = budgets[name], counts[name]  # type: ignore[literal-required]
        if _over(count, budget):
            return False, verdict, f"{count:,} {name} messages ({what}), over the budget of {budget:,}{also}"
    if down:
        more = f" (and {len(down) - 1} more)" if len(down) > 1 else ""
        return False, "UNAVAILABLE", down[0] + more
    if unreachable:
        why = "no drain was recorded" if drain["invoked"] == 0 else "the final drain did not complete"
        return (
            "unknown",
            "unknown",
            f"{unreachable:,} confirmed messages unconsumed (unreachable, not known lost), but {why} "
            "although every queue answered after the last heal",
        )
    confirmed, unknown_acks = counts["confirmed"], counts["ack_unknown"]
    if unknown_acks:
        return (
            True,
            "durable",
            (
                f"{confirmed - unknown_acks:,} of {confirmed:,} confirmed messages consumed; "
                f"the other {unknown_acks:,} were acked with an unknown outcome"
            ),
        )
    return True, "durable", f"every one of {confirmed:,} confirmed messages was consumed"


COUNT_KEYS = (
    "attempted",
    "confirmed",
    "failed",
    "unknown",
    "publish_attempts",
    "delivered_unique",
    "delivered_total",
    "consumed_unique",
    "consumed_total",
    "dead_lettered",
    "abandoned",
    "lost",
    "stuck",
    "ack_unknown",
    "unexpected",
    "corrupted",
    "duplicated",
    "resurrected",
    "recovered",
    "split_brain",
    "unflagged_redeliveries",
    "order_violations",
)


def _counts(ctx: Context, c: dict[str, int]) -> Counts:
    """The engine's counts. What the engines found missing (confirmed, never consumed) is lost
    after a completed drain; stuck when the drain was held up only by stuck deliveries; otherwise
    unreachable (behind a queue that did not answer)."""
    missing = int(c["lost"])
    out = {k: int(c[k]) for k in COUNT_KEYS if k != "stuck"}
    out["lost"] = out["stuck"] = out["unreachable"] = 0
    if ctx.stuck_drain:
        out["stuck"] = missing
    elif ctx.drain["completed"]:
        out["lost"] = missing
    else:
        out["unreachable"] = missing
    counts = {k: out[k] for k in COUNT_KEYS} | {"unreachable": out["unreachable"], "history_ops": ctx.ops}
    return Counts(**counts)  # type: ignore[typeddict-item]


def live_of(ctx: Context, live: LiveFacts) -> Liveness:
    return liveness(
        live,
        windows=ctx.windows,
        drain_ops=ctx.drain["ops"],
        end_ns=ctx.end_ns,
        budgets=ctx.params.budgets,
        threshold_ns=UNAVAILABLE_S * NS_PER_S,
    )


def _exposure(rows: list[tuple[str, int, int]]) -> list[ExposureRow]:
    return [ExposureRow(fault_kind=k, confirmed=n, lost=lost) for k, n, lost in sorted(rows)]


def summarize(
    engine: str,
    ctx: Context,
    counts: dict[str, int],
    exposure_rows: list[tuple[str, int, int]],
    live: LiveFacts,
    positions: list[dict] | None = None,
    stream: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What grading reads of a run's results (verdict, validity, reason, counts, drain, exposure per
    fault kind, liveness, anomalies), computed as ``assemble`` computes them: for a job that checks
    many runs at once."""
    c = _counts(ctx, counts)
    lv = live_of(ctx, live)
    anomalies = anomalies_of(c["lost"], positions or [], stream or empty_findings())
    valid, verdict, reason = _verdict(
        c, ctx.drain, ctx.params.budgets, lv, ctx.stuck, integrity_findings(anomalies)
    )
    return {
        "engine": engine,
        "valid": valid,
        "verdict": verdict,
        "reason": reason,
        "counts": c,
        "drain": ctx.drain,
        "attribution": {"exposure": _exposure(exposure_rows)},
        "faults": ctx.windows,
        "liveness": lv,
        "anomalies": anomalies,
    }


def assemble(engine: str, ctx: Context, facts: Facts) -> Results:
    """Build the results dict identically for both engines."""
    counts = _counts(ctx, facts.counts)
    budgets = ctx.params.budgets
    live = live_of(ctx, facts.live)
    anomalies = anomalies_of(counts["lost"], facts.positions, facts.stream)
    valid, verdict, reason = _verdict(
        counts, ctx.drain, budgets, live, ctx.stuck, integrity_findings(anomalies)
    )
    notes = list(ctx.notes)
    if ctx.check_bodies and facts.undigested:
        notes.append(
            f"{facts.undigested:,} of {counts['delivered_total']:,} deliveries carry no body digest "
            "and were not verified"
        )
    lost_detail = [_detail(d) for d in facts.lost]
    stuck = ctx.stuck_drain  # what the engines found missing is stuck, not lost (``_counts``)
    drain_end = ctx.drain_end_ns
    messages: list[LostAttribution] = []
    for d in lost_detail:
        confirm = d["confirm_ns"] if d["confirm_ns"] is not None else 0
        ws = overlapping(ctx.windows, confirm, drain_end)
        messages.append(
            LostAttribution(
                id=d["id"],
                confirm_node=d["confirm_node"],
                confirm_ns=confirm,
                fault_ids=[w["fault_id"] for w in ws],
                fault_kinds=kinds_for(ctx.windows, confirm, drain_end),
            )
        )
    kind_of = {w["fault_id"]: w["kind"] for w in ctx.windows}
    availability = []
    for wid in [w["fault_id"] for w in ctx.windows] + ["outside"]:
        attempts, confirmed = facts.availability.get(wid, (0, 0))
        availability.append(
            {
                "window": wid,
                "kind": kind_of.get(wid),
                "attempts": attempts,
                "confirmed": confirmed,
                "share": (confirmed / attempts) if attempts else None,
            }
        )
    return Results(
        schema=SCHEMA_VERSION,
        engine=engine,  # type: ignore[typeddict-item]
        history_schema=ctx.history_schema,
        valid=valid,
        verdict=verdict,
        reason=reason,
        notes=notes,
        budgets=budgets,
        counts=counts,
        lost=[] if stuck else [d["id"] for d in lost_detail],
        lost_truncated=counts["lost"] + counts["unreachable"] > len(lost_detail),
        lost_detail=[] if stuck else lost_detail,
        lost_by_cause=[]
        if stuck
        else [
            LostCauseRow(cause=k, abandon_cause=a, count=n)  # type: ignore[typeddict-item]
            for k, a, n in sorted(facts.lost_by_cause, key=lambda r: (r[0], r[1] or ""))
        ],
        stuck=ctx.stuck,
        stuck_detail=[{**d, "cause": STUCK_CAUSE, "abandon_cause": None} for d in lost_detail]
        if stuck
        else [],
        ack_unknown=[_detail(d) for d in facts.ack_unknown],
        unexpected=[d["id"] for d in facts.unexpected],
        unexpected_truncated=counts["unexpected"] > len(facts.unexpected),
        unexpected_detail=[_detail(d) for d in facts.unexpected],
        corrupted=[_corruption(d, ctx.params) for d in facts.corrupted],
        duplicated=[_detail(d) for d in facts.duplicated],
        resurrected=[_resurrection(d) for d in facts.resurrected],
        recovered=[_detail(d) for d in facts.recovered],
        split_brain=[_split_brain(d, ctx.spans) for d in facts.split_brain],
        unflagged_redeliveries=[_unflagged(d) for d in facts.unflagged],
        order_violations=sorted(facts.order_violations, key=lambda v: v["index"]),  # type: ignore[arg-type]
        attribution={
            "drain_end_ns": drain_end,
            "rows": [
                AttributionRow(fault_kind=k, node=n, count=cnt)
                for k, n, cnt in sorted(facts.attribution_rows, key=lambda r: (r[0], r[1] or ""))
            ],
            "exposure": _exposure(facts.exposure_rows),
            "messages": messages,
        },
        latency={"confirm_ms": percentiles_ms(*facts.confirm_us), "e2e_ms": percentiles_ms(*facts.e2e_us)},
        availability=availability,  # type: ignore[typeddict-item]
        timeline={
            "bucket_s": ctx.bucket_s,
            "rows": [
                {"t_s": t, "f": f, "type": ty, "count": n}  # type: ignore[typeddict-item]
                for t, f, ty, n in sorted(facts.timeline, key=lambda r: (r[0], r[1] or "", r[2] or ""))
            ],
            "latency": [
                {"t_s": t, "n": n, "mean_ms": round(s / n / 1000, 3), "max_ms": mx / 1000}
                for t, n, s, mx in sorted(facts.latency_timeline)
            ],
        },
        faults=ctx.windows,
        drain=ctx.drain,
        liveness=live,
        anomalies=anomalies,
        end_ns=ctx.end_ns,
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


def history_path(run_dir: Path, *, allow_jsonl: bool = True) -> Path:
    """Find the history, or say in one line what is missing."""
    found = history_file(run_dir, allow_jsonl=allow_jsonl)
    if found is not None:
        return found
    want = f"{HISTORY_PARQUET} or {HISTORY_JSONL}" if allow_jsonl else HISTORY_PARQUET
    raise HistoryError(f"no {want} in {run_dir}: pass a run directory (store/<scenario>/<timestamp>)")
