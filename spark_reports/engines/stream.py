"""Stream checks: what a log-structured broker (JetStream) promises beyond a queue's.

The queue checks (``python``/``spark``) ask whether every confirmed message was
consumed. A stream also promises one total order: each confirmed publish got a
stream sequence, each sequence holds one message, consumers see the stream in
that order, and every replica holds the same log once the cluster healed. From
the history (publish ``ok`` and ``consume`` ``ok`` records carry ``stream_seq`` in
``detail``; the drain's completion carries each server's own view of the stream
in ``value.replicas``):

- ``seq_conflicts``: one stream sequence confirmed to two different messages (a
  leader that lost acknowledged writes and handed their sequences out again);
- ``seq_mismatches``: a delivery whose stream sequence is not the one its publish
  was confirmed with;
- ``delivered_conflicts``: one stream sequence delivered as two different messages;
- ``gaps``: sequences below the highest one delivered that nothing ever delivered,
  not explained by messages the stream removed (below its first sequence); only
  counted when the drain finished (else the stream is not fully read). A dense stream
  (JetStream: sequences 1, 2, 3..) has every integer up to the highest delivered; a
  sparse one (the drain says ``"offsets": "sparse"``: Redis entry ids) only the offsets a
  confirm, a delivery, a read or a node's copy (``holdings``) shows;
- ``reordered``: first deliveries (``delivered == 1``) in the consumer's delivery
  order whose stream sequence goes backwards;
- ``diverged_streams``: streams whose replicas disagree after the final drain
  (messages, first or last sequence).

A stream is any queue the history shows as one: a confirm, delivery or read with an offset,
a node's copy with offsets (``holdings``), or a drain that describes a stream (its replicas'
views or its offsets' shape). Not every client gives every check something to judge: a
RabbitMQ stream's publish confirm names only the publishing id, so no confirm carries an
offset (no ``seq_conflicts`` or ``seq_mismatches``), and its deliveries carry no consumer
sequence (no ``reordered``); a drain that read nothing delivered nothing. Each stream's
``Evidence`` says what it gave, and the reason line names each check some stream gave nothing
to judge, and why ("not judged: ..."), so a check that saw nothing never reads as one that
found nothing.

Two engines, one answer: ``check_stream_python`` and ``check_stream_spark`` (Spark
SQL on the Parquet history) return the same dictionary; a differential test
compares them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.spec.history import HOLDINGS, OFFSETS, READ, SPARSE
from spark_reports.engines import rows as _rows
from spark_reports.engines.anomalies import entry_list
from spark_reports.engines.common import history_path, load_json
from spark_reports.engines.rows import Wording, small_results, spark_history

ANOMALIES = (
    "seq_conflicts",
    "seq_mismatches",
    "delivered_conflicts",
    "gaps",
    "reordered",
    "diverged_streams",
)
COUNT_KEYS = (
    "streams",
    "confirmed",
    "delivered",
    "ordered",
    *ANOMALIES,
    "unfinished_drains",
    "history_ops",
)
LABELS = {
    "seq_conflicts": "stream sequence(s) confirmed to two different messages",
    "seq_mismatches": "deliveries with a stream sequence other than the one confirmed",
    "delivered_conflicts": "stream sequence(s) delivered as two different messages",
    "gaps": "stream sequence(s) below the highest delivered that nothing delivered",
    "reordered": "first deliveries out of stream order",
    "diverged_streams": "stream(s) whose replicas disagree after the final drain (messages, first or last sequence)",
}
_COLUMNS = ("index", "process", "type", "f", "queue", "value", "detail")


def iter_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The columns the stream checks read, in index order."""
    return _rows.iter_rows(path, _COLUMNS)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _sparse(drain: dict[str, Any]) -> bool:
    return drain.get(OFFSETS) == SPARSE


def _floor(drain: dict[str, Any]) -> int:
    """The lowest offset a gap may have: the stream's first sequence as its replicas report it
    (what is below was removed), else where the stream's offsets start: 1 for a dense stream
    (JetStream's sequences), 0 for a sparse one (RabbitMQ's offsets start there; Redis's entry ids
    are far above it)."""
    firsts = [_int(v.get("first_seq")) for v in (drain.get("replicas") or {}).values() if isinstance(v, dict)]
    start = 0 if _sparse(drain) else 1
    return max(start, min([s for s in firsts if s is not None] or [start]))


