"""The pure-Python reconciliation: the reference the Spark job is checked against.

It holds one small record per message id in memory, so it is meant for histories
up to a few million operations; the Spark job is the one that scales.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import pairwise
from pathlib import Path

from harness.spec.history import is_dead_letter_queue
from harness.spec.results import LIST_CAP, UNAVAILABLE_S, Results
from harness.spec.rundir import HISTORY_COLUMNS, OPTIONAL_COLUMNS, disjoint_nodes
from spark_reports.engines.anomalies import STREAM_OPS, StreamOps, lost_positions, stream_findings
from spark_reports.engines.common import (
    ABANDONED,
    DELIVERY_CAP,
    NEMESIS,
    NEVER_DELIVERED,
    SMALL_OPS,
    UNACKED,
    bucket_of,
    cap,
    json_field,
    latency_us,
    order_stats,
    outcome_of,
    parse_id,
)
from spark_reports.engines.context import Context, make_context
from spark_reports.engines.drain import drain_read, split_brain_nodes
from spark_reports.engines.liveness import NS_PER_S, LiveFacts, NodeOks, heal_times
from spark_reports.engines.params import expected_digest
from spark_reports.engines.verdict import LISTED, Facts, assemble
from spark_reports.engines.windows import kinds_for, window_ids_at
from spark_reports.progress import progress

_DELIVERY_KEYS = ("index", "time_ns", "node", "queue", "process", "redelivered")
_ACK_KEYS = ("index", "time_ns", "node", "process", "queue")


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

    present = set(pq.read_schema(path).names)
    missing = [c for c in OPTIONAL_COLUMNS if c not in present]
    columns = [c for c in HISTORY_COLUMNS if c not in missing]
    table = pq.read_table(path, columns=columns).sort_by("index")
    for batch in table.to_batches(max_chunksize=65536):
        cols = [batch.column(name).to_pylist() for name in columns]
        for values in zip(*cols, strict=True):
            row = dict(zip(columns, values, strict=True))
            for c in missing:
                row[c] = None
            yield row


class _Msg:
    __slots__ = (
        "attempts",
        "outcomes",
        "first_inv",
        "confirm",
        "pending",
        "deliveries",
        "delivered",
        "last_d",
        "digests",
        "acked",
        "first_ack",
        "ack_info_inv",
        "abandons",
        "last_ab",
        "res_n",
        "res_first",
        "delayed",
        "dead",
    )

    def __init__(self) -> None:
        self.attempts = 0
        self.outcomes: set[str] = set()
        self.first_inv: tuple[int, int] | None = None  # (index, time)
        self.confirm: tuple[int, int, str | None] | None = None  # (index, time, node)
        self.pending: deque[tuple[int, int]] = deque()
        self.deliveries: list[dict] = []
        self.delivered = 0
        self.last_d: int | None = None
        self.digests: dict[str, list] = {}  # digest -> [deliveries, first delivery]
        self.acked = 0
        self.first_ack: dict | None = None
        self.ack_info_inv: int | None = None  # the latest invoke of an ack that completed info
        self.abandons = 0
        self.last_ab: tuple[int, str | None] | None = None  # (index, cause)
        self.res_n = 0
        self.res_first: dict | None = None
        self.delayed = False  # published with a delay: no place in its producer's order
        self.dead = False  # consumed from a dead-letter queue (``workload.dead_letter``)

    @property
    def outcome(self) -> str:
        if self.attempts == 0:
            return "none"
        for o in ("ok", "info", "fail"):
            if o in self.outcomes:
                return o
        return "info"


class _AckPairs:
    """Which ack invoke a completion closes: the k-th completion of a (process, id) closes its k-th invoke.

    That is the Spark job's rule too, so a completion recorded before any invoke (a
    malformed history) pairs with nothing in both engines.
    """

    def __init__(self) -> None:
        self.open: dict[tuple[str, str], tuple[list[int], int]] = {}

    def invoke(self, process: str, mid: str, index: int) -> None:
        invokes, done = self.open.get((process, mid), ([], 0))
        invokes.append(index)
        self.open[(process, mid)] = (invokes, done)

    def complete(self, process: str, mid: str) -> int | None:
        key = (process, mid)
        invokes, done = self.open.get(key, ([], 0))
        paired = invokes[done] if done < len(invokes) else None
        done += 1
        if done == len(invokes):
            self.open.pop(key, None)  # balanced: later pairs start afresh at the same offset
        else:
            self.open[key] = (invokes, done)
        return paired


def check_python(run_dir: Path, scenario: dict) -> Results:
    """Reconcile a stored run in plain Python (same results schema as check_spark)."""
    from spark_reports.engines.common import history_path

    path = history_path(Path(run_dir), allow_jsonl=True)
    rows = list(iter_history(path)) if path.suffix == ".jsonl" else None
    source = rows if rows is not None else iter_history(path)
    # First pass over the small rows and the end time, exactly like the Spark job's prelude.
    ops, end_ns, small, schema = 0, None, [], None
    for r in source:
        ops += 1
        end_ns = r["time_ns"] if end_ns is None else max(end_ns, r["time_ns"])
        version = r["schema"] if r["schema"] is not None else 1
        schema = version if schema is None else min(schema, version)
        if r["process"] == NEMESIS or r["f"] in SMALL_OPS:
            small.append(r)
    ctx = make_context(ops, end_ns, small, scenario, schema, disjoint=disjoint_nodes(Path(run_dir)))
    progress("python", "prelude", ops=ops, faults=len(ctx.windows), schema=ctx.history_schema)
    facts = _reconcile(rows if rows is not None else iter_history(path), ctx)
    progress("python", "done", lost=facts.counts["lost"])
    return assemble("python", ctx, facts)


def _reconcile(source: Iterable[dict], ctx: Context) -> Facts:
    """The reconciliation, in four steps:

    1. one pass over the history (``_Pass``) counts every operation into the timeline and
       groups the clients' operations by message id: publishes with their outcomes and
       confirm latency, deliveries (with the redelivery, body and order checks), acks paired
       with their invokes, abandons; it also gathers the liveness figures;
    2. invokes that never completed become indeterminate attempts (``_Pass.settle``);
    3. every id is classified (``_Classes``): its outcome, the fault windows it was exposed
       to and what a loss is attributed to, and the classes it falls in (lost, ack_unknown,
       unexpected, duplicated, recovered, resurrected, corrupted, split_brain);
    4. ``_facts`` gathers both into the ``Facts`` that ``assemble`` (shared with the Spark job)
       turns into results; the stuck queues come from the prelude (``make_context``).
    """
    grouped = _Pass(ctx)
    for r in source:
        grouped.row(r)
    progress("python", "grouped", messages=len(grouped.msgs))
    grouped.settle()
    classes = _Classes(ctx)
    for mid, m in grouped.msgs.items():
        classes.add(mid, m)
    return _facts(grouped, classes, ctx)


class _Pass:
    """Step 1: what one pass over the history (in index order) gathers, per message id and overall."""

    def __init__(self, ctx: Context) -> None:
        self.bw = ctx.bucket_s
        self.windows = ctx.windows
        self.with_acks = ctx.acks
        self.delays = ctx.params.delays
        self.msgs: dict[str, _Msg] = {}
        self.timeline: dict[tuple[int, str | None, str | None], int] = {}
        self.lat_tl: dict[int, list[int]] = {}  # bucket -> [confirms, sum_us, max_us]
        self.availability: dict[str, list[int]] = {}  # window id -> [attempts, confirmed]
        self.confirm_lat: list[int] = []
        self.max_seq: dict[tuple[str, str | None, str], int] = {}  # (consumer, queue, producer) -> seq
        self.violations: list[dict] = []
        self.unflagged: list[dict] = []
        self.acks = _AckPairs()
        self.live = _Live(self.with_acks)
        self.stream = StreamOps()
        self.publish_attempts = 0
        self.n = dict.fromkeys(
            ("violations", "delivered_total", "acked_total", "abandoned", "unflagged", "undigested"), 0
        )

    def msg(self, mid: str) -> _Msg:
        m = self.msgs.get(mid)
        if m is None:
            m = self.msgs[mid] = _Msg()
        return m

    def row(self, r: dict) -> None:
        f, ty, value = r["f"], r["type"], r["value"]
        key = (bucket_of(r["time_ns"], self.bw), f, ty)
        self.timeline[key] = self.timeline.get(key, 0) + 1
        if f in STREAM_OPS and r["process"] != NEMESIS:
            self.stream.add(r)
            return
        if r["process"] == NEMESIS or value is None:
            return
        self.live.add(r)
        if f == "publish":
            if ty == "invoke":
                self.publish_invoke(r, value)
            else:
                self.publish_completion(r, value, ty)
        elif f == "consume" and ty == "ok":
            self.delivery(r, value)
        elif self.with_acks and f == "ack":
            self.ack(r, value, ty)
        elif self.with_acks and f == "abandon" and ty == "invoke":
            self.abandon(r, value)

    # -- publishes: attempts, outcomes, confirms ------------------------------------------

    def publish_invoke(self, r: dict, value: str) -> None:
        m = self.msg(value)
        m.attempts += 1
        self.publish_attempts += 1
        if self.delays and r["detail"] is not None and "delay_ms" in r["detail"]:
            m.delayed = True
        if m.first_inv is None:
            m.first_inv = (r["index"], r["time_ns"])
        m.pending.append((r["index"], r["time_ns"]))

    def publish_completion(self, r: dict, value: str, ty: str) -> None:
        """A completion closes its id's oldest open invoke (one without an invoke closes nothing)."""
        m = self.msgs.get(value)
        if m is None or not m.pending:
            return
        _inv_index, inv_time = m.pending.popleft()
        outcome = outcome_of(ty)
        m.outcomes.add(outcome)
        _count_attempt(self.availability, self.windows, inv_time, outcome == "ok")
        if outcome == "ok":
            self.confirmed(m, r, inv_time)

    def confirmed(self, m: _Msg, r: dict, inv_time: int) -> None:
        """The first confirm is the id's; every confirm's latency goes into the latency figures."""
        if m.confirm is None:
            m.confirm = (r["index"], r["time_ns"], r["node"])
        lat = latency_us(r["time_ns"], inv_time)
        self.confirm_lat.append(lat)
        b = self.lat_tl.setdefault(bucket_of(r["time_ns"], self.bw), [0, 0, 0])
        b[0] += 1
        b[1] += lat
        b[2] = max(b[2], lat)

    def settle(self) -> None:
        """Step 2: invokes that never completed are indeterminate attempts."""
        for m in self.msgs.values():
            while m.pending:
                _, inv_time = m.pending.popleft()
                m.outcomes.add("info")
                _count_attempt(self.availability, self.windows, inv_time, False)

    # -- deliveries, acks and abandons -----------------------------------------------------

    def delivery(self, r: dict, value: str) -> None:
        self.n["delivered_total"] += 1
        m = self.msg(value)
        m.delivered += 1
        m.last_d = r["index"]
        d = {k: r[k] for k in _DELIVERY_KEYS}
        if len(m.deliveries) < DELIVERY_CAP:
            m.deliveries.append(d)
        if self.with_acks:
            self.redelivery_checks(m, r, value, d)
            self.body_check(m, r, d)
        else:  # schema 1: a delivery is the consumption
            m.dead = m.dead or is_dead_letter_queue(r["queue"])
        self.order_check(m, r, value)

    def redelivery_checks(self, m: _Msg, r: dict, value: str, d: dict) -> None:
        """A delivery after the id's first ok ack resurrects it; one after an abandon must be flagged redelivered."""
        if m.first_ack is not None:
            m.res_n += 1
            if m.res_first is None:
                m.res_first = d
        if m.last_ab is not None and r["redelivered"] is not True:
            self.n["unflagged"] += 1
            if len(self.unflagged) < LIST_CAP:
                self.unflagged.append(
                    {"id": value, **d, "abandon_index": m.last_ab[0], "abandon_cause": m.last_ab[1]}
                )

    def body_check(self, m: _Msg, r: dict, d: dict) -> None:
        """Each distinct digest an id was delivered with, how often and its first delivery."""
        digest = r["digest"]
        if digest is None:
            self.n["undigested"] += 1
            return
        seen = m.digests.get(digest)
        if seen is None:
            m.digests[digest] = [1, {**d, "digest": digest, "detail": r["detail"]}]
        else:
            seen[0] += 1

    def order_check(self, m: _Msg, r: dict, value: str) -> None:
        """A first delivery (not flagged redelivered) of an undelayed ``producer:seq`` id must not
        come after a higher seq of the same producer to the same consumer from the same queue."""
        parsed = parse_id(value) if not m.delayed else None
        if parsed is None or r["redelivered"] is True:
            return
        producer, seq = parsed
        okey = (r["process"], r["queue"], producer)
        prev = self.max_seq.get(okey)
        if prev is not None and seq < prev:
            self.n["violations"] += 1
            if len(self.violations) < LIST_CAP:
                self.violations.append(
                    {
                        "consumer": r["process"],
                        "queue": r["queue"],
                        "producer": producer,
                        "id": value,
                        "seq": seq,
                        "after_seq": prev,
                        "index": r["index"],
                    }
                )
        self.max_seq[okey] = seq if prev is None else max(prev, seq)

    def ack(self, r: dict, value: str, ty: str) -> None:
        """Acks pair with their invokes (``_AckPairs``); an ack that completed info remembers its invoke."""
        if ty == "invoke":
            self.acks.invoke(r["process"], value, r["index"])
            return
        paired = self.acks.complete(r["process"], value)
        m = self.msg(value)
        if ty == "ok":
            self.n["acked_total"] += 1
            m.acked += 1
            m.dead = m.dead or is_dead_letter_queue(r["queue"])
            if m.first_ack is None:
                m.first_ack = {k: r[k] for k in _ACK_KEYS}
        elif ty != "fail" and paired is not None:
            m.ack_info_inv = paired if m.ack_info_inv is None else max(m.ack_info_inv, paired)

    def abandon(self, r: dict, value: str) -> None:
        self.n["abandoned"] += 1
        m = self.msg(value)
        m.abandons += 1
        m.last_ab = (r["index"], json_field(r["detail"], "cause"))


