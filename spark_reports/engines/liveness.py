"""Liveness from the few figures each engine computes: did every queue come back after each
fault, how long it took, and when nothing worked.

An engine reduces the history to ``LiveFacts`` (per queue, kind and node: how many ok ops,
the first and last, and the first at or after each heal; the gaps between consecutive ok ops
longer than the threshold; per queue the publish span). Everything else (recovery per fault
step, unavailable windows and the fault windows they overlap, shares, the queues that never
came back) is built here once, so the two engines cannot drift on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.spec.results import (
    Budgets,
    DrainOp,
    FaultWindow,
    LiveKind,
    Liveness,
    NodeDown,
    NodeRecovery,
    QueueLiveness,
    Recovery,
    StrandedGroup,
    UnavailableQueue,
    UnavailableWindow,
)

KINDS: tuple[LiveKind, ...] = ("publish", "consume")
NS_PER_S = 1_000_000_000

NodeKey = tuple[str, str, str | None]
"""(queue, kind, node) of ok ops."""


@dataclass
class NodeOks:
    """The ok ops of one kind on one queue through one node."""

    count: int
    first_ns: int
    last_ns: int
    after_heal: list[int | None]  # per fault window (``Context.windows``): first ok at or after its heal
    before_heal: list[int | None]  # and the last ok before it


@dataclass
class LiveFacts:
    """What an engine computes for liveness (exactly; both engines agree on every field)."""

    oks: dict[NodeKey, NodeOks] = field(default_factory=dict)
    gaps: list[tuple[str, str, int, int]] = field(default_factory=list)  # queue, kind, ok, next ok
    # queue -> (first publish invoke, last publish record of any type, last publish invoke)
    publish: dict[str, tuple[int | None, int, int | None]] = field(default_factory=dict)
    #: queue -> the last consume ok at or before its last publish record (``publish``'s second
    #: time), where there is one: whether consume was served in a stretch that ends with the
    #: publish span, however short (``_Live.served``)
    consume_by_publish_end: dict[str, int] = field(default_factory=dict)
    #: messages first acked by the drain (``Context.drain_reads``), by queue, drain node and the
    #: second they were confirmed in: (queue, node, second, count, first confirm, last confirm,
    #: last read, longest confirm-to-read wait); ``stranded_groups`` keeps those that sat while
    #: the workload ran.
    stranded: list[StrandedBucket] = field(default_factory=list)


StrandedBucket = tuple[str | None, str | None, int, int, int, int, int, int]


def stranded_groups(facts: LiveFacts, threshold_ns: int) -> list[StrandedGroup]:
    """Per queue and drain node, the messages the drain read first that were confirmed (whole
    seconds, ``LiveFacts.stranded``) at least ``threshold_ns`` before their queue's last publish:
    consumers were reading the queue elsewhere while these sat. The tail the workload's end left
    unread (confirmed within the threshold of the last publish) is no finding."""
    out: dict[tuple[str | None, str | None], StrandedGroup] = {}
    for q, node, second, n, c_from, c_to, read_to, wait in sorted(facts.stranded, key=lambda b: b[:3]):
        pub = facts.publish.get(q) if q is not None else None
        if pub is None or (second + 1) * NS_PER_S + threshold_ns > pub[1]:
            continue
        g = out.get((q, node))
        if g is None:
            out[(q, node)] = StrandedGroup(
                queue=q,
                node=node,
                count=n,
                confirmed_from_ns=c_from,
                confirmed_to_ns=c_to,
                read_to_ns=read_to,
                wait_max_ns=wait,
            )
            continue
        g["count"] += n
        g["confirmed_from_ns"] = min(g["confirmed_from_ns"], c_from)
        g["confirmed_to_ns"] = max(g["confirmed_to_ns"], c_to)
        g["read_to_ns"] = max(g["read_to_ns"], read_to)
        g["wait_max_ns"] = max(g["wait_max_ns"], wait)
    return [out[k] for k in sorted(out, key=lambda k: (k[0] or "", k[1] or ""))]


def heal_times(windows: list[FaultWindow]) -> list[int | None]:
    """Per fault window, the time its heal began (None: never healed)."""
    return [w["heal_start_ns"] if w["healed"] else None for w in windows]


def recovery_budget(budgets: Budgets, kind: str) -> float | None:
    raw = budgets.get("recovery_s")
    if isinstance(raw, dict):
        return raw.get(kind)
    return raw


def _min(values: list[int | None]) -> int | None:
    got = [v for v in values if v is not None]
    return min(got) if got else None


def _max(values: list[int | None]) -> int | None:
    got = [v for v in values if v is not None]
    return max(got) if got else None


@dataclass(frozen=True)
class _Agg:
    """One queue and kind over every node."""

    count: int
    first: int | None
    last: int | None
    after: list[int | None]  # per fault window: the first ok at or after its heal
    before: list[int | None]  # and the last ok before it


def _since(t: int | None, h: int | None) -> int | None:
    return None if t is None or h is None else t - h


def _overlapping(windows: list[FaultWindow], a: int, b: int) -> list[str]:
    return [w["fault_id"] for w in windows if w["start_ns"] <= b and w["end_ns"] >= a]


Gone = dict[str, tuple[list[LiveKind], int, FaultWindow | None]]
"""Per queue that never came back: the kinds that did not, since when, and the fault step before."""


def liveness(
    facts: LiveFacts,
    *,
    windows: list[FaultWindow],
    drain_ops: list[DrainOp],
    end_ns: int,
    budgets: Budgets,
    threshold_ns: int,
    consumers: bool = True,
    down: list[NodeDown] | None = None,
    serving: list[str] | None = None,
) -> Liveness:
    """``consumers``: the workload had consumers; without them (a backlog left to the drain) no
    consume is asked of a queue while the workload runs: no consume window, no consume demand.
    ``down``, ``serving``: the final heal's outcome (``final_heal.nodes_down``), kept as it is."""
    live = _Live(facts, windows, drain_ops, threshold_ns)
    asked: tuple[LiveKind, ...] = KINDS if consumers else ("publish",)
    queue_rows: list[QueueLiveness] = []
    out_windows: list[UnavailableWindow] = []
    for q in live.queues:
        start, ends = live.span(q, end_ns)
        for k in asked:
            row, found = live.queue_kind(q, k, start, ends[k])
            queue_rows.append(row)
            out_windows += found
    recovery = [
        _recovery(
            facts,
            w,
            i,
            live.heals[i],
            q,
            live.per_queue[q],
            live.drains.get(q, []),
            budget,
            threshold_ns,
            consumers,
        )
        for i, w in enumerate(windows)
        for budget in (recovery_budget(budgets, w["kind"]),)
        for q in live.queues
    ]
    span_ends: dict[tuple[str, str], int] = {(x["queue"], x["kind"]): x["span_end_ns"] for x in queue_rows}
    gone = live.gone_after_last_heal(recovery, span_ends, queue_rows)
    live.gone_at_span_end(out_windows, gone)
    longest = max((x["duration_ns"] for x in out_windows), default=0)
    spans = sum(x["span_end_ns"] - x["span_start_ns"] for x in queue_rows)
    down_all = sum(x["unavailable_ns"] for x in queue_rows)
    return Liveness(
        threshold_ns=threshold_ns,
        recovery=recovery,
        windows=sorted(out_windows, key=lambda x: (x["start_ns"], x["queue"], x["kind"], x["end_ns"])),
        queues=queue_rows,
        longest_outage_ns=longest,
        available_share=(1 - down_all / spans) if spans > 0 else None,
        unavailable=[live.unavailable(q, *g) for q, g in sorted(gone.items())],
        over_budget=[f"{r['fault_id']} {r['queue']}" for r in recovery if r["over_budget"]],
        stranded=stranded_groups(facts, threshold_ns) if consumers else [],
        nodes_down=list(down or []),
        serving=serving,
    )


