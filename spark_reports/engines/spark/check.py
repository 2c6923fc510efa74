"""The Spark reconciliation job.

It never brings a whole history to the driver: the only things collected are the
nemesis and drain records (a handful, read with a pushed-down filter), the names of
nodes, queues and processes, aggregates, capped lists and histograms of at most a
few tens of thousands of buckets. Everything per message stays in Spark, where it
spills to disk when the driver's heap (spark.driver.memory, 1g by default) is too
small to hold it.

A check is the per-id classification (``_spark_ids``: a hash aggregate, and an ordered
pass that reads the history again for the few ids that need one), kept; then one job with
every count, table, timeline and first latency histogram and the capped lists (each id's
row carries its deliveries, so neither the lists nor the order check read the history
again); then, only where needed, the lists the counts call for and the refinement of the
latency percentiles. Grading many runs is the classification and the counts alone, over all
their histories.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any

from harness.spec.history import DEAD_LETTER_SUFFIX, STREAM_OPS, arrow_schema, is_dead_letter_queue
from harness.spec.results import LIST_CAP, Results
from harness.spec.rundir import HISTORY_COLUMNS, disjoint_nodes
from spark_reports.engines.common import DELIVERY_CAP, NEMESIS, SMALL_OPS, history_path
from spark_reports.engines.context import Context, make_context
from spark_reports.engines.liveness import LiveFacts
from spark_reports.engines.spark.anomalies import parse as parse_anomalies
from spark_reports.engines.spark.anomalies import parts as anomaly_parts
from spark_reports.engines.spark.ids import Unit, classify, events
from spark_reports.engines.spark.live import (
    live_metrics,
    ok_records,
    parse_live,
    publish_records,
    stranded_part,
)
from spark_reports.engines.spark.ranks import Ranks
from spark_reports.engines.spark.scope import Scope
from spark_reports.engines.spark.sql import bucket, collect_parts, tagged
from spark_reports.engines.spark.window import (
    gap_source,
    list_source,
    order_source,
    positions_source,
    window_parts,
)
from spark_reports.engines.verdict import COUNT_KEYS, Facts, assemble, summarize
from spark_reports.progress import progress
from spark_reports.service.session import default_parallelism, spark_session
from spark_reports.service.warmup import WARM_UP


def start_session_in_background(master: str | None = None, driver_memory: str | None = None) -> Any:
    """The JVM started and warmed up with this engine's check, in the background (``WarmUp.start``)."""
    return WARM_UP.start(_check, master, driver_memory)


def warm_up_server(url: str) -> float:
    """The warm-up checks through a Spark Connect server (``WarmUp.warm_server``); seconds taken."""
    return WARM_UP.warm_server(_check, url)


def _column_types() -> dict[str, str]:
    """Spark SQL types of the contract's Arrow schema (an absent optional column reads as a typed null)."""
    import pyarrow as pa

    sql = {pa.int64(): "bigint", pa.int32(): "int", pa.string(): "string", pa.bool_(): "boolean"}
    return {f.name: sql[f.type] for f in arrow_schema()}


def check_spark(
    run_dir: Path,
    scenario: dict,
    *,
    spark_master: str | None = None,
    driver_memory: str | None = None,
    passes: str | None = None,
) -> Results:
    """Reconcile a stored run with Spark; same results schema as check_python.

    With spark_master pointing at a real cluster, the run directory must be on a
    filesystem every executor can read at the same path. ``passes``: "both" (the hash
    aggregate, and the ordered pass where needed) or "ordered" (every id through the ordered
    pass); by default "ordered" below ORDERED_ROWS records, "both" above. Tests compare them.
    """
    WARM_UP.before_check()
    return _check(run_dir, scenario, spark_master, driver_memory, passes)


def _check(
    run_dir: Path,
    scenario: dict,
    spark_master: str | None,
    driver_memory: str | None,
    passes: str | None = None,
    planned_rows: int | None = None,
) -> Results:
    """``planned_rows``: plan the job as for a history of that many records (the warm-up's checks
    of a tiny history take the paths of a big one's too)."""
    conf = (scenario or {}).get("spark") or {}
    spark = spark_session(spark_master or conf.get("master"), driver_memory or conf.get("driver_memory"))
    history = _prepare(spark, Path(run_dir), scenario, 0)
    job = _Job(
        spark,
        history.h,
        Scope(spark, {0: history.ctx}),
        planned_rows or history.ctx.ops,
        history.names,
        passes=passes,
        streams=history.streams,
        dead_letters=history.dead_letters,
    )
    try:
        return job.check(history.ctx)
    finally:
        job.release()


def aggregate_runs(
    run_dirs: list[Path], scenarios: list[dict], *, spark_master: str | None = None
) -> list[dict[str, Any]]:
    """Verdict, counts, drain and exposure of every run in one Spark job over all their histories.

    Each history is read with its run's number as a column; the run contexts (schema, bodies,
    fault windows, drain spans) travel as a broadcast table joined by that number; every
    window, grouping and aggregate of the job is per (run, message id) or per run. The
    capped lists and latency percentiles of a single check are not computed: grading does
    not read them.
    """
    spark = spark_session(spark_master)
    histories = [
        _prepare(spark, Path(d), s, i) for i, (d, s) in enumerate(zip(run_dirs, scenarios, strict=True))
    ]
    h = histories[0].h
    for x in histories[1:]:
        h = h.unionByName(x.h)
    ctxs = {i: x.ctx for i, x in enumerate(histories)}
    names = sorted(set().union(*[x.names for x in histories]))
    job = _Job(
        spark,
        h,
        Scope(spark, ctxs),
        sum(c.ops for c in ctxs.values()),
        names,
        streams=any(x.streams for x in histories),
        dead_letters=any(x.dead_letters for x in histories),
    )
    try:
        metrics, live, anomalies = job.aggregates()
    finally:
        job.release()
    out = []
    for i, ctx in ctxs.items():
        m = metrics.get(i) or _Metrics.empty()
        out.append(summarize("spark", ctx, m.counts, m.exposure_rows, live[i], *anomalies[i]))
    return out