#: What ``_Classes`` counts per id: its outcome, whether it was delivered and consumed, its classes.
_COUNTED = (
    "attempted",
    "confirmed",
    "failed",
    "unknown",
    "delivered_unique",
    "consumed_unique",
    "dead_lettered",
    *LISTED,
)


class _Classes:
    """Step 3: each message id's outcome, exposure to faults and classes, counted and listed."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.with_acks = ctx.acks
        self.counts = dict.fromkeys(_COUNTED, 0)
        self.lists: dict[str, list[dict]] = {k: [] for k in LISTED}
        self.by_cause: dict[tuple[str, str | None], int] = {}
        self.e2e: list[int] = []
        # What is missing (lost, unreachable or stuck: ``verdict.missing_class`` says which):
        self.attribution: dict[tuple[str, str | None], int] = {}  # (fault kind, confirming node) -> missing
        self.exposure: dict[str, list[int]] = {}  # fault kind -> [confirmed, missing]
        self.lost_at: list[tuple[str, int]] = []  # (producer, seq) of every lost id
        self.survivors: list[tuple[str, int]] = []  # ... of every id delivered or consumed
        # (queue, drain node, confirm second) -> [count, first confirm, last confirm, last read, wait]
        self.stranded: dict[tuple[str | None, str | None, int], list[int]] = {}

    def add(self, mid: str, m: _Msg) -> None:
        outcome = m.outcome
        consumed = m.acked if self.with_acks else m.delivered
        self.outcome_counts(m, outcome, consumed)
        if m.attempts and m.delivered:
            assert m.first_inv is not None
            self.e2e.append(latency_us(m.deliveries[0]["time_ns"], m.first_inv[1]))
        unacked = outcome == "ok" and consumed == 0
        ack_unknown = (
            unacked and m.ack_info_inv is not None and (m.last_d is None or m.ack_info_inv > m.last_d)
        )
        is_lost = unacked and not ack_unknown
        parsed = parse_id(mid)
        if parsed is not None:
            if is_lost:
                self.lost_at.append(parsed)
            if m.delivered or consumed:
                self.survivors.append(parsed)
        if outcome == "ok":
            self.exposed(m, is_lost)
        self.delivery_classes(mid, m, outcome, consumed, is_lost, ack_unknown)
        if m.res_n:
            self.resurrected(mid, m)
        if self.ctx.check_bodies and m.attempts and m.digests:
            self.corrupted(mid, m)
        if self.ctx.spans and m.first_ack is not None:
            self.split_brain(mid, m.first_ack)
        if self.ctx.drain_reads and m.first_ack is not None and m.confirm is not None:
            self.drain_first(m.first_ack, m.confirm[1])

    def outcome_counts(self, m: _Msg, outcome: str, consumed: int) -> None:
        c = self.counts
        c["attempted"] += m.attempts > 0
        c["confirmed"] += outcome == "ok"
        c["failed"] += outcome == "fail"
        c["unknown"] += outcome == "info"
        c["delivered_unique"] += m.delivered > 0
        c["consumed_unique"] += consumed > 0
        c["dead_lettered"] += m.dead and consumed > 0

    def exposed(self, m: _Msg, is_lost: bool) -> None:
        """A confirmed id counts towards every fault kind whose window overlaps its confirm to the
        drain's end ("none" when it met no fault); a missing one is attributed to those kinds and
        the node that confirmed it (under its class, ``verdict.missing_class``)."""
        assert m.confirm is not None
        for kind in kinds_for(self.ctx.windows, m.confirm[1], self.ctx.drain_end_ns):
            ex = self.exposure.setdefault(kind, [0, 0])
            ex[0] += 1
            ex[1] += is_lost
            if is_lost:
                akey = (kind, m.confirm[2])
                self.attribution[akey] = self.attribution.get(akey, 0) + 1

    def delivery_classes(
        self, mid: str, m: _Msg, outcome: str, consumed: int, is_lost: bool, ack_unknown: bool
    ) -> None:
        """lost (with its cause), ack_unknown, unexpected, duplicated and recovered."""
        if m.first_ack is not None and self.with_acks:
            first_consumed: int | None = m.first_ack["index"]
        else:
            first_consumed = m.deliveries[0]["index"] if m.deliveries else None

        def add(name: str, extra: dict | None = None) -> None:
            self.counts[name] += 1
            self.lists[name].append(
                {**_detail(mid, m, consumed), "first_consumed_index": first_consumed, **(extra or {})}
            )

        if is_lost:
            cause, abandon_cause = _lost_cause(m)
            self.by_cause[(cause, abandon_cause)] = self.by_cause.get((cause, abandon_cause), 0) + 1
            add("lost", {"cause": cause, "abandon_cause": abandon_cause})
        if ack_unknown:
            add("ack_unknown")
        if m.attempts == 0 and consumed:
            add("unexpected")
        if consumed > 1:
            add("duplicated")
        if outcome in ("fail", "info") and consumed:
            add("recovered")

    def resurrected(self, mid: str, m: _Msg) -> None:
        assert m.res_first is not None
        self.counts["resurrected"] += 1
        self.lists["resurrected"].append(
            {
                "id": mid,
                "ack": m.first_ack,
                "deliveries_after": m.res_n,
                "delivery": m.res_first,
                "first_index": m.res_first["index"],
            }
        )

    def corrupted(self, mid: str, m: _Msg) -> None:
        """Deliveries whose digest is not the body the id's publish carried."""
        want = expected_digest(mid, self.ctx.params)
        bad = [v for dg, v in m.digests.items() if dg != want]
        if not bad:
            return
        first = min((v[1] for v in bad), key=lambda x: x["index"])
        self.counts["corrupted"] += 1
        self.lists["corrupted"].append(
            {
                "id": mid,
                "deliveries": sum(v[0] for v in bad),
                "delivery": first,
                "first_index": first["index"],
            }
        )

    def split_brain(self, mid: str, a: dict) -> None:
        """The id's first ok ack came, inside a drain, from a node while another node of that drain
        had already reported the queue empty (``split_brain_nodes``)."""
        if split_brain_nodes(self.ctx.spans, a["process"], a["queue"], a["index"], a["time_ns"], a["node"]):
            self.counts["split_brain"] += 1
            self.lists["split_brain"].append({"id": mid, "ack": a, "first_index": a["index"]})

    def drain_first(self, a: dict, confirm_ns: int) -> None:
        """A confirmed id first acked by the drain: counted by queue, drain node and confirm second
        (``LiveFacts.stranded``)."""
        if not drain_read(self.ctx.drain_reads, a["process"], a["queue"], a["index"]):
            return
        wait = a["time_ns"] - confirm_ns
        key = (a["queue"], a["node"], confirm_ns // NS_PER_S)
        b = self.stranded.get(key)
        if b is None:
            self.stranded[key] = [1, confirm_ns, confirm_ns, a["time_ns"], wait]
            return
        b[0] += 1
        b[1], b[2] = min(b[1], confirm_ns), max(b[2], confirm_ns)
        b[3], b[4] = max(b[3], a["time_ns"]), max(b[4], wait)


def _facts(grouped: _Pass, classes: _Classes, ctx: Context) -> Facts:
    """Step 4: the totals, the capped lists in their order, the latency and liveness figures."""
    n, counts, lists = grouped.n, classes.counts, classes.lists
    counts["publish_attempts"] = grouped.publish_attempts
    counts["delivered_total"] = n["delivered_total"]
    counts["consumed_total"] = n["acked_total"] if ctx.acks else n["delivered_total"]
    counts["abandoned"] = n["abandoned"]
    counts["unflagged_redeliveries"] = n["unflagged"]
    counts["order_violations"] = n["violations"]
    grouped.confirm_lat.sort()
    classes.e2e.sort()
    live = grouped.live.facts(heal_times(ctx.windows), UNAVAILABLE_S * NS_PER_S)
    live.stranded = [(q, n, sec, b[0], b[1], b[2], b[3], b[4]) for (q, n, sec), b in classes.stranded.items()]
    for d in lists["duplicated"]:
        d["first_delivery_index"] = d["deliveries"][0]["index"]
    return Facts(
        counts=counts,
        lost=cap(lists["lost"], "confirm_index"),
        lost_by_cause=[(c, a, k) for (c, a), k in classes.by_cause.items()],
        ack_unknown=cap(lists["ack_unknown"], "confirm_index"),
        unexpected=cap(lists["unexpected"], "first_consumed_index"),
        duplicated=cap(lists["duplicated"], "first_delivery_index"),
        recovered=cap(lists["recovered"], "first_consumed_index"),
        resurrected=cap(lists["resurrected"], "first_index"),
        corrupted=cap(lists["corrupted"], "first_index"),
        split_brain=cap(lists["split_brain"], "first_index"),
        unflagged=grouped.unflagged,
        undigested=n["undigested"],
        order_violations=grouped.violations,
        attribution_rows=[(k, node, c) for (k, node), c in classes.attribution.items()],
        exposure_rows=[(k, v[0], v[1]) for k, v in classes.exposure.items()],
        confirm_us=order_stats(grouped.confirm_lat),
        e2e_us=order_stats(classes.e2e),
        availability={k: (v[0], v[1]) for k, v in grouped.availability.items()},
        timeline=[(t, f, ty, k) for (t, f, ty), k in grouped.timeline.items()],
        latency_timeline=[(t, v[0], v[1], v[2]) for t, v in grouped.lat_tl.items()],
        live=live,
        positions=lost_positions(classes.lost_at, classes.survivors),
        stream=stream_findings(grouped.stream, _status(grouped.msgs, ctx.acks)),
    )


def _status(msgs: dict[str, _Msg], acks: bool) -> Callable[[str], tuple[bool, bool]]:
    """An id's (confirmed, delivered or consumed), for the stream classes."""

    def status(mid: str) -> tuple[bool, bool]:
        m = msgs.get(mid)
        if m is None:
            return False, False
        return m.outcome == "ok", bool(m.delivered or (m.acked if acks else 0))

    return status


class _Live:
    """The liveness figures (``LiveFacts``): every ok op's time per queue, kind and node, sorted
    at the end; the publish span per queue."""

    def __init__(self, with_acks: bool) -> None:
        self.consume_f = "ack" if with_acks else "consume"
        self.times: dict[tuple[str, str, str | None], list[int]] = {}
        self.publish: dict[str, list[int | None]] = {}

    def add(self, r: dict) -> None:
        q, f, ty, t = r["queue"], r["f"], r["type"], r["time_ns"]
        if q is None:
            return
        if f == "publish":
            span = self.publish.setdefault(q, [None, t, None])
            span[1] = max(span[1], t)
            if ty == "invoke":
                span[0] = t if span[0] is None else min(span[0], t)
                span[2] = t if span[2] is None else max(span[2], t)
        if ty != "ok":
            return
        kind = "publish" if f == "publish" else "consume" if f == self.consume_f else None
        if kind is not None:
            self.times.setdefault((q, kind, r["node"]), []).append(t)

    def facts(self, heals: list[int | None], threshold_ns: int) -> LiveFacts:
        out = LiveFacts(publish={q: (a, b, c) for q, (a, b, c) in self.publish.items()})  # type: ignore[misc]
        merged: dict[tuple[str, str], list[int]] = {}
        for key, ts in self.times.items():
            ts.sort()
            merged.setdefault(key[:2], []).extend(ts)
            after: list[int | None] = []
            before: list[int | None] = []
            for h in heals:
                i = bisect_left(ts, h) if h is not None else len(ts)
                after.append(ts[i] if i < len(ts) else None)
                before.append(ts[i - 1] if h is not None and i > 0 else None)
            out.oks[key] = NodeOks(
                count=len(ts), first_ns=ts[0], last_ns=ts[-1], after_heal=after, before_heal=before
            )
        for (q, kind), ts in merged.items():
            ts.sort()
            out.gaps += [(q, kind, a, b) for a, b in pairwise(ts) if b - a > threshold_ns]
            if kind == "consume" and q in self.publish:  # the last at or before the last publish record
                i = bisect_right(ts, self.publish[q][1] or 0)
                if i > 0:
                    out.consume_by_publish_end[q] = ts[i - 1]
        return out


def _lost_cause(m: _Msg) -> tuple[str, str | None]:
    if m.delivered == 0:
        return NEVER_DELIVERED, None
    if m.last_ab is not None and m.last_d is not None and m.last_ab[0] > m.last_d:
        return ABANDONED, m.last_ab[1]
    return UNACKED, None


def _count_attempt(availability: dict[str, list[int]], windows: list, inv_time: int, ok: bool) -> None:
    for wid in window_ids_at(windows, inv_time) or ["outside"]:
        a = availability.setdefault(wid, [0, 0])
        a[0] += 1
        a[1] += ok


def _detail(mid: str, m: _Msg, consumed: int) -> dict:
    return {
        "id": mid,
        "attempts": m.attempts,
        "outcome": m.outcome,
        "first_invoke_ns": m.first_inv[1] if m.first_inv else None,
        "confirm_ns": m.confirm[1] if m.confirm else None,
        "confirm_node": m.confirm[2] if m.confirm else None,
        "confirm_index": m.confirm[0] if m.confirm else None,
        "delivered": m.delivered,
        "consumed": consumed,
        "deliveries": list(m.deliveries),
    }
