"""The verdict, the counts and the final assembly of the results, the same from either engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.spec.results import (
    MISSING_CLASSES,
    SCHEMA_VERSION,
    STUCK_CAUSE,
    UNAVAILABLE_S,
    AttributionRow,
    Corruption,
    Counts,
    Delivery,
    Drain,
    ExposureRow,
    Liveness,
    LostAttribution,
    LostCauseRow,
    MessageDetail,
    MissingClass,
    Results,
    Resurrection,
    SplitBrainCopy,
    StuckQueue,
    UnflaggedRedelivery,
)
from spark_reports.engines.anomalies import anomalies_of, empty_findings, integrity_findings
from spark_reports.engines.common import DELIVERY_CAP, json_field, json_int, percentiles_ms
from spark_reports.engines.context import Context
from spark_reports.engines.drain import DrainSpan, held_text, split_brain_nodes
from spark_reports.engines.final_heal import describe_down
from spark_reports.engines.liveness import (
    NS_PER_S,
    LiveFacts,
    describe_overrun,
    describe_unavailable,
    liveness,
)
from spark_reports.engines.params import EXCERPT_CHARS, Params, expected_body, expected_digest
from spark_reports.engines.windows import kinds_for, overlapping


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
    # What follows counts the missing (confirmed, never consumed): ``missing_class`` says which class.
    attribution_rows: list[tuple[str, str | None, int]]  # (fault kind, confirming node, missing)
    exposure_rows: list[tuple[str, int, int]]  # (fault kind, confirmed, missing)
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


def _unavailable(unreachable: int, drain: Drain, live: Liveness) -> tuple[list[str], list[str]]:
    """The nodes that did not come back at the final heal (``gone``), then every liveness finding
    (``down``: those nodes, the queues that never came back, the recoveries over their budget)."""
    gone = [describe_down(live["nodes_down"])] if live["nodes_down"] else []
    if gone and unreachable and not live["unavailable"]:
        where = ", ".join(live["serving"] or [])
        why = (
            "not on the nodes that came back"
            if drain["completed"]
            else f"the drain through {where} did not complete"
        )
        gone[0] += f"; {unreachable:,} confirmed messages unreachable ({why})"
    down = gone + [
        describe_unavailable(u, unreachable if i == 0 else 0) for i, u in enumerate(live["unavailable"])
    ]
    named = {(u["fault_id"], u["queue"]) for u in live["unavailable"]}
    down += [
        describe_overrun(r)
        for r in live["recovery"]
        if r["over_budget"] and (r["fault_id"], r["queue"]) not in named
    ]
    return gone, down


def _also(down: list[str]) -> str:
    """The first liveness finding, said beside a safety verdict."""
    if not down:
        return ""
    return f"; also unavailable: {down[0]}" + (f" (and {len(down) - 1} more)" if len(down) > 1 else "")


def _verdict(
    counts: Counts,
    drain: Drain,
    params: Params,
    live: Liveness,
    stuck: list[StuckQueue] | None = None,
    integrity: list[str] | None = None,
) -> tuple[Any, Any, str]:
    """LOST (lost after a finished drain, or stuck) and INTEGRITY first, then the budgets (certain
    even when the drain is not), then ``unknown`` when no node that serves clients came back at the
    final heal (nothing was drained), then a node that did not come back at the final heal, a queue
    that never came back or came back over its recovery budget, then unknown. A safety verdict says
    the liveness finding beside it. ``integrity``: the stream classes that make a run INTEGRITY
    (``_anomalies.integrity_findings``)."""
    lost, unexpected, corrupted = counts["lost"], counts["unexpected"], counts["corrupted"]
    unreachable = counts["unreachable"]
    gone, down = _unavailable(unreachable, drain, live)
    also = _also(down)
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
    if counts["dead_lettered"] and not params.dead_letter:
        return (
            False,
            "DEAD_LETTERED",
            (
                f"{counts['dead_lettered']:,} messages consumed from a dead-letter queue the broker moved them to, "
                f"where the scenario expects no dead-lettering (workload.dead_letter is off){also}"
            ),
        )
    budgets = params.budgets
    for name, verdict, what in (
        ("resurrected", "RESURRECTED", "delivered again after an ack of them completed ok"),
        ("duplicated", "DUPLICATED", "consumed (acked ok) more than once"),
    ):
        budget, count = budgets[name], counts[name]  # type: ignore[literal-required]
        if _over(count, budget):
            return False, verdict, f"{count:,} {name} messages ({what}), over the budget of {budget:,}{also}"
    if gone and live["serving"] == []:
        return (
            "unknown",
            "unknown",
            f"no node that serves clients came back, so nothing was drained and what the broker kept is "
            f"not known: {gone[0]}",
        )
    if down:
        shown = 1 + len(gone)  # the nodes that did not come back, then the first queue
        more = f" (and {len(down) - shown} more)" if len(down) > shown else ""
        return False, "UNAVAILABLE", "; ".join(down[:shown]) + more
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


#: The classes a message id can fall in that both engines count and list, in the counts' order.
LISTED = (
    "lost",
    "ack_unknown",
    "unexpected",
    "corrupted",
    "duplicated",
    "resurrected",
    "recovered",
    "split_brain",
)
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
    "stuck",  # counted from the holders after the drain, not per id
    *LISTED[1:],
    "unflagged_redeliveries",
    "order_violations",
)


def missing_class(ctx: Context) -> MissingClass:
    """The class of what the engines found missing (confirmed, never consumed): lost after a
    completed drain; stuck when the drain was held up only by stuck deliveries; otherwise
    unreachable (behind a queue that did not answer, or on a node that did not come back where
    nodes hold disjoint messages: ``Context.down_holds``). The counts, the attribution rows, the
    exposure per fault kind and the attributed messages all take it from here."""
    if ctx.stuck_drain:
        return "stuck"
    if ctx.drain["completed"] and not ctx.down_holds:
        return "lost"
    return "unreachable"


def _counts(ctx: Context, c: dict[str, int]) -> Counts:
    """The engine's counts, what they found missing (their ``lost``) under its class."""
    out = {k: int(c[k]) for k in COUNT_KEYS if k != "stuck"}
    out["lost"] = out["stuck"] = out["unreachable"] = 0
    out[missing_class(ctx)] = int(c["lost"])
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
        consumers=ctx.params.consumers,
        down=ctx.down,
        serving=ctx.serving,
    )