class _Live:
    """One liveness computation: the facts by queue and kind, and the questions asked of them."""

    def __init__(
        self, facts: LiveFacts, windows: list[FaultWindow], drain_ops: list[DrainOp], threshold_ns: int
    ) -> None:
        self.facts, self.windows, self.threshold_ns = facts, windows, threshold_ns
        self.heals = heal_times(windows)
        self.queues = sorted({q for q, _k, _n in facts.oks} | set(facts.publish))
        self.drains: dict[str, list[DrainOp]] = {}
        for op in drain_ops:
            if op["queue"] is not None:
                self.drains.setdefault(op["queue"], []).append(op)
        self.per_queue: dict[str, dict[str, _Agg]] = {
            q: {k: self._agg(q, k) for k in KINDS} for q in self.queues
        }

    def _agg(self, q: str, k: str) -> _Agg:
        rows = [v for (qq, kk, _n), v in self.facts.oks.items() if qq == q and kk == k]
        after = [_min([r.after_heal[i] for r in rows]) for i in range(len(self.windows))]
        before = [_max([r.before_heal[i] for r in rows]) for i in range(len(self.windows))]
        if not rows:
            return _Agg(0, None, None, after, before)
        return _Agg(
            sum(r.count for r in rows),
            min(r.first_ns for r in rows),
            max(r.last_ns for r in rows),
            after,
            before,
        )

    def span(self, q: str, end_ns: int) -> tuple[int, dict[str, int | None]]:
        """When queue ``q``'s life starts, and when each kind's ends."""
        per = self.per_queue[q]
        first_inv, last_pub, _last_inv = self.facts.publish.get(q, (None, 0, None))
        firsts = [a.first for a in per.values() if a.first is not None]
        start = first_inv if first_inv is not None else min(firsts) if firsts else end_ns
        ops = self.drains.get(q, [])
        drain_ends = [op["end_ns"] for op in ops if op["end_ns"] is not None]
        last_publish = last_pub if q in self.facts.publish else per["publish"].last
        if ops and answered(ops[-1]):
            # The drain emptied the queue: past the last publish and the last consume nothing was
            # left to consume, and an idle queue is not an unavailable one (a queue the cluster
            # says does not exist is no idle queue: its consume span runs to the drain's end).
            consume_end = max(
                [x for x in (last_publish, per["consume"].last) if x is not None], default=start
            )
        else:
            consume_end = max(drain_ends) if drain_ends else end_ns
        return start, {"publish": last_publish, "consume": consume_end}

    def queue_kind(
        self, q: str, k: LiveKind, start: int, stop: int | None
    ) -> tuple[QueueLiveness, list[UnavailableWindow]]:
        """One kind of one queue over its span: its row, and the windows it was unavailable."""
        count, first, last = self.per_queue[q][k].count, self.per_queue[q][k].first, self.per_queue[q][k].last
        span_end = max(stop if stop is not None else start, start)
        found: list[tuple[int, int, bool]] = [
            (a, b, True) for qq, kk, a, b in self.facts.gaps if qq == q and kk == k
        ]
        if first is None or last is None:
            found.append((start, span_end, False))
        else:
            found.append((start, first, True))
            found.append((last, span_end, False))
        if k == "consume" and q in self.facts.publish:
            # After the workload (settle, then the drain) no consume is asked of the queue: a wait
            # that the drain's first consume ends counts only up to the workload's end.
            last_pub = self.facts.publish[q][1]
            found = [(a, min(b, last_pub) if by_ok else b, by_ok) for a, b, by_ok in found]
            found = [(a, b, by_ok) for a, b, by_ok in found if not by_ok or a < last_pub]
        ws = sorted({(a, b, by_ok) for a, b, by_ok in found if b - a > self.threshold_ns})
        out = [
            UnavailableWindow(
                queue=q,
                kind=k,
                start_ns=a,
                end_ns=b,
                duration_ns=b - a,
                ended_by_ok=by_ok,
                fault_ids=_overlapping(self.windows, a, b),
            )
            for a, b, by_ok in ws
        ]
        down = sum(b - a for a, b, _ in ws)
        span = span_end - start
        row = QueueLiveness(
            queue=q,
            kind=k,
            span_start_ns=start,
            span_end_ns=span_end,
            ok=count,
            first_ok_ns=first,
            last_ok_ns=last,
            unavailable_ns=down,
            available_share=(1 - down / span) if span > 0 else None,
            longest_ns=max((b - a for a, b, _ in ws), default=0),
        )
        return row, out

    def served(self, q: str, k: str, a: int, b: int) -> bool:
        """Whether kind ``k`` of queue ``q`` had an ok op from ``a`` to ``b``, ``b`` the other kind's
        span end: whether its last ok at or before ``b`` is at or after ``a``. That is its last ok
        when ``b`` is past it; consume's last at or before the publish span's end is a fact of its
        own (``LiveFacts.consume_by_publish_end``). Otherwise (publish oks after a drain that ended
        before them, never in a history the harness writes) the gaps longer than the threshold
        decide: no ok between two oks less than the threshold apart is seen."""
        agg = self.per_queue[q][k]
        last = agg.last
        if last is None or last <= b:
            return last is not None and last >= a
        pub = self.facts.publish.get(q)
        if k == "consume" and pub is not None and b == pub[1]:
            at = self.facts.consume_by_publish_end.get(q)
            return at is not None and at >= a
        if agg.first is None or agg.first > b:
            return False
        return not any(qq == q and kk == k and ga < a and gb > b for qq, kk, ga, gb in self.facts.gaps)

    def answered_later(self, q: str, k: str, a: int, b: int) -> bool:
        """Whether kind ``k``'s failures from ``a`` to ``b`` are explained by the whole queue being
        down then, and the queue answered another kind after ``b``: producers that stopped with the
        workload while a restarted node was still booting were never seen failing on a queue that
        was back, so publish cannot be said never to have come back. A drain that completed after
        ``b`` is such an answer too, even when it read nothing (every node reported the queue
        empty), but not one that completed because every node said the queue does not exist
        (``DrainOp.gone``: the queue is gone, not back). A kind failing while another kind is
        served is a partial outage of its own and stays; served counts from the last heal that
        began inside the window (before it, the fault explains the failures, and the consumers
        finishing what was confirmed before it answer nothing), and only past the outage threshold
        (a delivery of the last confirmed publish a moment after it is not another kind served)."""
        others = [j for j in KINDS if j != k]
        since = max((h for h in self.heals if h is not None and a <= h <= b), default=a)
        quiet = not any(self.served(q, j, since + self.threshold_ns, b) for j in others)
        ops = self.drains.get(q, [])
        drained = bool(ops) and answered(ops[-1]) and (ops[-1]["end_ns"] or -1) > b
        return quiet and (drained or any((self.per_queue[q][j].last or -1) > b for j in others))

    def gone_after_last_heal(
        self, recovery: list[Recovery], span_ends: dict[tuple[str, str], int], rows: list[QueueLiveness]
    ) -> Gone:
        """The queues not recovered after the last heal (a kind another one's answer explains aside)."""
        healed = [(h, i) for i, h in enumerate(self.heals) if h is not None]
        gone: Gone = {}
        if not healed:
            return gone
        last_heal, li = max(healed, key=lambda x: (x[0], -x[1]))
        for r in recovery:
            if r["fault_id"] != self.windows[li]["fault_id"] or r["recovered"]:
                continue
            q = r["queue"]
            missing: list[LiveKind] = []
            if r["publish_demand"] and r["publish_ok_ns"] is None:
                missing.append("publish")
            if r["consume_demand"] and r["consume_ok_ns"] is None:
                missing.append("consume")
            missing = [k for k in missing if not self.answered_later(q, k, last_heal, span_ends[(q, k)])]
            if not missing:
                continue
            lasts = [x for x in (self.per_queue[q][k].last for k in missing) if x is not None]
            start = next(x for x in rows if x["queue"] == q)["span_start_ns"]
            gone[q] = (missing, max(lasts) if lasts else start, self.windows[li])
        return gone

    def gone_at_span_end(self, out_windows: list[UnavailableWindow], gone: Gone) -> None:
        """Adds the queues down at the end of their span: each recovered from the last heal, if any,
        and went down again."""
        for x in out_windows:
            if (
                x["ended_by_ok"]
                or x["queue"] in gone
                or self.answered_later(x["queue"], x["kind"], x["start_ns"], x["end_ns"])
            ):
                continue
            opened = [y for y in out_windows if y["queue"] == x["queue"] and not y["ended_by_ok"]]
            since = min(y["start_ns"] for y in opened)
            before = [w for w in self.windows if w["start_ns"] <= since]
            gone[x["queue"]] = (
                [k for k in KINDS if any(y["kind"] == k for y in opened)],
                since,
                max(before, key=lambda w: w["start_ns"]) if before else None,
            )

    def unavailable(
        self, q: str, kinds: list[LiveKind], since_ns: int, step: FaultWindow | None
    ) -> UnavailableQueue:
        ops = self.drains.get(q, [])
        last_op = ops[-1] if ops else None
        return UnavailableQueue(
            queue=q,
            kinds=kinds,
            since_ns=since_ns,
            fault_id=step["fault_id"] if step else None,
            fault_kind=step["kind"] if step else None,
            heal_ns=step["heal_start_ns"] if step and step["healed"] else None,
            nodes=_said(last_op) if last_op else {},
            drain_rounds=len(last_op["rounds"]) if last_op and last_op["rounds"] else None,
            log=[],
        )