def is_stream_drain(value: dict[str, Any]) -> bool:
    """A drain op's value that describes a stream (``DrainReader.extra``: the replicas' views, or
    the offsets' shape), as no queue's drain does."""
    return "replicas" in value or OFFSETS in value


def take_drain(
    drains: dict[str, dict[str, Any]],
    drain_done: dict[str, bool],
    streams: set[str],
    queue: str,
    typ: str,
    value: Any,
) -> None:
    """One drain op (``ok`` or ``info``) of ``queue``, in history order: its value is the queue's
    last, the queue's drain finished only if every one did, and a stream's drain marks a stream."""
    drain_done[queue] = drain_done.get(queue, True) and typ == "ok"
    drains[queue] = load_json(value)
    if is_stream_drain(drains[queue]):
        streams.add(queue)


def replica_views(drain: dict[str, Any]) -> int:
    """How many replicas' views a drain's value holds (what the replica agreement compares)."""
    return sum(isinstance(v, dict) for v in (drain.get("replicas") or {}).values())


@dataclass(frozen=True)
class Evidence:
    """What one stream's history gave the checks to judge: stream offsets confirmed and delivered,
    first deliveries that carry a consumer sequence, whether the drain finished and how many
    replicas' views it holds."""

    confirmed: int = 0
    delivered: int = 0
    ordered: int = 0
    drained: bool = False
    views: int = 0


NO_CONFIRMED = "no publish confirm carried a stream offset"
NO_DELIVERED = "nothing was delivered with a stream offset"
NO_ORDER = "no delivery carried its consumer sequence and delivery count"
FEW_VIEWS = "the drain had fewer than two replicas' views"


def _why_not(anomaly: str, e: Evidence) -> str | None:
    """Why ``anomaly`` could not be judged on a stream with evidence ``e`` (None: it was). On a
    stream whose drain did not finish, gaps and replica agreement go unjudged under the undrained
    note instead."""
    needs: dict[str, list[tuple[bool, str]]] = {
        "seq_conflicts": [(e.confirmed > 0, NO_CONFIRMED)],
        "seq_mismatches": [(e.confirmed > 0, NO_CONFIRMED), (e.delivered > 0, NO_DELIVERED)],
        "delivered_conflicts": [(e.delivered > 0, NO_DELIVERED)],
        "gaps": [(not e.drained or e.delivered > 0, NO_DELIVERED)],
        "reordered": [(e.delivered > 0, NO_DELIVERED), (e.ordered > 0, NO_ORDER)],
        "diverged_streams": [(not e.drained or e.views > 1, FEW_VIEWS)],
    }
    return next((why for met, why in needs[anomaly] if not met), None)


def not_judged(evidence: dict[str, Evidence]) -> str:
    """The checks some stream gave nothing to judge, grouped by why (in the order of their first
    check), each with the streams it went unjudged on when not all: '' when every check judged
    every stream."""
    groups: dict[str, list[str]] = {}
    for anomaly in ANOMALIES:
        whys = [_why_not(anomaly, e) for e in evidence.values()]
        for why in dict.fromkeys(w for w in whys if w is not None):
            k, n = whys.count(why), len(whys)
            name = anomaly.replace("_", " ")
            groups.setdefault(why, []).append(name if k == n else f"{name} on {k} of {n} streams")
    return "; ".join(f"{', '.join(names)} ({why})" for why, names in groups.items())