def _exposure(rows: list[tuple[str, int, int]], cls: MissingClass) -> list[ExposureRow]:
    """Per fault kind, the confirmed messages exposed to it and the missing ones, under their class."""
    out = []
    for k, n, missing in sorted(rows):
        by = {c: missing if c == cls else 0 for c in MISSING_CLASSES}
        out.append(
            ExposureRow(
                fault_kind=k, confirmed=n, lost=by["lost"], unreachable=by["unreachable"], stuck=by["stuck"]
            )
        )
    return out


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
    valid, verdict, reason = _verdict(c, ctx.drain, ctx.params, lv, ctx.stuck, integrity_findings(anomalies))
    return {
        "engine": engine,
        "valid": valid,
        "verdict": verdict,
        "reason": reason,
        "counts": c,
        "drain": ctx.drain,
        "attribution": {"exposure": _exposure(exposure_rows, missing_class(ctx))},
        "faults": ctx.windows,
        "liveness": lv,
        "anomalies": anomalies,
    }


def _attributed(ctx: Context, lost_detail: list[MessageDetail]) -> list[LostAttribution]:
    """Each missing message (capped) tied to the fault windows from its confirm to the drain's end."""
    messages: list[LostAttribution] = []
    for d in lost_detail:
        confirm = d["confirm_ns"] if d["confirm_ns"] is not None else 0
        ws = overlapping(ctx.windows, confirm, ctx.drain_end_ns)
        messages.append(
            LostAttribution(
                id=d["id"],
                confirm_node=d["confirm_node"],
                confirm_ns=confirm,
                fault_ids=[w["fault_id"] for w in ws],
                fault_kinds=kinds_for(ctx.windows, confirm, ctx.drain_end_ns),
                status=missing_class(ctx),
            )
        )
    return messages


def _availability(ctx: Context, facts: Facts) -> list[dict[str, Any]]:
    """The share of publishes confirmed in each fault window, and outside them."""
    kind_of = {w["fault_id"]: w["kind"] for w in ctx.windows}
    out = []
    for wid in [w["fault_id"] for w in ctx.windows] + ["outside"]:
        attempts, confirmed = facts.availability.get(wid, (0, 0))
        out.append(
            {
                "window": wid,
                "kind": kind_of.get(wid),
                "attempts": attempts,
                "confirmed": confirmed,
                "share": (confirmed / attempts) if attempts else None,
            }
        )
    return out


def _timeline(ctx: Context, facts: Facts) -> Any:
    return {
        "bucket_s": ctx.bucket_s,
        "rows": [
            {"t_s": t, "f": f, "type": ty, "count": n}
            for t, f, ty, n in sorted(facts.timeline, key=lambda r: (r[0], r[1] or "", r[2] or ""))
        ],
        "latency": [
            {"t_s": t, "n": n, "mean_ms": round(s / n / 1000, 3), "max_ms": mx / 1000}
            for t, n, s, mx in sorted(facts.latency_timeline)
        ],
    }


def assemble(engine: str, ctx: Context, facts: Facts) -> Results:
    """Build the results dict identically for both engines."""
    counts = _counts(ctx, facts.counts)
    budgets = ctx.params.budgets
    live = live_of(ctx, facts.live)
    anomalies = anomalies_of(counts["lost"], facts.positions, facts.stream)
    valid, verdict, reason = _verdict(
        counts, ctx.drain, ctx.params, live, ctx.stuck, integrity_findings(anomalies)
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
                AttributionRow(fault_kind=k, node=n, status=missing_class(ctx), count=cnt)
                for k, n, cnt in sorted(facts.attribution_rows, key=lambda r: (r[0], r[1] or ""))
            ],
            "exposure": _exposure(facts.exposure_rows, missing_class(ctx)),
            "messages": _attributed(ctx, lost_detail),
        },
        latency={"confirm_ms": percentiles_ms(*facts.confirm_us), "e2e_ms": percentiles_ms(*facts.e2e_us)},
        availability=_availability(ctx, facts),  # type: ignore[typeddict-item]
        timeline=_timeline(ctx, facts),
        faults=ctx.windows,
        drain=ctx.drain,
        liveness=live,
        anomalies=anomalies,
        end_ns=ctx.end_ns,
    )