def _recovery(
    facts: LiveFacts,
    w: FaultWindow,
    i: int,
    h: int | None,
    q: str,
    per: dict[str, _Agg],
    drains: list[DrainOp],
    budget: float | None,
    threshold_ns: int,
    consumers: bool = True,
) -> Recovery:
    """One step and queue; a step never healed has nothing measured (every time None)."""
    node_names = sorted({n for (qq, _k, n) in facts.oks if qq == q and n is not None})
    last_inv = facts.publish.get(q, (None, 0, None))[2]
    demand = h is not None and last_inv is not None and last_inv - h > threshold_ns
    pub = _since(per["publish"].after[i], h)
    drain_ok = _min(
        [op["end_ns"] for op in drains if answered(op) and h is not None and (op["end_ns"] or -1) >= h]
    )
    cons = _since(_min([per["consume"].after[i], drain_ok]), h)
    # Something to consume at or after the heal: a publish confirmed after it, or one confirmed
    # before it later than the last consume before it (an idle queue asks nothing of consumers).
    pub_before, cons_before = per["publish"].before[i], per["consume"].before[i]
    asked = (
        consumers
        and h is not None
        and (
            per["publish"].after[i] is not None
            or (pub_before is not None and (cons_before is None or pub_before > cons_before))
        )
    )
    recovered = (cons is not None or not asked) and (pub is not None or not demand)
    times = [t for t, wanted in ((cons, asked), (pub, demand)) if wanted and t is not None]
    took = max(times) if recovered and times else None  # None and recovered: nothing was asked of it
    over = (
        h is not None
        and budget is not None
        and (not recovered or (took is not None and took > budget * NS_PER_S))
    )

    def node_first(kind: str, n: str) -> int | None:
        got = facts.oks.get((q, kind, n))
        return _since(got.after_heal[i], h) if got is not None else None

    return Recovery(
        fault_id=w["fault_id"],
        kind=w["kind"],
        node=w["node"],
        queue=q,
        healed=h is not None,
        heal_ns=h,
        publish_demand=demand,
        consume_demand=asked,
        publish_ok_ns=pub,
        consume_ok_ns=cons,
        recovery_ns=took,
        recovered=recovered,
        budget_s=budget,
        over_budget=over,
        nodes=[
            NodeRecovery(
                node=n, publish_ok_ns=node_first("publish", n), consume_ok_ns=node_first("consume", n)
            )
            for n in node_names
        ],
    )