@dataclass(frozen=True)
class _History:
    h: Any  # the records, HISTORY_COLUMNS and the run's number
    ctx: Context
    names: list[str]  # every node, queue and process name in it
    streams: bool  # it has a stream's operations (holdings, reads, seeks)
    dead_letters: bool  # it names a dead-letter queue


def _prepare(spark: Any, run_dir: Path, scenario: dict, run: int) -> _History:
    """Read one stored history and its context (footer, nemesis and drain records: driver-side)."""
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    path = history_path(run_dir, allow_jsonl=False).resolve()
    footer = _footer(pq.ParquetFile(path).metadata)
    raw = spark.read.parquet(str(path))
    present = set(raw.columns)
    types = _column_types()
    # Histories written before schema 2 have no digest or detail column: they read as nulls.
    h = raw.select(
        F.lit(run).alias("run"),
        *[F.col(c) if c in present else F.lit(None).cast(types[c]).alias(c) for c in HISTORY_COLUMNS],
    )
    ops, end_ns, schema = footer.rows, footer.max_time, footer.min_schema
    if end_ns is None:
        ops, end_ns = h.agg(F.count(F.lit(1)), F.max("time_ns")).first()
    if "schema" not in present:
        schema = 1
    elif schema is None:
        schema = h.agg(F.min(F.coalesce("schema", F.lit(1)))).first()[0]
    small = _small_rows(path)
    ctx = make_context(int(ops), end_ns, small, scenario, schema, disjoint=disjoint_nodes(run_dir))
    progress(
        "spark",
        "prelude",
        ops=int(ops),
        faults=len(ctx.windows),
        drain_ops=len(small),
        schema=ctx.history_schema,
    )
    values = _distinct(path, ("node", "queue", "process", "f"))
    names = sorted(values["node"] | values["queue"] | values["process"])
    return _History(
        h=h,
        ctx=ctx,
        names=names,
        streams=bool(values["f"] & STREAM_OPS),
        dead_letters=any(is_dead_letter_queue(q) for q in values["queue"]),
    )


def _distinct(path: Path, columns: tuple[str, ...]) -> dict[str, set[str]]:
    """Each column's distinct values in a history (nulls left out; an absent column has none), read
    on the driver from the Parquet columns' dictionaries (a few distinct values in millions of
    records)."""
    import pyarrow.parquet as pq

    present = set(pq.read_schema(path).names)
    read = [c for c in columns if c in present]
    f = pq.ParquetFile(path, read_dictionary=read)
    out: dict[str, set[str]] = {c: set() for c in columns}
    for i in range(f.num_row_groups):
        table = f.read_row_group(i, columns=read)
        for name, col in zip(read, table.columns, strict=True):
            for chunk in col.chunks:
                out[name].update(x for x in chunk.dictionary.to_pylist() if x is not None)
    return out


WHOLE_STAGE_ROWS = 200_000
ORDERED_ROWS = 200_000
"""Below this many records every id takes the ordered pass: one job, where the hash aggregate,
the count of ids needing order and the ordered pass for those are three."""
ADAPTIVE_ROWS = 200_000
ROWS_PER_PARTITION = 500_000
DISK_ONLY_ROWS = 2_000_000
SPLIT_BYTES = 32 << 20


def shuffle_partitions(rows: int, cores: int) -> int:
    """One partition for a small history (every extra task is pure overhead), at least one per core
    once there is work for each, about ROWS_PER_PARTITION records each above that (a sort of that
    many fits the default 1 GB heap), at most 400."""
    n = rows // ROWS_PER_PARTITION
    if rows >= cores * ROWS_PER_PARTITION // 4:
        n = max(n, cores)
    return max(1, min(400, n))