def replica_disagreements(drains: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Streams whose replicas' views (servers that hold the stream) differ, from the last drain of each."""
    out = []
    for queue, value in sorted(drains.items()):
        views = {n: v for n, v in (value.get("replicas") or {}).items() if isinstance(v, dict)}
        shapes = {(v.get("messages"), v.get("first_seq"), v.get("last_seq")) for v in views.values()}
        if len(shapes) > 1:
            out.append(
                {
                    "queue": queue,
                    "replicas": {
                        n: {k: views[n].get(k) for k in ("messages", "first_seq", "last_seq")}
                        for n in sorted(views)
                    },
                }
            )
    return out


@dataclass
class _Scan:
    """What one pass over the rows keeps: per stream sequence the ids confirmed and delivered, per
    queue the first deliveries in consumer order, the drains' views and the offsets seen."""

    confirmed: dict[tuple[str, int], set[str]] = field(default_factory=lambda: defaultdict(set))
    seq_of: dict[tuple[str, str], set[int]] = field(default_factory=lambda: defaultdict(set))
    delivered: dict[tuple[str, int], set[str]] = field(default_factory=lambda: defaultdict(set))
    firsts: dict[str, list[tuple[int, int, int]]] = field(default_factory=lambda: defaultdict(list))
    """queue -> (consumer_seq, index, stream_seq) of each first delivery"""
    deliveries: list[tuple[str, str, int, int]] = field(default_factory=list)
    drains: dict[str, dict[str, Any]] = field(default_factory=dict)
    drain_done: dict[str, bool] = field(default_factory=dict)
    streams: set[str] = field(default_factory=set)
    """queues the history shows as streams: an offset confirmed, delivered or read, a node's copy
    with offsets, a stream's drain"""
    seen: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    """offsets reads and nodes' copies show"""
    n: int = 0

    def add(self, r: dict[str, Any]) -> None:
        self.n += 1
        f, t, q = r.get("f"), r.get("type"), r.get("queue")
        if f == "drain" and t in ("ok", "info") and q:
            take_drain(self.drains, self.drain_done, self.streams, q, t, r.get("value"))
        elif f == HOLDINGS and t == "ok" and q:
            offsets = [o for o, _ in entry_list(r.get("value")) if o is not None]
            self.seen[q].update(offsets)
            if offsets:
                self.streams.add(q)
        elif t == "ok" and q and f in ("publish", "consume", READ):
            self._sequenced(r, f, q)

    def _sequenced(self, r: dict[str, Any], f: str, q: str) -> None:
        d = load_json(r.get("detail"))
        seq = _int(d.get("stream_seq"))
        if seq is None:
            return
        self.streams.add(q)
        if f == READ:
            if r.get("value") is not None:
                self.seen[q].add(seq)
            return
        mid = str(r.get("value"))
        if f == "publish":
            self.confirmed[(q, seq)].add(mid)
            self.seq_of[(q, mid)].add(seq)
            return
        self.delivered[(q, seq)].add(mid)
        self.deliveries.append((q, mid, seq, int(r["index"])))
        cseq, count = _int(d.get("consumer_seq")), _int(d.get("delivered"))
        if cseq is not None and count == 1:
            self.firsts[q].append((cseq, int(r["index"]), seq))

    def evidence(self) -> dict[str, Evidence]:
        """Each stream's evidence (``Evidence``)."""
        confirmed = Counter(q for q, _s in self.confirmed)
        delivered = Counter(q for q, _s in self.delivered)
        return {
            q: Evidence(
                confirmed[q],
                delivered[q],
                len(self.firsts.get(q, ())),
                bool(self.drain_done.get(q)),
                replica_views(self.drains.get(q) or {}),
            )
            for q in sorted(self.streams)
        }

    def mismatches(self) -> list[dict[str, Any]]:
        out = []
        for q, mid, seq, index in self.deliveries:
            want = self.seq_of.get((q, mid))
            if want and seq not in want:
                out.append(
                    {
                        "queue": q,
                        "id": mid,
                        "index": index,
                        "delivered_seq": seq,
                        "confirmed_seq": sorted(want),
                    }
                )
        return out

    def gaps(self) -> list[dict[str, Any]]:
        gaps: list[dict[str, Any]] = []
        for q in sorted({qq for qq, _s in self.delivered}):
            if not self.drain_done.get(q):
                continue
            seqs = {s for (qq, s) in self.delivered if qq == q}
            floor, top = _floor(self.drains[q]), max(seqs)
            if _sparse(self.drains[q]):
                known = self.seen[q] | {s for (qq, s) in self.confirmed if qq == q}
                candidates: Iterable[int] = sorted(s for s in known if floor <= s <= top)
            else:
                candidates = range(floor, top + 1)
            gaps.extend({"queue": q, "seq": s} for s in candidates if s not in seqs)
        return gaps

    def reorders(self) -> list[dict[str, Any]]:
        reorders: list[dict[str, Any]] = []
        for q, items in sorted(self.firsts.items()):
            items.sort()
            for (c1, _i1, s1), (c2, i2, s2) in zip(items, items[1:], strict=False):
                if s2 < s1:
                    reorders.append(
                        {"queue": q, "index": i2, "consumer_seq": [c1, c2], "stream_seq": [s1, s2]}
                    )
        return reorders


def _conflicts(ids_at: dict[tuple[str, int], set[str]]) -> list[dict[str, Any]]:
    return [
        {"queue": q, "seq": s, "ids": sorted(ids)} for (q, s), ids in sorted(ids_at.items()) if len(ids) > 1
    ]


def check_rows(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The stream checks over history rows (dicts with the history's columns)."""
    scan = _Scan()
    for r in rows:
        scan.add(r)
    found = {
        "seq_conflicts": _conflicts(scan.confirmed),
        "seq_mismatches": scan.mismatches(),
        "delivered_conflicts": _conflicts(scan.delivered),
        "gaps": scan.gaps(),
        "reordered": scan.reorders(),
        "diverged_streams": replica_disagreements(
            {q: v for q, v in scan.drains.items() if scan.drain_done.get(q)}
        ),
    }
    return _stream_results(scan.evidence(), scan.drain_done, scan.n, found, engine="python")


def _stream_results(
    evidence: dict[str, Evidence],
    drain_done: dict[str, bool],
    n: int,
    found: dict[str, list[dict[str, Any]]],
    *,
    engine: str,
) -> dict[str, Any]:
    """The results of either engine from each stream's evidence: the counts in their order, then
    the examples, and the line names the checks some stream gave nothing to judge."""
    unfinished = sum(1 for q in drain_done if not drain_done[q]) + len(set(evidence) - set(drain_done))
    counts = {"streams": len(evidence)}
    counts |= {
        k: sum(getattr(e, k) for e in evidence.values()) for k in ("confirmed", "delivered", "ordered")
    }
    counts |= {k: len(found[k]) for k in ANOMALIES}
    counts |= {"unfinished_drains": unfinished, "history_ops": n}
    examples = {k: found[k] for k in ANOMALIES}
    return small_results(WORDING, counts, examples, engine=engine, not_judged=not_judged(evidence))


WORDING = Wording(
    name="stream",
    anomalies=ANOMALIES,
    labels=LABELS,
    subject="streams",
    undrained="{n} stream(s) not fully drained",
    undrained_note="{n} stream(s) not fully drained: gaps and replica agreement not judged there",
    nothing="no stream in the history (no stream offset, stream drain or node's copy with offsets): not a stream broker's client?",
    clean="no stream anomaly over {n} stream(s)",
)


def check_stream_python(run_dir: Path, scenario: dict[str, Any] | None = None) -> dict[str, Any]:
    return check_rows(iter_rows(history_path(Path(run_dir))))


# -- the same checks in Spark SQL ------------------------------------------------------------------

_SQL = {
    "base": """
        SELECT index, type, f, queue, value,
               CAST(get_json_object(detail, '$.stream_seq') AS BIGINT) AS seq,
               CAST(get_json_object(detail, '$.consumer_seq') AS BIGINT) AS cseq,
               CAST(get_json_object(detail, '$.delivered') AS BIGINT) AS dcount
        FROM h WHERE type = 'ok' AND f IN ('publish', 'consume') AND queue IS NOT NULL""",
    "conflicts": """SELECT queue, seq, sort_array(collect_set(value)) AS ids FROM b
                    WHERE f = 'publish' AND seq IS NOT NULL GROUP BY queue, seq HAVING size(ids) > 1""",
    "dconflicts": """SELECT queue, seq, sort_array(collect_set(value)) AS ids FROM b
                     WHERE f = 'consume' AND seq IS NOT NULL GROUP BY queue, seq HAVING size(ids) > 1""",
    "mismatches": """
        SELECT c.queue, c.value AS id, c.index, c.seq AS delivered_seq, p.seqs AS confirmed_seq
        FROM (SELECT * FROM b WHERE f = 'consume' AND seq IS NOT NULL) c
        JOIN (SELECT queue, value, sort_array(collect_set(seq)) AS seqs FROM b
              WHERE f = 'publish' AND seq IS NOT NULL GROUP BY queue, value) p
          ON c.queue = p.queue AND c.value = p.value
        WHERE NOT array_contains(p.seqs, c.seq)""",
    "reorders": """
        SELECT queue, index, array(pc, cseq) AS consumer_seq, array(ps, seq) AS stream_seq FROM (
          SELECT queue, index, cseq, seq,
                 lag(cseq) OVER (PARTITION BY queue ORDER BY cseq, index) AS pc,
                 lag(seq) OVER (PARTITION BY queue ORDER BY cseq, index) AS ps
          FROM b WHERE f = 'consume' AND seq IS NOT NULL AND cseq IS NOT NULL AND dcount = 1)
        WHERE ps IS NOT NULL AND seq < ps""",
    # offsets a sparse stream is known to have: confirms, reads and nodes' copies (deliveries are
    # never gaps)
    "known": f"""
        SELECT queue, seq FROM b WHERE f = 'publish' AND seq IS NOT NULL
        UNION SELECT queue, CAST(get_json_object(detail, '$.stream_seq') AS BIGINT) AS seq FROM h
          WHERE f = '{READ}' AND type = 'ok' AND queue IS NOT NULL AND value IS NOT NULL
        UNION SELECT queue, try_cast(get(e, 0) AS BIGINT) AS seq FROM (
          SELECT queue, explode(from_json(value, 'struct<entries:array<array<string>>>').entries) AS e
          FROM h WHERE f = '{HOLDINGS}' AND type = 'ok' AND queue IS NOT NULL)
          WHERE get(e, 1) IS NOT NULL""",
    # dense streams: every integer from the floor to the highest delivered; sparse: the known ones
    "gaps": """
        SELECT r.queue, r.seq FROM (
          SELECT fl.queue, explode(sequence(fl.floor, m.top)) AS seq
          FROM fl JOIN (SELECT queue, max(seq) AS top FROM ds GROUP BY queue) m ON m.queue = fl.queue
          WHERE m.top >= fl.floor
          UNION
          SELECT fs.queue, kn.seq
          FROM fs JOIN (SELECT queue, max(seq) AS top FROM ds GROUP BY queue) m ON m.queue = fs.queue
          JOIN kn ON kn.queue = fs.queue
          WHERE kn.seq BETWEEN fs.floor AND m.top) r
        LEFT ANTI JOIN ds ON ds.queue = r.queue AND ds.seq = r.seq""",
    # each stream's evidence (``Evidence``) from its confirms and deliveries
    "evidence": """
        SELECT queue,
               COUNT(DISTINCT IF(f = 'publish', seq, NULL)) AS confirmed,
               COUNT(DISTINCT IF(f = 'consume', seq, NULL)) AS delivered,
               COUNT(IF(f = 'consume' AND cseq IS NOT NULL AND dcount = 1, 1, NULL)) AS ordered
        FROM b WHERE seq IS NOT NULL GROUP BY queue""",
    # streams a read's offset or a node's copy with offsets shows
    "marked": f"""
        SELECT DISTINCT queue FROM h WHERE f = '{READ}' AND type = 'ok' AND queue IS NOT NULL
          AND CAST(get_json_object(detail, '$.stream_seq') AS BIGINT) IS NOT NULL
        UNION SELECT DISTINCT queue FROM (
          SELECT queue, explode(from_json(value, 'struct<entries:array<array<string>>>').entries) AS e
          FROM h WHERE f = '{HOLDINGS}' AND type = 'ok' AND queue IS NOT NULL)
          WHERE get(e, 1) IS NOT NULL AND try_cast(get(e, 0) AS BIGINT) IS NOT NULL""",
}


def check_stream_spark(
    run_dir: Path, scenario: dict[str, Any] | None = None, *, spark: Any = None
) -> dict[str, Any]:
    """The stream checks as Spark SQL over the Parquet history (drain rows, a handful, are read in Python)."""
    spark, h = spark_history(run_dir, spark)
    spark.sql(_SQL["base"]).createOrReplaceTempView("b")

    def rows(name: str) -> list[dict[str, Any]]:
        return [r.asDict(recursive=True) for r in spark.sql(_SQL[name]).orderBy("queue").collect()]

    drains, drain_done, drained_streams = _spark_drains(spark)
    evidence = _spark_evidence(rows("evidence"), rows("marked"), drains, drain_done, drained_streams)
    found = {
        "seq_conflicts": sorted(rows("conflicts"), key=lambda r: (r["queue"], r["seq"])),
        "seq_mismatches": sorted(rows("mismatches"), key=lambda r: r["index"]),
        "delivered_conflicts": sorted(rows("dconflicts"), key=lambda r: (r["queue"], r["seq"])),
        "gaps": _spark_gaps(spark, sorted(_sequenced(evidence)), drains, drain_done),
        "reordered": sorted(rows("reorders"), key=lambda r: (r["queue"], r["consumer_seq"], r["index"])),
        "diverged_streams": replica_disagreements({q: v for q, v in drains.items() if drain_done.get(q)}),
    }
    return _stream_results(evidence, drain_done, int(h.count()), found, engine="spark")


def _sequenced(evidence: dict[str, Evidence]) -> set[str]:
    """The streams whose confirms or deliveries carry offsets (the only ones gaps can be on)."""
    return {q for q, e in evidence.items() if e.confirmed or e.delivered}


def _spark_drains(spark: Any) -> tuple[dict[str, dict[str, Any]], dict[str, bool], set[str]]:
    """Each queue's last drain value, whether every drain of it finished, and the queues a stream's
    drain describes (the drain rows, a handful, read in Python)."""
    drain_rows = spark.sql(
        "SELECT index, type, queue, value FROM h WHERE f = 'drain' AND type IN ('ok', 'info') ORDER BY index"
    ).collect()
    drains: dict[str, dict[str, Any]] = {}
    drain_done: dict[str, bool] = {}
    streams: set[str] = set()
    for r in drain_rows:
        take_drain(drains, drain_done, streams, r["queue"], r["type"], r["value"])
    return drains, drain_done, streams


def _spark_evidence(
    sequenced: list[dict[str, Any]],
    marked: list[dict[str, Any]],
    drains: dict[str, dict[str, Any]],
    drain_done: dict[str, bool],
    drained_streams: set[str],
) -> dict[str, Evidence]:
    """Each stream's evidence from the ``evidence`` and ``marked`` rows and the drains."""
    by_queue = {r["queue"]: r for r in sequenced}
    streams = set(by_queue) | {r["queue"] for r in marked} | drained_streams
    out = {}
    for q in sorted(streams):
        r = by_queue.get(q) or {}
        out[q] = Evidence(
            int(r.get("confirmed") or 0),
            int(r.get("delivered") or 0),
            int(r.get("ordered") or 0),
            bool(drain_done.get(q)),
            replica_views(drains.get(q) or {}),
        )
    return out


def _spark_gaps(
    spark: Any, queues: list[str], drains: dict[str, dict[str, Any]], drain_done: dict[str, bool]
) -> list[dict[str, Any]]:
    """The gaps of the drained streams among ``queues``: dense and sparse streams in views of their
    own, so a sparse stream's integers are never generated, not even to be filtered out."""
    floors = [(q, _floor(drains[q]), _sparse(drains[q])) for q in sorted(queues) if drain_done.get(q)]
    if not floors:
        return []
    for view, sparse in (("fl", False), ("fs", True)):
        kept = [(q, floor) for q, floor, s in floors if s is sparse]
        spark.createDataFrame(kept, "queue string, floor bigint").createOrReplaceTempView(view)
    spark.sql(
        "SELECT queue, seq FROM b WHERE f = 'consume' AND seq IS NOT NULL GROUP BY queue, seq"
    ).createOrReplaceTempView("ds")
    if any(s for *_q, s in floors):
        spark.sql(_SQL["known"]).createOrReplaceTempView("kn")
    else:  # nothing sparse: no need to read the holdings and reads
        spark.createDataFrame([], "queue string, seq bigint").createOrReplaceTempView("kn")
    missing = spark.sql(_SQL["gaps"]).collect()
    return sorted(
        ({"queue": r["queue"], "seq": int(r["seq"])} for r in missing),
        key=lambda g: (g["queue"], g["seq"]),
    )