def answered(op: DrainOp) -> bool:
    """Whether a drain op is the queue's answer: it completed, and not because every node said the
    queue does not exist (``DrainOp.gone``)."""
    return op["outcome"] == "ok" and not op["gone"]


def _said(op: DrainOp) -> dict[str, str | None]:
    """What each node said to a drain op: its error, or that the queue does not exist."""
    gone = op["gone"]
    return {
        n: v.get("error") or (f"the queue does not exist ({gone[n]})" if n in gone else None)
        for n, v in op["nodes"].items()
    }


def describe_unavailable(u: UnavailableQueue, unreachable: int) -> str:
    """The one line an UNAVAILABLE verdict gives for a queue that never came back."""
    said = "; ".join(f"{n}: {e}" for n, e in u["nodes"].items() if e)
    rounds = f" in {u['drain_rounds']} drain rounds" if u["drain_rounds"] else ""
    behind = f"; {unreachable:,} confirmed messages unreachable behind it" if unreachable else ""
    if u["fault_id"] is None:
        step = ", with no fault before it"
    elif u["heal_ns"] is None:
        step = f", after {u['fault_id']} ({u['fault_kind']}), never healed"
    else:
        step = f", after the heal of {u['fault_id']} ({u['fault_kind']}) at {u['heal_ns'] / NS_PER_S:.1f}s"
    return (
        f"queue {u['queue']} never recovered: no {' or '.join(u['kinds'])} ok since "
        f"{u['since_ns'] / NS_PER_S:.1f}s{step}"
        + (f"; the nodes said{rounds}: {said}" if said else "")
        + behind
    )


def describe_overrun(r: Recovery) -> str:
    took = (
        "did not recover"
        if r["recovery_ns"] is None
        else f"recovered {r['recovery_ns'] / NS_PER_S:.1f}s after the heal"
    )
    return (
        f"queue {r['queue']} {took} of {r['fault_id']} ({r['kind']}), over the recovery budget "
        f"of {r['budget_s']:g}s"
    )