class _Job:
    def __init__(
        self,
        spark: Any,
        h: Any,
        scope: Scope,
        rows: int,
        names: list[str],
        *,
        passes: str | None = None,
        streams: bool = True,
        dead_letters: bool = True,
    ) -> None:
        """``streams``: whether the histories have a stream's operations (holdings, reads, seeks);
        without them every stream anomaly part is empty and is not asked of Spark (a queue's check of
        a default run: some twenty stages fewer, 5.1 s to 3.0-3.5 s on a warm session).
        ``dead_letters``: whether they name a dead-letter queue; without one no id is dead-lettered
        and the history is not read for them."""
        self.spark = spark
        self.h = h
        self.scope = scope
        self.rows = rows
        self.names = names
        self.streams = streams
        self.dead_letters = dead_letters
        if passes not in (None, "both", "ordered"):
            raise ValueError(f"passes: 'both' or 'ordered', not {passes!r}")
        self.passes = passes or ("ordered" if rows < ORDERED_ROWS else "both")
        # A small history's check is one job after the per-id pass: its latency histograms exact (no
        # refinement) and the lists that only some counts call for computed with the rest, used
        # where the counts call for them.
        self.one_job = self.passes == "ordered" and rows < ORDERED_ROWS
        self.hist_bits = EXACT_BITS if self.one_job else HIST_BITS
        self.cached: list[Any] = []
        spark.conf.set(
            "spark.sql.shuffle.partitions",
            str(shuffle_partitions(rows, default_parallelism(spark))),
        )
        # Adaptive execution runs each shuffle stage as a job of its own and re-plans after it: on a
        # history of one shuffle partition there is nothing to adapt, only that overhead.
        spark.conf.set("spark.sql.adaptive.enabled", str(rows >= ADAPTIVE_ROWS).lower())
        # Compiling a whole stage into one method costs more than it saves on a small history.
        spark.conf.set("spark.sql.codegen.wholeStage", str(rows >= WHOLE_STAGE_ROWS).lower())
        # Nor is generating and compiling each operator's expressions: a small history's check is
        # some fifty stages whose code (fault windows, drain spans and heal times are literals in
        # it) is new for every history, for a few thousand rows each. Interpreted, the check's
        # aggregates job took 14 s where it took 27-48 s compiled (one warm session, load 19-26).
        # Spark's interpreted and generated expressions are the same functions (its
        # ``spark.sql.codegen.factoryMode``: FALLBACK is its default).
        spark.conf.set(
            "spark.sql.codegen.factoryMode", "FALLBACK" if rows >= WHOLE_STAGE_ROWS else "NO_CODEGEN"
        )
        # Splits of the history small enough that a task's partial per-id aggregate (an id's records
        # are near each other in the file) fits its share of a 1 GB heap instead of spilling.
        spark.conf.set("spark.sql.files.maxPartitionBytes", str(SPLIT_BYTES))
        # Likewise after a shuffle: adaptive execution merges partitions up to this many shuffled
        # bytes, and a per-id partition's hash table is many times its shuffled size.
        spark.conf.set("spark.sql.adaptive.advisoryPartitionSizeInBytes", str(SPLIT_BYTES // 2))

    def persist(self, df: Any) -> Any:
        """``df`` computed once, now, and kept on the executors, its plan cut to a scan of what was
        kept: the jobs that read it plan in moments (Spark analyses and optimises every plan that
        reads a merely cached one whole) and never compute it twice. Memory first for a small
        history; disk only for a big one, whose blocks read back from disk into the heap whole
        under MEMORY_AND_DISK and overflow a 1 GB driver."""
        from pyspark import StorageLevel

        big = self.rows > DISK_ONLY_ROWS
        df = df.localCheckpoint(
            eager=True, storageLevel=StorageLevel.DISK_ONLY if big else StorageLevel.MEMORY_AND_DISK
        )
        self.cached.append(df)
        return df

    def release(self) -> None:
        """Drop what ``persist`` kept (the blocks of a local checkpoint outlive the job otherwise).
        In process, through the JVM; over Spark Connect, the server releases a kept table when its
        last DataFrame here is gone (``CachedRemoteRelation``), which clearing the list does."""
        for df in self.cached:
            jdf = getattr(df, "_jdf", None)  # a Spark Connect DataFrame has none
            if jdf is None:
                continue
            try:
                jdf.queryExecution().logical().rdd().unpersist(False)
            except Exception:  # noqa: BLE001 - a plan that is not a kept scan: nothing of ours to free
                pass
        self.cached.clear()

    def check(self, ctx: Context) -> Results:
        facts = self.reconcile(ctx)
        progress("spark", "done", lost=facts.counts["lost"])
        return assemble("spark", ctx, facts)

    def aggregates(
        self,
    ) -> tuple[dict[int, _Metrics], dict[int, LiveFacts], list[tuple[list[dict], dict[str, Any]]]]:
        """Per run: every count, table, timeline and first histogram, the liveness facts and the
        anomaly classes (one job)."""
        ev = self.events()
        _attempts, j, units = self.per_id(ev)
        got = collect_parts(
            [
                tagged(self.metric_rows(j, units), "metrics"),
                window_parts(self.ordered_sources(j)),
                *anomaly_parts(self.h, j, streams=self.streams),
            ]
        )
        rows = got.get("metrics", [])
        return (
            _parse_metrics(rows, self.scope, got.get("order_n", [])),
            parse_live(rows, got, self.scope),
            parse_anomalies(got, len(self.scope.ctxs)),
        )

    def events(self) -> Any:
        return events(self.h, self.scope)

    def reconcile(self, ctx: Context) -> Facts:
        """Two jobs after the per-id pass, for a history of any size: the aggregates with every
        capped list, then the first refinement of the latency percentiles with the lists that only
        the counts say are needed; further refinements only while a wanted rank is not yet on one
        exact value."""
        from pyspark.sql import functions as F

        ev = self.events()
        attempts_l1, j, units = self.per_id(ev)
        stranded = [stranded_part(j)] if self.scope.drain_reads else []
        first = collect_parts(
            [
                tagged(self.metric_rows(j, units), "metrics"),
                window_parts([list_source(self.list_rows(j)), *self.ordered_sources(j)]),
                *stranded,
                *anomaly_parts(self.h, j, streams=self.streams),
            ]
        )
        live = parse_live(first.get("metrics", []), first, self.scope)[0]
        positions, stream = parse_anomalies(first, 1)[0]
        metrics = (
            _parse_metrics(first.get("metrics", []), self.scope, first.get("order_n", [])).get(0)
            or _Metrics.empty()
        )
        counts = metrics.counts
        undigested = counts.pop("undigested")
        progress("spark", "reconciled", messages=counts["attempted"], consumed=counts["consumed_total"])
        lists, corrupted = _unpack_lists(first.get("lists", []))
        progress(
            "spark",
            "lists",
            lost=len(lists["lost"]),
            unexpected=len(lists["unexpected"]),
            corrupted=len(corrupted),
        )

        ok_att = attempts_l1.filter(F.col("o") == "ok").select(F.expr(confirm_us_sql()).alias("v"))
        e2e = j.filter((F.col("attempts") > 0) & (F.col("delivered") > 0)).select(
            F.expr(E2E_US_SQL).alias("v")
        )
        ranks = Ranks({"confirm": (ok_att, metrics.hist["confirm"]), "e2e": (e2e, metrics.hist["e2e"])})
        while (refine := ranks.query()) is not None:
            ranks.feed(collect_parts([refine]).get("rank", []))
        confirm_us, e2e_us = ranks.result().values()
        progress("spark", "latency", confirmed_attempts=confirm_us[0], delivered=e2e_us[0])

        return Facts(
            counts=counts,
            lost=lists["lost"],
            lost_by_cause=metrics.lost_by_cause,
            ack_unknown=lists["ack_unknown"],
            unexpected=lists["unexpected"],
            duplicated=lists["duplicated"],
            recovered=lists["recovered"],
            resurrected=lists["resurrected"],
            corrupted=sorted(corrupted, key=lambda d: d["delivery"]["index"]),
            split_brain=lists["split_brain"],
            unflagged=lists["unflagged"],
            undigested=undigested,
            order_violations=lists["order"],
            attribution_rows=metrics.attribution_rows,
            exposure_rows=metrics.exposure_rows,
            confirm_us=confirm_us,
            e2e_us=e2e_us,
            availability=metrics.availability,
            timeline=metrics.timeline,
            latency_timeline=metrics.latency_timeline,
            live=live,
            positions=positions,
            stream=stream,
        )

    def per_id(self, ev: Any) -> tuple[Any, Any, list[Unit]]:
        """(publish attempts, one row per id with its flags, the kept tables they are read from),
        persisted: both jobs read them."""
        attempts, j, tangled, units = classify(ev, self.scope, self.names, self.persist, passes=self.passes)
        progress(
            "spark",
            "per id",
            **({"ordered_pass_ids": tangled} if tangled >= 0 else {"ordered_pass": "every id"}),
        )
        return attempts, j, units

    def metric_rows(self, j: Any, units: list[Unit]) -> Any:
        """Every count, table, timeline and first histogram of every run: rows for ``_parse_metrics``,
        from one aggregate (one shuffle).

        Each kept table's rows (``units``) become the few keyed metric rows they feed (an id's
        counts, keyed by its flags; its lost cause, exposure bits and end-to-end latency bucket; a
        publish attempt's fault-window bits, confirm latency and bucket), the history's records
        their timeline bucket, each order violation and dead-lettered id a row of its own: each a
        struct under a tag with up to two string and two long keys, VALUES values summed, a minimum
        and a maximum, all summed per (run, tag, keys) in one aggregate over the union of them. Only
        these few thousand rows per run reach the driver.
        """
        from pyspark.sql import functions as F

        exposure = self._exposure_conds()
        in_window = self._window_conds()
        rows = []
        for u in units:
            df = self.scope.add(u.df, "x_bucket")
            structs: list[Any] = []
            if u.ids:
                structs += [_count_metric(), *_id_metrics(exposure, self.hist_bits)]
            if u.attempt is not None:
                structs += _attempt_metrics(
                    f"{u.attempt}." if u.attempt else "",
                    in_window,
                    F.col(u.attempt).isNotNull() if u.attempt else None,
                    self.hist_bits,
                )
            rows.append(df.select("run", F.explode(F.array(*structs)).alias("m")))
        timeline = _metric(
            "timeline", keys={"l1": bucket("time_ns", "x_bucket"), "s1": F.col("f"), "s2": F.col("type")}
        )
        history = F.array(timeline, *live_metrics(self.h, self.scope, _metric))
        rows.append(self.scope.add(self.h, "x_bucket").select("run", F.explode(history).alias("m")))
        if self.dead_letters:
            rows.append(self._dead_lettered().select("run", _metric("dead").alias("m")))
        one = reduce(lambda a, b: a.unionByName(b), rows).filter(F.col("m").isNotNull())
        summed = one.groupBy("run", "m.tag", "m.s1", "m.s2", "m.l1", "m.l2").agg(
            *[F.sum(f"m.v{i}").alias(f"v{i}") for i in range(VALUES)],
            F.min("m.mn").alias("mn"),
            F.max("m.mx").alias("mx"),
        )
        return summed.select(
            "run",
            "tag",
            "s1",
            "s2",
            "l1",
            "l2",
            F.array(*[f"v{i}" for i in range(VALUES)]).alias("v"),
            "mn",
            "mx",
        )

    def _dead_lettered(self) -> Any:
        """(run, id) of every id consumed from a dead-letter queue: an ack ok there (schema 1: a
        delivery), as the Python engine counts ``dead_lettered``."""
        from pyspark.sql import functions as F

        acks, k = self.scope.scalar("x_acks"), F.col("k")
        consumed = (acks & (k == "ao")) | (~acks & (k == "d"))
        return (
            self.events()
            .filter(consumed & F.col("queue").endswith(DEAD_LETTER_SUFFIX))
            .select("run", "id")
            .distinct()
        )

    def _exposure_conds(self) -> list[Any]:
        """Per fault kind (``_kinds``) the condition that a confirmed id was exposed to it: a
        fault of that kind began before the drain ended and ended after the confirm. Per run and
        kind that is ``c_t <= T``, T the latest end of such a fault: compared on the row, no array
        per row."""
        from pyspark.sql import functions as F

        ctxs = dict(sorted(self.scope.ctxs.items()))
        conds = []
        for kind in _kinds(self.scope):
            latest = [
                max(
                    (w["end_ns"] for w in c.windows if w["kind"] == kind and w["start_ns"] <= c.drain_end_ns),
                    default=None,
                )
                for c in ctxs.values()
            ]
            conds.append(F.col("c_t") <= self.scope.per_run(latest, "bigint"))
        return conds

    def _window_conds(self) -> Callable[[Any], list[Any]]:
        """Per fault window (``_window_ids``) the condition that an attempt's invoke time (the
        column given) fell in it."""
        ctxs = dict(sorted(self.scope.ctxs.items()))
        bounds = []
        for i in range(max((len(v) for v in _window_ids(self.scope).values()), default=0)):
            ws = [c.windows[i] if i < len(c.windows) else None for c in ctxs.values()]
            bounds.append(
                (
                    self.scope.per_run([w and w["start_ns"] for w in ws], "bigint"),
                    self.scope.per_run([w and w["end_ns"] for w in ws], "bigint"),
                )
            )

        def conds(it: Any) -> list[Any]:
            return [(it >= start) & (it <= end) for start, end in bounds]

        return conds

    def ordered_sources(self, j: Any) -> list[Any]:
        """The rows of ``window_parts`` besides the lists: the order check's deliveries, the liveness
        gaps' ok records, the lost positions' ids."""
        gaps = gap_source(ok_records(self.h, self.scope), publish_records(self.h))
        return [order_source(j), gaps, positions_source(j)]

    def list_rows(self, j: Any) -> Any:
        """Every capped detail list's rows (list, o, js) from one read of the per-id rows: each flagged
        id once per list it is on (a listed message with its first deliveries; a corrupted one with
        its first corrupted delivery) and each unflagged redelivery (``uf``); ``window_parts`` keeps
        the first LIST_CAP of each list by its order, and adds the order violations."""
        from pyspark.sql import functions as F

        common = [
            *(F.col(c).alias(_LISTED_AS.get(c, c)) for c in _LISTED),
            F.slice("ds", 1, DELIVERY_CAP).alias("deliveries"),
        ]
        specs = {
            "lost": ("is_lost", F.col("c_i")),
            "ack_unknown": ("is_ack_unknown", F.col("c_i")),
            "unexpected": ("is_unexpected", F.col("first_consumed")),
            "duplicated": ("is_dup", F.col("first_d.index")),
            "recovered": ("is_recovered", F.col("first_consumed")),
            "resurrected": ("is_resurrected", F.col("res_first.index")),
            "split_brain": ("is_split", F.col("first_ack.index")),
            "corrupted": ("is_corrupted", F.col("bad_first.index")),
        }
        on = [
            F.when(F.col(flag), F.struct(F.lit(name).alias("list"), order.cast("long").alias("o")))
            for name, (flag, order) in specs.items()
        ]
        flagged = j.filter(reduce(lambda a, b: a | b, [F.col(flag) for flag, _order in specs.values()]))
        rows = flagged.select("run", _json(*common).alias("js"), F.explode(F.array(*on)).alias("e"))
        rows = rows.filter(F.col("e").isNotNull()).select("run", "e.list", "e.o", "js")
        rows = rows.select("run", "list", "o", "js")
        uf = (
            j.filter(F.size("uf") > 0)
            .select("run", "id", F.explode("uf").alias("u"))
            .select("run", "id", "u.*")
        )
        cols = [c for c in uf.columns if c != "run"]
        return rows.unionByName(
            uf.select(
                "run", F.lit("unflagged").alias("list"), F.col("index").alias("o"), _json(*cols).alias("js")
            )
        )


_LISTED = (
    "id attempts outcome fi_t c_t c_n delivered consumed cause abandon_cause first_ack res_n res_first n_bad bad_first"
).split()
"""The per-id columns (``ids.derive``) a listed message's JSON carries (``list_rows``), with the
first deliveries; those a result names otherwise are renamed (``_LISTED_AS``)."""
_LISTED_AS = {
    "fi_t": "first_invoke_ns",
    "c_t": "confirm_ns",
    "c_n": "confirm_node",
    "first_ack": "ack",
    "res_n": "deliveries_after",
    "res_first": "delivery",
}


def _json(*cols: Any) -> Any:
    from pyspark.sql import functions as F

    return F.to_json(F.struct(*cols), {"ignoreNullFields": "false"})


def _kinds(scope: Scope) -> list[str]:
    """The fault kinds of every run, in the order of the exposure bits."""
    return sorted({w["kind"] for c in scope.ctxs.values() for w in c.windows})


def _window_ids(scope: Scope) -> dict[int, list[str]]:
    """Each run's fault window ids, in the order of the availability bits."""
    return {run: [w["fault_id"] for w in c.windows] for run, c in sorted(scope.ctxs.items())}


def _parse_metrics(rows: list[Any], scope: Scope, order_n: list[dict]) -> dict[int, _Metrics]:
    """Each run's metrics from the rows of ``_Job.metric_rows`` (Spark rows, or their JSON as dicts)
    and the order violations' counts (``window_parts``'s ``order_n``: one row per partition)."""
    kinds, windows = _kinds(scope), _window_ids(scope)
    runs: dict[int, _Metrics] = {}
    for r in order_n:
        runs.setdefault(r["run"], _Metrics.empty()).order += int(r["n"])
    for r in rows:
        m = runs.setdefault(r["run"], _Metrics.empty())
        tag, vals = r["tag"], [int(x) for x in r["v"]]
        if tag == "count":  # per kept table of ids and set of flags (``_count_metric``)
            for name, v in _counts(int(r["l1"]), vals).items():
                m.counts[name] += v
        elif tag == "cause":
            m.lost_by_cause.append((r["s1"], r["s2"], vals[0]))
        elif tag == "exposure":  # missing: lost, unreachable or stuck (``verdict.missing_class``)
            missing = int(r["l1"]) & 1
            for kind in _named(int(r["l1"]) >> 1, int(r["l2"]), kinds, "none"):
                kk = m.by_kind.setdefault(kind, [0, 0])
                kk[0] += vals[0]
                if missing:
                    kk[1] += vals[0]
                    by_node = m.missing_by_kind_node
                    by_node[(kind, r["s2"])] = by_node.get((kind, r["s2"]), 0) + vals[0]
        elif tag == "avail":
            for w in _named(int(r["l1"]), int(r["l2"]), windows[r["run"]], "outside"):
                total, ok = m.availability.get(w, (0, 0))
                m.availability[w] = (total + vals[0], ok + vals[1])
        elif tag == "timeline":
            m.timeline.append((int(r["l1"]), r["s1"], r["s2"], vals[0]))
        elif tag == "latency":
            m.latency_timeline.append((int(r["l1"]), vals[0], vals[1], int(r["mx"])))
        elif tag.startswith("hist:"):
            s, key = int(r["l1"]), int(r["l2"])
            m.hist[tag[5:]].append((key << s, (key + 1) << s, vals[0]))
        elif tag == "dead":
            m.counts["dead_lettered"] = vals[0]
        # live_ok and live_pub rows are parse_live's.
    for m in runs.values():
        m.counts["order_violations"] = m.order
        m.exposure_rows = [(kind, x[0], x[1]) for kind, x in m.by_kind.items()]
        # Rows of several bit sets name the same kind and node: one row each.
        m.attribution_rows = [(kind, node, n) for (kind, node), n in m.missing_by_kind_node.items()]
    progress(
        "spark",
        "aggregates",
        runs=len(runs),
        rows=sum(len(m.timeline) + len(m.latency_timeline) for m in runs.values()),
    )
    return runs


BITS = 62
"""Conditions per long of ``_bit_chunks`` (a sum of distinct powers of two below 2^62)."""


def _bit_chunks(conds: list[Any]) -> list[tuple[Any, Any]]:
    """``(chunk, bits)`` per BITS conditions (one pair, unless there are more): condition c is bit
    c % BITS of pair c // BITS, and ``chunk`` is that number doubled plus 1 where any condition
    held, so ``_named`` tells a row that met none."""
    from pyspark.sql import functions as F

    longs = [
        reduce(
            lambda a, b: a + b,
            [F.when(c, 1 << i).otherwise(0).cast("long") for i, c in enumerate(conds[k : k + BITS])],
        )
        for k in range(0, len(conds), BITS)
    ] or [F.lit(0).cast("long")]
    met = reduce(lambda a, b: a | b, [F.coalesce(c, F.lit(False)) for c in conds], F.lit(False)).cast("long")
    return [(F.lit(2 * k) + met, bits) for k, bits in enumerate(longs)]


_SLOTS = {"s1": "string", "s2": "string", "l1": "long", "l2": "long"}
"""The keys a metric row of ``_Job.metric_rows`` may have, and their types."""
VALUES = 7
"""The values a metric row carries, each summed per key."""


def _metric(
    tag: str,
    *,
    keys: dict[str, Any] | None = None,
    v: list[Any] | None = None,
    mn: Any = None,
    mx: Any = None,
    when: Any = None,
) -> Any:
    """One keyed metric row of ``_Job.metric_rows``: a tag, its keys (s1, s2: strings; l1, l2: longs),
    VALUES values summed per key (v0: 1 where none are given; the rest 0 where not given), a
    minimum and a maximum."""
    from pyspark.sql import functions as F

    keys = keys or {}
    vals = [F.coalesce(x.cast("long"), F.lit(0)) for x in (v if v is not None else [F.lit(1)])]
    vals += [F.lit(0).cast("long")] * (VALUES - len(vals))
    m = F.struct(
        F.lit(tag).alias("tag"),
        *[(keys[k] if k in keys else F.lit(None)).cast(t).alias(k) for k, t in _SLOTS.items()],
        *[x.alias(f"v{i}") for i, x in enumerate(vals)],
        (mn if mn is not None else F.lit(None)).cast("long").alias("mn"),
        (mx if mx is not None else F.lit(None)).cast("long").alias("mx"),
    )
    return F.when(when, m) if when is not None else m


def _flag(c: str | Any) -> Any:
    from pyspark.sql import functions as F

    col = F.col(c) if isinstance(c, str) else c
    return F.when(col, 1).otherwise(0)


def _hist_keys(v: str, bits: int) -> dict[str, Any]:
    """The first latency histogram's bucket of ``v`` (an SQL expression, >= 0): (shift, v >> shift),
    2^bits buckets per power of two (EXACT_BITS: one bucket per value)."""
    from pyspark.sql import functions as F

    shift = f"greatest(if(({v}) > 0, length(bin({v})), 0) - {bits}, 0)"
    return {"l1": F.expr(shift), "l2": F.expr(f"shiftright({v}, {shift})")}


_COUNT_FLAGS = (
    ("attempted", "attempts > 0"),
    ("confirmed", "outcome = 'ok'"),
    ("failed", "outcome = 'fail'"),
    ("unknown", "outcome = 'info'"),
    ("delivered_unique", "delivered > 0"),
    ("consumed_unique", "consumed > 0"),
    ("lost", "is_lost"),
    ("ack_unknown", "is_ack_unknown"),
    ("unexpected", "is_unexpected"),
    ("corrupted", "is_corrupted"),
    ("duplicated", "is_dup"),
    ("resurrected", "is_resurrected"),
    ("recovered", "is_recovered"),
    ("split_brain", "is_split"),
)
"""The counts of ids with a flag: bit i of a count row's key is the i-th condition."""
_COUNT_SUMS = (
    ("publish_attempts", "attempts"),
    ("delivered_total", "delivered"),
    ("consumed_total", "consumed"),
    ("abandoned", "abandons"),
    ("unflagged_redeliveries", "unflagged"),
    ("undigested", "undigested"),
)
"""The counts summed over ids: value i + 1 of a count row (value 0 counts its ids)."""


def _count_metric() -> Any:
    """An id's row's share of the counts (_COUNT_NAMES): keyed by its flags (``_COUNT_FLAGS``), so
    the ids of a run sum to a few rows, one per set of flags met; its sums (``_COUNT_SUMS``)."""
    from pyspark.sql import functions as F

    bits = reduce(
        lambda a, b: a + b,
        [F.when(F.expr(cond), 1 << i).otherwise(0).cast("long") for i, (_n, cond) in enumerate(_COUNT_FLAGS)],
    )
    return _metric("count", keys={"l1": bits}, v=[F.lit(1), *[F.col(c) for _n, c in _COUNT_SUMS]])


def _counts(bits: int, vals: list[int]) -> dict[str, int]:
    """What a count row (``_count_metric``) adds to each count."""
    out = {name: vals[0] if bits >> i & 1 else 0 for i, (name, _c) in enumerate(_COUNT_FLAGS)}
    return out | {name: vals[i + 1] for i, (name, _c) in enumerate(_COUNT_SUMS)}


def _id_metrics(exposure: list[Any], hist_bits: int) -> list[Any]:
    """The keyed metric rows an id's row feeds: its lost cause, its exposure bits, its end-to-end
    latency bucket."""
    from pyspark.sql import functions as F

    col = F.col
    return [
        _metric("cause", keys={"s1": col("cause"), "s2": col("abandon_cause")}, when=col("is_lost")),
        *[
            _metric(
                "exposure",
                keys={"l1": chunk * 2 + col("is_lost").cast("long"), "l2": bits, "s2": col("c_n")},
                when=col("outcome") == "ok",
            )
            for chunk, bits in _bit_chunks(exposure)
        ],
        _metric(
            "hist:e2e",
            keys=_hist_keys(E2E_US_SQL, hist_bits),
            when=(col("attempts") > 0) & (col("delivered") > 0),
        ),
    ]


def _attempt_metrics(
    prefix: str, in_window: Callable[[Any], list[Any]], present: Any, hist_bits: int
) -> list[Any]:
    """What a publish attempt feeds (its columns it, o and dt under ``prefix``; ``present``: the
    row has one, None for always): its fault-window bits, and when confirmed its latency bucket
    and first-histogram bucket."""
    from pyspark.sql import functions as F

    def at(c: str) -> Any:
        return F.col(prefix + c)

    ok = at("o") == "ok"
    if present is not None:
        ok = present & ok
    latency = confirm_us_sql(prefix)
    return [
        *[
            _metric("avail", keys={"l1": chunk, "l2": bits}, v=[F.lit(1), _flag(ok)], when=present)
            for chunk, bits in _bit_chunks(in_window(at("it")))
        ],
        _metric(
            "latency",
            keys={"l1": bucket(prefix + "dt", "x_bucket")},
            v=[F.lit(1), F.expr(latency)],
            mx=F.expr(latency),
            when=ok,
        ),
        _metric("hist:confirm", keys=_hist_keys(latency, hist_bits), when=ok),
    ]


E2E_US_SQL = "greatest((first_d.time_ns - fi_t) div 1000, 0)"
"""An id's end-to-end latency in microseconds: first invoke to first delivery."""


def confirm_us_sql(prefix: str = "") -> str:
    """A confirmed attempt's latency in microseconds: invoke to confirm (its columns under ``prefix``)."""
    return f"greatest(({prefix}dt - {prefix}it) div 1000, 0)"


def _named(chunk: int, bits: int, names: list[str], none: str) -> list[str]:
    """What a ``_bit_chunks`` pair met: the names of its chunk's set bits, or ``none`` (said once, on
    the first chunk's row) when it met no condition at all."""
    if not chunk & 1:
        return [none] if chunk >> 1 == 0 else []
    base = (chunk >> 1) * BITS
    return [names[base + i] for i in range(BITS) if bits >> i & 1]


_WITH_DELIVERIES = ("lost", "ack_unknown", "unexpected", "duplicated", "recovered")
_LISTS = ("lost", "ack_unknown", "unexpected", "duplicated", "recovered", "resurrected", "split_brain")
_ROWS = ("unflagged", "order")
"""Lists of ``window_parts`` whose rows are deliveries, not ids."""


def _unpack_lists(rows: list[dict]) -> tuple[dict[str, list[dict]], list[dict]]:
    """The capped lists in their order from the ``lists`` rows of ``window_parts``, and the corrupted list."""
    lists: dict[str, list[tuple[int, dict]]] = {name: [] for name in (*_LISTS, *_ROWS)}
    corrupted = []
    for row in rows:
        name, o, d = row["list"], row["o"], json.loads(row["js"])
        if name in _ROWS:
            lists[name].append((o, d))
            continue
        n_bad, bad_first, deliveries = (d.pop(c) for c in ("n_bad", "bad_first", "deliveries"))
        if name == "corrupted":
            corrupted.append({"id": d["id"], "deliveries": n_bad, "delivery": bad_first})
            continue
        if name != "lost":  # a cause is a lost message's alone
            d["cause"] = d["abandon_cause"] = None
        if name in _WITH_DELIVERIES:
            d["deliveries"] = deliveries
        lists[name].append((o, d))
    # A list's rows are its first LIST_CAP already, but the order violations' are each partition's.
    return {
        name: [d for _o, d in sorted(v, key=lambda x: x[0])][:LIST_CAP] for name, v in lists.items()
    }, corrupted


_COUNT_NAMES = (*(k for k in COUNT_KEYS if k != "stuck"), "undigested")
"""Every count a run's rows add to (``stuck`` is told from the drain, after them)."""

HIST_BITS = 8
"""The first latency histogram splits each power of two into 2^HIST_BITS buckets."""
EXACT_BITS = 63
"""A histogram of one bucket per value (no long is wider): exact from the first job, for a small
history, whose distinct latencies are at most its records."""


@dataclass
class _Metrics:
    counts: dict[str, int] = field(default_factory=dict)
    lost_by_cause: list[tuple[str, str | None, int]] = field(default_factory=list)
    by_kind: dict[str, list[int]] = field(default_factory=dict)
    missing_by_kind_node: dict[tuple[str, str | None], int] = field(default_factory=dict)
    attribution_rows: list[tuple[str, str | None, int]] = field(default_factory=list)
    exposure_rows: list[tuple[str, int, int]] = field(default_factory=list)
    availability: dict[str, tuple[int, int]] = field(default_factory=dict)
    timeline: list[tuple[int, str | None, str | None, int]] = field(default_factory=list)
    latency_timeline: list[tuple[int, int, int, int]] = field(default_factory=list)
    hist: dict[str, list[tuple[int, int, int]]] = field(default_factory=lambda: {"confirm": [], "e2e": []})
    order: int = 0

    @classmethod
    def empty(cls) -> _Metrics:
        """A run without a client record has no row in any aggregate: every count is zero (an empty
        history has no timeline row either, so the order count is set here too)."""
        return cls(counts=dict.fromkeys(_COUNT_NAMES, 0))


_SMALL = ("index", "time_ns", "process", "node", "type", "f", "queue", "value", "error")


def _small_rows(path: Path) -> list[dict]:
    """The nemesis, drain and depth records (a handful), read on the driver.

    The driver reads the file's footer anyway; this saves a Spark job before the real one.
    Only the two short columns that pick them are read whole; the rest only in the row
    groups that hold one (decoding every message id of a big history took seconds).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    present = set(f.schema_arrow.names)
    columns = [c for c in _SMALL if c in present]
    rows: list[dict] = []
    for i in range(f.num_row_groups):
        keys = f.read_row_group(i, columns=["process", "f"])
        mask = pc.or_kleene(pc.equal(keys["process"], NEMESIS), pc.is_in(keys["f"], pa.array(SMALL_OPS)))
        if pc.any(mask).as_py():
            rows += f.read_row_group(i, columns=columns).filter(mask).to_pylist()
    for r in rows:
        for c in _SMALL:
            r.setdefault(c, None)
    return rows


@dataclass(frozen=True)
class _Footer:
    rows: int
    max_time: int | None  # None: no statistics, scan for it
    min_schema: int | None  # None: no statistics (or nulls in the column), scan for it


def _footer(meta: Any) -> _Footer:
    """Row count, max(time_ns) and min(schema) from the Parquet footer, saving scans when stats exist."""

    def stat(name: str, pick: Any) -> int | None:
        if name not in meta.schema.names:
            return None
        col = meta.schema.names.index(name)
        best: int | None = None
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(col).statistics
            if stats is None or not stats.has_min_max or (stats.has_null_count and stats.null_count):
                return None
            value = pick(stats)
            best = value if best is None else min(best, value) if pick is _min else max(best, value)
        return best

    return _Footer(rows=meta.num_rows, max_time=stat("time_ns", _max), min_schema=stat("schema", _min))


def _min(stats: Any) -> int:
    return int(stats.min)


def _max(stats: Any) -> int:
    return int(stats.max)
