"""The Spark reconciliation job.

It never brings a whole history to the driver: the only things collected are the
nemesis and drain ops (a handful), aggregates, capped lists and histograms of at
most a few tens of thousands of buckets. Everything per message stays in Spark,
where it spills to disk when the driver's heap (spark.driver.memory, 1g by default)
is too small to hold it.

Per message id, one shuffle does the work: the client records are partitioned by id
and sorted by index once; two window passes over that order say, for each record,
whether an ack of the id had already completed ok, which abandon came last, and
which ack invoke an ack's completion closes; one aggregate then reduces each id to
its counts and firsts. The expected body digest is Spark SQL (sha2, repeat,
substring), computed only for attempted ids that were delivered with a digest.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.spec.history import arrow_schema
from harness.spec.results import LIST_CAP, Results

from ._common import (
    ABANDONED,
    DELIVERY_CAP,
    HISTORY_COLUMNS,
    NEMESIS,
    NEVER_DELIVERED,
    NS_PER_S,
    PERCENTILES,
    UNACKED,
    Context,
    Facts,
    assemble,
    history_path,
    make_context,
    progress,
    quiet,
    rank_for,
    summarize,
)
from ._warmup import warm_up

DEFAULT_DRIVER_MEMORY = "1g"
ID_RE_JAVA = r"(?s)^(.*):([0-9]{1,18})\z"

_session: Any = None
_session_key: tuple[str, str] | None = None
_session_lock = threading.Lock()
_warming: threading.Thread | None = None


def start_session_in_background(master: str | None = None, driver_memory: str | None = None) -> threading.Thread:
    """Start the JVM while something else (a run's workload) goes on, and check a tiny history with
    every kind of finding on it (``_warmup``), so the real check finds the classes loaded, the JIT warm
    and the job's code generated. A check started meanwhile waits for it.

    A failure here is not reported: the check starts the session again and says why.
    """
    global _warming

    def start() -> None:
        try:
            spark_session(master, driver_memory)
            with quiet():
                warm_up(lambda d, s: _check(d, s, master, driver_memory))
        except Exception:  # noqa: BLE001 - the check reports it, with the real context
            pass

    thread = threading.Thread(target=start, name="spark-session", daemon=True)
    thread.start()
    _warming = thread
    return thread


def spark_session(master: str | None = None, driver_memory: str | None = None) -> Any:
    """One session per process: JVM start-up is paid once for every run checked.

    The driver's heap is fixed when the JVM starts; asking for another size later in
    the same process keeps the first one (Spark cannot resize a running JVM). A caller
    that asks while a background start is under way waits for it.
    """
    with _session_lock:
        return _spark_session(master, driver_memory)


def _spark_session(master: str | None, driver_memory: str | None) -> Any:
    global _session, _session_key
    from pyspark.sql import SparkSession

    master = master or os.environ.get("BROKERCHAOS_SPARK_MASTER") or "local[*]"
    memory = driver_memory or os.environ.get("BROKERCHAOS_SPARK_DRIVER_MEMORY") or DEFAULT_DRIVER_MEMORY
    if _session is not None and _session_key is not None and _session_key[0] == master:
        return _session
    if _session is not None:
        _session.stop()
    progress("spark", "starting session", master=master, driver_memory=memory)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName("brokerchaos-reconcile")
        .config("spark.driver.memory", memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.ansi.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{_log_config()}")
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pyspark's pandas-version notice
        _session = builder.getOrCreate()
    _session.sparkContext.setLogLevel("WARN")
    _session_key = (master, memory)
    return _session


_LOG4J2 = """
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark %p %c{1}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
# Caching a big history spills to disk by design when the heap is small; not worth a warning per block.
logger.memstore.name = org.apache.spark.storage.memory.MemoryStore
logger.memstore.level = error
logger.blockmgr.name = org.apache.spark.storage.BlockManager
logger.blockmgr.level = error
"""


def _log_config() -> Path:
    """Spark's own chatter down to warnings, written where the JVM can read it."""
    path = Path(tempfile.gettempdir()) / "brokerchaos-spark-log4j2.properties"
    if not path.is_file() or path.read_text() != _LOG4J2:
        path.write_text(_LOG4J2)
    return path


def stop_session() -> None:
    """Stop the shared session (tests and benchmarks that want a clean JVM)."""
    global _session, _session_key
    with _session_lock:
        if _session is not None:
            _session.stop()
        _session, _session_key = None, None


def _column_types() -> dict[str, str]:
    """Spark SQL types of the contract's Arrow schema (an absent optional column reads as a typed null)."""
    import pyarrow as pa

    sql = {pa.int64(): "bigint", pa.int32(): "int", pa.string(): "string", pa.bool_(): "boolean"}
    return {f.name: sql[f.type] for f in arrow_schema()}


_DELIVERY = ("index", "time_ns", "node", "queue", "process", "redelivered")


def check_spark(run_dir: Path, scenario: dict, *, spark_master: str | None = None,
                driver_memory: str | None = None) -> Results:
    """Reconcile a stored run with Spark; same results schema as check_python.

    With spark_master pointing at a real cluster, the run directory must be on a
    filesystem every executor can read at the same path.
    """
    warming = _warming
    if warming is not None and warming is not threading.current_thread():
        warming.join()
    return _check(run_dir, scenario, spark_master, driver_memory)


def _check(run_dir: Path, scenario: dict, spark_master: str | None, driver_memory: str | None) -> Results:
    conf = (scenario or {}).get("spark") or {}
    spark = spark_session(spark_master or conf.get("master"), driver_memory or conf.get("driver_memory"))
    history = _prepare(spark, Path(run_dir), scenario, 0)
    job = _Job(spark, history.h, _Scope(spark, {0: history.ctx}), history.ctx.ops)
    try:
        return job.check(history.ctx)
    finally:
        job.release()


def aggregate_runs(run_dirs: list[Path], scenarios: list[dict], *, spark_master: str | None = None
                   ) -> list[dict[str, Any]]:
    """Verdict, counts, drain and exposure of every run in one Spark job over all their histories.

    Each history is read with its run's number as a column; the run contexts (schema, bodies,
    fault windows, drain spans) travel as a broadcast table joined by that number; every
    window, grouping and aggregate of the job is per (run, message id) or per run. The
    capped lists and latency percentiles of a single check are not computed: grading does
    not read them.
    """
    spark = spark_session(spark_master)
    histories = [_prepare(spark, Path(d), s, i) for i, (d, s) in enumerate(zip(run_dirs, scenarios, strict=True))]
    h = histories[0].h
    for x in histories[1:]:
        h = h.unionByName(x.h)
    ctxs = {i: x.ctx for i, x in enumerate(histories)}
    job = _Job(spark, h, _Scope(spark, ctxs), sum(c.ops for c in ctxs.values()))
    try:
        metrics = job.aggregates()
    finally:
        job.release()
    out = []
    for i, ctx in ctxs.items():
        m = metrics.get(i) or _Metrics.empty()
        out.append(summarize("spark", ctx, m.counts, m.exposure_rows))
    return out


@dataclass(frozen=True)
class _History:
    h: Any  # the records, HISTORY_COLUMNS and the run's number
    ctx: Context


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
    h = raw.select(F.lit(run).alias("run"), *[F.col(c) if c in present else F.lit(None).cast(types[c]).alias(c)
                                              for c in HISTORY_COLUMNS])
    ops, end_ns, schema = footer.rows, footer.max_time, footer.min_schema
    if end_ns is None:
        ops, end_ns = h.agg(F.count(F.lit(1)), F.max("time_ns")).first()
    if "schema" not in present:
        schema = 1
    elif schema is None:
        schema = h.agg(F.min(F.coalesce("schema", F.lit(1)))).first()[0]
    small = _small_rows(path)
    ctx = make_context(int(ops), end_ns, small, scenario, schema)
    progress("spark", "prelude", ops=int(ops), faults=len(ctx.windows), drain_ops=len(small),
             schema=ctx.history_schema)
    return _History(h=h, ctx=ctx)


_SPAN = "struct<p:string,q:string,lo:bigint,hi:bigint,n:string,e:bigint>"
_WINDOW = "struct<id:string,k:string,s:bigint,e:bigint>"
_SCOPE_TYPES = {"x_acks": "boolean", "x_bodies": "boolean", "x_seed": "bigint", "x_size": "bigint",
                "x_spans": f"array<{_SPAN}>", "x_windows": f"array<{_WINDOW}>", "x_drain_end": "bigint",
                "x_bucket": "bigint"}


class _Scope:
    """What the job needs of each run's context, as columns next to the records: literals when the
    job checks one run, a broadcast table joined by run number when it checks many."""

    def __init__(self, spark: Any, ctxs: dict[int, Context]) -> None:
        self.ctxs = ctxs
        self.table = None
        if len(ctxs) > 1:
            ddl = ", ".join(["run int", *[f"{k} {t}" for k, t in _SCOPE_TYPES.items()]])
            self.table = spark.createDataFrame([(i, *_scope_values(c).values()) for i, c in ctxs.items()], ddl)

    def add(self, df: Any, *names: str) -> Any:
        from pyspark.sql import functions as F

        if self.table is None:
            (ctx,) = self.ctxs.values()
            values = _scope_values(ctx)
            return df.withColumns({n: _literal(n, values[n]) for n in names})
        return df.join(F.broadcast(self.table.select("run", *names)), "run")


_FIELDS = {"x_spans": ("p", "q", "lo", "hi", "n", "e"), "x_windows": ("id", "k", "s", "e")}


def _literal(name: str, value: Any) -> Any:
    """A scope value as a typed literal column (arrays of structs built field by field)."""
    from pyspark.sql import functions as F

    if name not in _FIELDS:
        return F.lit(value).cast(_SCOPE_TYPES[name])
    if not value:
        return F.expr(f"cast(array() as {_SCOPE_TYPES[name]})")
    return F.array(*[F.struct(*[F.lit(v).alias(f) for f, v in zip(_FIELDS[name], row, strict=True)])
                     for row in value]).cast(_SCOPE_TYPES[name])


def _scope_values(ctx: Context) -> dict[str, Any]:
    p = ctx.params
    return {"x_acks": ctx.acks, "x_bodies": ctx.check_bodies, "x_seed": p.seed, "x_size": p.message_size,
            "x_spans": [(s.process, s.queue, s.lo, s.hi, s.node, s.empty_at_ns) for s in ctx.spans],
            "x_windows": [(w["fault_id"], w["kind"], w["start_ns"], w["end_ns"]) for w in ctx.windows],
            "x_drain_end": ctx.drain_end_ns, "x_bucket": ctx.bucket_s}


WHOLE_STAGE_ROWS = 200_000
ROWS_PER_PARTITION = 500_000
DISK_ONLY_ROWS = 2_000_000


def shuffle_partitions(rows: int, cores: int) -> int:
    """One partition for a small history (every extra task is pure overhead), at least one per core
    once there is work for each, about ROWS_PER_PARTITION records each above that (a sort of that
    many fits the default 1 GB heap), at most 400."""
    n = rows // ROWS_PER_PARTITION
    if rows >= cores * ROWS_PER_PARTITION // 4:
        n = max(n, cores)
    return max(1, min(400, n))


class _Job:
    def __init__(self, spark: Any, h: Any, scope: _Scope, rows: int) -> None:
        self.spark = spark
        self.h = h
        self.scope = scope
        self.rows = rows
        self.cached: list[Any] = []
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions(rows, spark.sparkContext.defaultParallelism)))
        # Compiling a whole stage into one method costs more than it saves on a small history.
        spark.conf.set("spark.sql.codegen.wholeStage", str(rows >= WHOLE_STAGE_ROWS).lower())

    def persist(self, df: Any) -> Any:
        """Memory first for a small history; disk only for a big one, whose cached blocks read back
        from disk into the heap whole under MEMORY_AND_DISK and overflow a 1 GB driver."""
        from pyspark import StorageLevel

        big = self.rows > DISK_ONLY_ROWS
        df = df.persist(StorageLevel.DISK_ONLY if big else StorageLevel.MEMORY_AND_DISK)
        self.cached.append(df)
        return df

    def release(self) -> None:
        for df in self.cached:
            df.unpersist()

    def check(self, ctx: Context) -> Results:
        facts = self.reconcile(ctx)
        progress("spark", "done", lost=facts.counts["lost"])
        return assemble("spark", ctx, facts)

    @property
    def delays(self) -> bool:
        """Some run has delayed publishes: the order check looks for them (``_order_violation_rows``)."""
        return any(c.params.delays for c in self.scope.ctxs.values())

    def aggregates(self) -> dict[int, _Metrics]:
        """Per run: every count, table, timeline and first histogram (one job)."""
        ev = self.events()
        attempts, j = self.per_id(ev)
        return self.metrics(ev, attempts, j)

    def events(self) -> Any:
        """Client records that matter per message id, each tagged with its kind ``k``.

        p publish, d delivery; with acks (schema 2) also ai/ao/af/an ack invoke, ok,
        fail, info (anything else that is not invoke, ok or fail is indeterminate), and
        ab abandon invoke.
        """
        from pyspark.sql import functions as F

        f, ty = F.col("f"), F.col("type")
        ack = F.col("x_acks") & (f == "ack")
        kind = (F.when(f == "publish", "p").when((f == "consume") & (ty == "ok"), "d")
                .when(ack & (ty == "invoke"), "ai").when(ack & (ty == "ok"), "ao")
                .when(ack & (ty == "fail"), "af").when(ack, "an")
                .when(F.col("x_acks") & (f == "abandon") & (ty == "invoke"), "ab"))
        client = ~F.col("process").eqNullSafe(NEMESIS) & F.col("value").isNotNull()
        return (self.scope.add(self.h.filter(client), "x_acks")
                .select("run", F.col("value").alias("id"), "index", "type", "time_ns", "node", "queue", "process",
                        "redelivered", "digest", "detail", kind.alias("k"))
                .filter(F.col("k").isNotNull()))

    def reconcile(self, ctx: Context) -> Facts:
        """Two jobs for a history of any size: the aggregates, then every capped list with the first
        refinement of the latency percentiles; further refinements only while a wanted rank is not
        yet on one exact value."""
        from pyspark.sql import functions as F

        ev = self.events()
        attempts_l1, j = self.per_id(ev)
        metrics = self.metrics(ev, attempts_l1, j).get(0) or _Metrics.empty()
        counts = metrics.counts
        undigested = counts.pop("undigested")
        progress("spark", "reconciled", messages=counts["attempted"], consumed=counts["consumed_total"])

        ok_att = attempts_l1.filter(F.col("o") == "ok").select(
            F.greatest(F.expr("(dt - it) div 1000"), F.lit(0)).alias("v"))
        e2e = j.filter((F.col("attempts") > 0) & (F.col("delivered") > 0)).select(
            F.greatest(F.expr("(first_d.time_ns - fi_t) div 1000"), F.lit(0)).alias("v"))
        ranks = _Ranks({"confirm": (ok_att, metrics.hist["confirm"]), "e2e": (e2e, metrics.hist["e2e"])})
        parts = self.detail_parts(ev, j, counts)
        refine = ranks.query()
        got = _collect_parts(parts + ([refine] if refine is not None else []))
        lists = _unpack_lists(got)
        progress("spark", "lists", lost=len(lists["lost"]), unexpected=len(lists["unexpected"]),
                 corrupted=len(got.get("corrupted", [])))
        ranks.feed(got.get("rank", []))
        while (refine := ranks.query()) is not None:
            ranks.feed(_collect_parts([refine]).get("rank", []))
        confirm_us, e2e_us = ranks.result().values()
        progress("spark", "latency", confirmed_attempts=confirm_us[0], delivered=e2e_us[0])

        def by_index(part: str, key: Any) -> list[dict]:
            return sorted(got.get(part, []), key=key)

        return Facts(
            counts=counts, lost=lists["lost"], lost_by_cause=metrics.lost_by_cause,
            ack_unknown=lists["ack_unknown"], unexpected=lists["unexpected"], duplicated=lists["duplicated"],
            recovered=lists["recovered"], resurrected=lists["resurrected"],
            corrupted=by_index("corrupted", lambda d: d["delivery"]["index"]),
            split_brain=lists["split_brain"], unflagged=by_index("unflagged", lambda d: d["index"]),
            undigested=undigested, order_violations=by_index("order", lambda d: d["index"]),
            attribution_rows=metrics.attribution_rows, exposure_rows=metrics.exposure_rows,
            confirm_us=confirm_us, e2e_us=e2e_us, availability=metrics.availability, timeline=metrics.timeline,
            latency_timeline=metrics.latency_timeline,
        )

    def per_id(self, ev: Any) -> tuple[Any, Any]:
        """Two aggregation levels over one shuffle by id; returns (publish attempts, one row per id).

        The records of an id are sorted by index once; window passes over that order
        number the publish attempts and the acks. A publish completion closes the
        earliest invoke of the id still waiting (FIFO); with x the running count of
        completions minus invokes, completions that found nothing waiting number
        max(0, max x before), so the matched ones are those where x does not exceed
        that, and the m-th matched completion closes the m-th invoke. The k-th ack
        completion of a (process, id) closes its k-th ack invoke. Level one groups each
        attempt (invoke with its completion) and each ack pair, the rest of an id's
        records in one more group; level two, on the same partitioning (no second
        shuffle), reduces them to the id. Every aggregate is a count, sum, min or max.
        """
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        k, idx, ty = F.col("k"), F.col("index"), F.col("type")

        def one(cond: Any) -> Any:
            return F.when(cond, 1).otherwise(0)

        def n(cond: Any) -> Any:
            return F.sum(one(cond))

        p_inv = (k == "p") & (ty == "invoke")
        p_done = (k == "p") & (ty != "invoke")
        w = Window.partitionBy("run", "id").orderBy("index")
        upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        before = w.rowsBetween(Window.unboundedPreceding, -1)
        cause = F.get_json_object("detail", "$.cause")
        # Without acks (schema 1) no record has an ack or abandon kind: these columns stay null.
        cols = {"v": F.sum(one(p_inv)).over(upto), "c": F.sum(one(p_done)).over(upto),
                "ack_before": F.min(F.when(k == "ao", idx)).over(before),
                "ab_before": F.max(F.when(k == "ab", F.struct(idx.alias("index"), cause.alias("cause")))).over(before)}
        ew = ev.withColumns(cols).withColumn("x", F.col("c") - F.col("v"))
        ew = ew.withColumn("dropped", F.greatest(F.coalesce(F.max("x").over(before), F.lit(0)), F.lit(0)))
        pair = (F.when(p_inv, F.col("v"))
                .when(p_done & (F.col("x") <= F.col("dropped")), F.col("c") - F.col("dropped")))
        wa = (Window.partitionBy("run", "id", "process").orderBy("index")
              .rowsBetween(Window.unboundedPreceding, Window.currentRow))
        closes = k.isin("ao", "af", "an")
        ack_no = (F.when(k == "ai", F.sum(one(k == "ai")).over(wa))
                  .when(closes, F.sum(one(closes)).over(wa)))
        group = (F.when(pair.isNotNull(), F.struct(F.lit("p").alias("g"), F.lit(None).cast("string").alias("proc"),
                                                   pair.cast("long").alias("n")))
                 .when(ack_no.isNotNull(), F.struct(F.lit("a").alias("g"), F.col("process").alias("proc"),
                                                    ack_no.cast("long").alias("n"))))
        resurrecting = (k == "d") & F.col("ack_before").isNotNull()
        unflagged = (k == "d") & F.col("ab_before").isNotNull() & ~F.col("redelivered").eqNullSafe(True)
        ew = ew.withColumn("grp", F.coalesce(group, F.struct(F.lit("o").alias("g"), F.lit(None).cast("string")
                                                              .alias("proc"), F.lit(0).cast("long").alias("n"))))
        is_d = k == "d"
        delivery = F.struct(*_DELIVERY)
        l1 = ew.groupBy("run", "id", "grp").agg(
            F.max(F.when(p_inv, idx)).alias("ii"), F.max(F.when(p_inv, F.col("time_ns"))).alias("it"),
            F.max(F.when(p_done & (F.col("grp.g") == "p"), F.struct(idx.alias("di"), F.col("time_ns").alias("dt"),
                                                                    F.col("node").alias("dn"), ty.alias("dtype"))))
            .alias("done"),
            F.max(F.when(k == "ai", idx)).alias("a_inv"), F.max(F.when(k == "an", idx)).alias("a_info"),
            n(is_d).alias("delivered"), F.max(F.when(is_d, idx)).alias("last_d"),
            F.min(F.when(is_d, delivery)).alias("first_d"),
            F.min(F.when(is_d, F.col("digest"))).alias("dig_min"), F.max(F.when(is_d, F.col("digest"))).alias("dig_max"),
            n(is_d & F.col("digest").isNotNull()).alias("n_dig"), n(is_d & F.col("digest").isNull()).alias("undigested"),
            n(k == "ao").alias("acked"),
            F.min(F.when(k == "ao", F.struct("index", "time_ns", "node", "process", "queue"))).alias("first_ack"),
            n(k == "ab").alias("abandons"),
            F.max(F.when(k == "ab", F.struct(idx.alias("index"), cause.alias("cause")))).alias("last_ab"),
            n(resurrecting).alias("res_n"), F.min(F.when(resurrecting, delivery)).alias("res_first"),
            n(unflagged).alias("unflagged"),
        ).withColumn("o", F.when(F.col("grp.g") != "p", None).when(F.col("done.dtype").isin("ok", "fail"),
                                                                   F.col("done.dtype")).otherwise("info"))
        l1 = self.persist(l1)
        is_att = F.col("grp.g") == "p"
        fst = F.min(F.when(is_att, F.struct(F.col("ii"), F.col("it")))).alias("fi")
        agg = l1.groupBy("run", "id").agg(
            n(is_att).alias("attempts"), fst,
            F.max(F.col("o") == "ok").alias("has_ok"), F.max(F.col("o") == "info").alias("has_info"),
            F.min(F.when(F.col("o") == "ok", F.col("done"))).alias("c"),
            F.max(F.when(F.col("a_inv") < F.col("a_info"), F.col("a_inv"))).alias("ack_info_inv"),
            F.sum("delivered").alias("delivered"), F.max("last_d").alias("last_d"), F.min("first_d").alias("first_d"),
            F.min("dig_min").alias("dig_min"), F.max("dig_max").alias("dig_max"), F.sum("n_dig").alias("n_dig"),
            F.sum("undigested").alias("undigested"), F.sum("acked").alias("acked"),
            F.min("first_ack").alias("first_ack"), F.sum("abandons").alias("abandons"),
            F.max("last_ab").alias("last_ab"), F.sum("res_n").alias("res_n"), F.min("res_first").alias("res_first"),
            F.sum("unflagged").alias("unflagged"),
        )
        outcome = (F.when(F.col("attempts") == 0, "none").when(F.col("has_ok"), "ok")
                   .when(F.col("has_info"), "info").otherwise("fail"))
        base = self.scope.add(agg.withColumn("outcome", outcome), "x_acks", "x_bodies", "x_seed", "x_size", "x_spans")
        consumed = F.when(F.col("x_acks"), F.col("acked")).otherwise(F.col("delivered"))
        unacked = (F.col("outcome") == "ok") & (consumed == 0)
        ack_unknown = unacked & F.col("ack_info_inv").isNotNull() & (
            F.col("last_d").isNull() | (F.col("ack_info_inv") > F.col("last_d")))
        # The expected digest only where bodies are known and there is a digest to compare: null elsewhere.
        need = F.col("x_bodies") & (F.col("attempts") > 0) & (F.col("n_dig") > 0)
        base = base.withColumn("payload", F.when(need, F.expr(payload_sql("id", "x_seed", "x_size"))))
        base = base.withColumn("exp", F.expr(digest_sql(body_from_payload_sql("id", "payload"))))
        exp = F.col("exp")
        fa = F.col("first_ack")
        split = fa.isNotNull() & F.exists("x_spans", lambda s: (
            (s["p"] == fa["process"]) & s["q"].eqNullSafe(fa["queue"]) & (fa["index"] > s["lo"])
            & (fa["index"] < s["hi"]) & ~s["n"].eqNullSafe(fa["node"]) & (fa["time_ns"] > s["e"])))
        j = self.persist(base.select(
            "run", "id", "attempts", "outcome", F.col("fi.it").alias("fi_t"),
            F.col("c.di").alias("c_i"), F.col("c.dt").alias("c_t"), F.col("c.dn").alias("c_n"),
            "delivered", consumed.alias("consumed"), "first_d", "undigested", "abandons", "unflagged",
            "first_ack", "res_n", "res_first",
            F.when(F.col("x_acks"), fa["index"]).otherwise(F.col("first_d.index")).alias("first_consumed"),
            F.when(F.col("delivered") == 0, NEVER_DELIVERED)
            .when(F.col("last_ab.index") > F.col("last_d"), ABANDONED).otherwise(UNACKED).alias("cause"),
            F.when((F.col("delivered") > 0) & (F.col("last_ab.index") > F.col("last_d")), F.col("last_ab.cause"))
            .alias("abandon_cause"),
            (unacked & ~ack_unknown).alias("is_lost"),
            ack_unknown.alias("is_ack_unknown"),
            ((F.col("attempts") == 0) & (consumed > 0)).alias("is_unexpected"),
            (consumed > 1).alias("is_dup"),
            (F.col("outcome").isin("fail", "info") & (consumed > 0)).alias("is_recovered"),
            (F.col("res_n") > 0).alias("is_resurrected"),
            "exp", (exp.isNotNull() & ((F.col("dig_min") != exp) | (F.col("dig_max") != exp))).alias("is_corrupted"),
            split.alias("is_split"),
        ))
        attempts = l1.filter(is_att).select("run", "it", "o", F.col("done.dt").alias("dt"))
        return attempts, j

    def metrics(self, ev: Any, attempts: Any, j: Any) -> dict[int, _Metrics]:
        """Every count, table, timeline and first histogram of every run in one job: a union of small
        aggregates.

        Each branch groups its own rows by run and under a tag with up to two string and
        two long keys and an array of long values; only these few thousand rows per run
        reach the driver.
        """
        from pyspark.sql import functions as F

        def n(cond: Any) -> Any:
            return F.sum(F.when(cond, 1).otherwise(0))

        def branch(df: Any, tag: str, keys: dict[str, Any], values: list[Any]) -> Any:
            slots = {"s1": "string", "s2": "string", "l1": "long", "l2": "long"}
            grouped = df.groupBy("run", *[v.alias(s) for s, v in keys.items()])
            out = grouped.agg(F.array(*[F.coalesce(x.cast("long"), F.lit(0)) for x in values]).alias("v"))
            return out.select("run", F.lit(tag).alias("tag"),
                              *[(F.col(s) if s in keys else F.lit(None)).cast(t).alias(s) for s, t in slots.items()],
                              "v")

        count_cols = [
            n(F.col("attempts") > 0), n(F.col("outcome") == "ok"), n(F.col("outcome") == "fail"),
            n(F.col("outcome") == "info"), F.sum("attempts"), n(F.col("delivered") > 0), F.sum("delivered"),
            n(F.col("consumed") > 0), F.sum("consumed"), F.sum("abandons"), n(F.col("is_lost")),
            n(F.col("is_ack_unknown")), n(F.col("is_unexpected")), n(F.col("is_corrupted")), n(F.col("is_dup")),
            n(F.col("is_resurrected")), n(F.col("is_recovered")), n(F.col("is_split")), F.sum("unflagged"),
            F.sum("undigested"),
        ]
        add = self.scope.add
        it = F.col("it")
        wids = F.transform(F.filter("x_windows", lambda w: (it >= w["s"]) & (it <= w["e"])), lambda w: w["id"])
        drain_end, c_t = F.col("x_drain_end"), F.col("c_t")
        kinds = F.array_distinct(F.transform(
            F.filter("x_windows", lambda w: (w["s"] <= drain_end) & (w["e"] >= c_t)), lambda w: w["k"]))
        exposed = add(j.filter(F.col("outcome") == "ok"), "x_windows", "x_drain_end").select(
            "run", "c_n", "is_lost", F.explode(F.when(F.size(kinds) == 0, F.array(F.lit("none"))).otherwise(kinds))
            .alias("kind"))
        ok_att = add(attempts.filter(F.col("o") == "ok"), "x_bucket").select(
            "run", "dt", "x_bucket", F.greatest(F.expr("(dt - it) div 1000"), F.lit(0)).alias("v"))
        e2e = j.filter((F.col("attempts") > 0) & (F.col("delivered") > 0)).select(
            "run", F.greatest(F.expr("(first_d.time_ns - fi_t) div 1000"), F.lit(0)).alias("v"))
        shift = f"greatest(if(v > 0, length(bin(v)), 0) - {HIST_BITS}, 0)"
        hist_keys = {"l1": F.expr(shift), "l2": F.expr(f"shiftright(v, {shift})")}
        parts = [
            branch(j, "count", {}, count_cols),
            branch(j.filter("is_lost"), "cause", {"s1": F.col("cause"), "s2": F.col("abandon_cause")},
                   [F.count(F.lit(1))]),
            branch(exposed, "exposure", {"s1": F.col("kind"), "s2": F.col("c_n"), "l1": F.col("is_lost").cast("long")},
                   [F.count(F.lit(1))]),
            branch(add(attempts, "x_windows").select("run", F.explode(F.when(F.size(wids) == 0, F.array(F.lit("outside"))).otherwise(wids))
                                   .alias("w"), "o"), "avail", {"s1": F.col("w")},
                   [F.count(F.lit(1)), n(F.col("o") == "ok")]),
            branch(add(self.h, "x_bucket"), "timeline", {"l1": _bucket("time_ns", "x_bucket"), "s1": F.col("f"), "s2": F.col("type")},
                   [F.count(F.lit(1))]),
            branch(ok_att, "latency", {"l1": _bucket("dt", "x_bucket")},
                   [F.count(F.lit(1)), F.sum("v"), F.max("v")]),
            branch(ok_att, "hist:confirm", hist_keys, [F.count(F.lit(1))]),
            branch(e2e, "hist:e2e", hist_keys, [F.count(F.lit(1))]),
            branch(_order_violation_rows(ev, self.delays), "order", {}, [F.count(F.lit(1))]),
        ]
        df = parts[0]
        for p in parts[1:]:
            df = df.unionByName(p)
        runs: dict[int, _Metrics] = {}
        for r in df.collect():
            m = runs.setdefault(r["run"], _Metrics.empty())
            tag, vals = r["tag"], [int(x) for x in r["v"]]
            if tag == "count":
                m.counts = dict(zip(_COUNT_NAMES, vals, strict=True))
            elif tag == "cause":
                m.lost_by_cause.append((r["s1"], r["s2"], vals[0]))
            elif tag == "exposure":
                kk = m.by_kind.setdefault(r["s1"], [0, 0])
                kk[0] += vals[0]
                if r["l1"]:
                    kk[1] += vals[0]
                    m.attribution_rows.append((r["s1"], r["s2"], vals[0]))
            elif tag == "avail":
                m.availability[r["s1"]] = (vals[0], vals[1])
            elif tag == "timeline":
                m.timeline.append((int(r["l1"]), r["s1"], r["s2"], vals[0]))
            elif tag == "latency":
                m.latency_timeline.append((int(r["l1"]), vals[0], vals[1], vals[2]))
            elif tag.startswith("hist:"):
                s, key = int(r["l1"]), int(r["l2"])
                m.hist[tag[5:]].append((key << s, (key + 1) << s, vals[0]))
            elif tag == "order":
                m.order = vals[0]
        for m in runs.values():
            m.counts["order_violations"] = m.order
            m.exposure_rows = [(kind, x[0], x[1]) for kind, x in m.by_kind.items()]
        progress("spark", "aggregates", runs=len(runs), rows=sum(len(m.timeline) + len(m.latency_timeline)
                                                                 for m in runs.values()))
        return runs

    def detail_parts(self, ev: Any, j: Any, counts: dict[str, int]) -> list[Any]:
        """The capped detail lists (each the first LIST_CAP by its order), the listed ids' first
        deliveries (a broadcast join of at most a few thousand ids), and the corrupted, unflagged and
        out-of-order lists when the counts say there is anything to list: parts of one job."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        common = ["id", "attempts", "outcome", F.col("fi_t").alias("first_invoke_ns"), F.col("c_t").alias("confirm_ns"),
                  F.col("c_n").alias("confirm_node"), "delivered", "consumed", "cause", "abandon_cause",
                  F.col("first_ack").alias("ack"), F.col("res_n").alias("deliveries_after"),
                  F.col("res_first").alias("delivery")]
        specs = {"lost": ("is_lost", F.col("c_i")), "ack_unknown": ("is_ack_unknown", F.col("c_i")),
                 "unexpected": ("is_unexpected", F.col("first_consumed")),
                 "duplicated": ("is_dup", F.col("first_d.index")),
                 "recovered": ("is_recovered", F.col("first_consumed")),
                 "resurrected": ("is_resurrected", F.col("res_first.index")),
                 "split_brain": ("is_split", F.col("first_ack.index"))}
        parts, listed = [], None
        for name, (flag, order) in specs.items():
            top = j.filter(F.col(flag)).select(order.alias("o"), *common).orderBy("o").limit(LIST_CAP)
            parts.append(_tagged(top, name))
            if name in _WITH_DELIVERIES:
                listed = top.select("id") if listed is None else listed.unionByName(top.select("id"))
        k = F.col("k")
        deliveries = ev.filter(k == "d")
        assert listed is not None
        parts.append(_tagged(deliveries.join(F.broadcast(listed.distinct()), "id").groupBy("id").agg(
            F.slice(F.sort_array(F.collect_list(F.struct(*_DELIVERY))), 1, DELIVERY_CAP).alias("ds")), "deliveries"))
        if counts["corrupted"]:
            bad = j.filter("is_corrupted").select("id", "exp")
            parts.append(_tagged(
                deliveries.filter(F.col("digest").isNotNull()).join(bad, "id").filter(F.col("digest") != F.col("exp"))
                .groupBy("id").agg(F.count(F.lit(1)).alias("deliveries"),
                                   F.min(F.struct(*_DELIVERY, "digest", "detail")).alias("delivery"))
                .orderBy("delivery.index").limit(LIST_CAP), "corrupted"))
        if counts["unflagged_redeliveries"]:
            before = Window.partitionBy("id").orderBy("index").rowsBetween(Window.unboundedPreceding, -1)
            ab = F.struct(F.col("index").alias("index"), F.get_json_object("detail", "$.cause").alias("cause"))
            parts.append(_tagged(
                ev.filter(k.isin("d", "ab")).withColumn("ab_before", F.max(F.when(k == "ab", ab)).over(before))
                .filter((k == "d") & F.col("ab_before").isNotNull() & ~F.col("redelivered").eqNullSafe(True))
                .orderBy("index").limit(LIST_CAP)
                .select("id", *_DELIVERY, F.col("ab_before.index").alias("abandon_index"),
                        F.col("ab_before.cause").alias("abandon_cause")), "unflagged"))
        if counts["order_violations"]:
            parts.append(_tagged(_order_violation_rows(ev, self.delays).drop("run").orderBy("index").limit(LIST_CAP), "order"))
        return parts


_WITH_DELIVERIES = ("lost", "ack_unknown", "unexpected", "duplicated", "recovered")
_LISTS = ("lost", "ack_unknown", "unexpected", "duplicated", "recovered", "resurrected", "split_brain")


def _tagged(df: Any, part: str) -> Any:
    """One part of a combined job: its rows as JSON text under a tag, so parts of any shape share a union."""
    from pyspark.sql import functions as F

    row = F.to_json(F.struct(*[F.col(c) for c in df.columns]), {"ignoreNullFields": "false"})
    return df.select(F.lit(part).alias("part"), row.alias("js"))


def _collect_parts(parts: list[Any]) -> dict[str, list[dict]]:
    """Run the tagged parts as one job; their rows by tag."""
    df = parts[0]
    for p in parts[1:]:
        df = df.unionByName(p)
    out: dict[str, list[dict]] = {}
    for r in df.collect():
        out.setdefault(r["part"], []).append(json.loads(r["js"]))
    return out


def _unpack_lists(got: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The capped lists in their order, each listed message with its first deliveries."""
    deliveries = {d["id"]: d["ds"] for d in got.get("deliveries", [])}
    out: dict[str, list[dict]] = {}
    for name in _LISTS:
        rows = sorted(got.get(name, []), key=lambda d: d["o"])
        for d in rows:
            del d["o"]
            if name != "lost":  # a cause is a lost message's alone
                d["cause"] = d["abandon_cause"] = None
            if name in _WITH_DELIVERIES:
                d["deliveries"] = deliveries.get(d["id"], [])
        out[name] = rows
    return out



_COUNT_NAMES = ("attempted", "confirmed", "failed", "unknown", "publish_attempts", "delivered_unique",
                "delivered_total", "consumed_unique", "consumed_total", "abandoned", "lost", "ack_unknown",
                "unexpected", "corrupted", "duplicated", "resurrected", "recovered", "split_brain",
                "unflagged_redeliveries", "undigested")

HIST_BITS = 8
"""The first latency histogram splits each power of two into 2^HIST_BITS buckets."""


@dataclass
class _Metrics:
    counts: dict[str, int] = field(default_factory=dict)
    lost_by_cause: list[tuple[str, str | None, int]] = field(default_factory=list)
    by_kind: dict[str, list[int]] = field(default_factory=dict)
    attribution_rows: list[tuple[str, str | None, int]] = field(default_factory=list)
    exposure_rows: list[tuple[str, int, int]] = field(default_factory=list)
    availability: dict[str, tuple[int, int]] = field(default_factory=dict)
    timeline: list[tuple[int, str | None, str | None, int]] = field(default_factory=list)
    latency_timeline: list[tuple[int, int, int, int]] = field(default_factory=list)
    hist: dict[str, list[tuple[int, int, int]]] = field(default_factory=lambda: {"confirm": [], "e2e": []})
    order: int = 0

    @classmethod
    def empty(cls) -> _Metrics:
        """A run without a client record has no row in any aggregate: every count is zero."""
        return cls(counts=dict.fromkeys(_COUNT_NAMES, 0))


def _order_violation_rows(ev: Any, delays: bool) -> Any:
    """Deliveries (not flagged redelivered) of a producer's id with a lower seq than one the same
    consumer already got from that producer on that queue; a delayed publish has no place in that
    order (``delays``: the scenario has some, so they are looked for)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    d = ev.filter((F.col("k") == "d") & ~F.col("redelivered").eqNullSafe(True))
    if delays:
        delayed = (ev.filter((F.col("k") == "p") & (F.col("type") == "invoke")
                             & F.get_json_object("detail", "$.delay_ms").isNotNull()).select("run", "id").distinct())
        d = d.join(delayed, ["run", "id"], "left_anti")
    oc = (d
          .withColumn("producer", F.regexp_extract("id", ID_RE_JAVA, 1))
          .withColumn("seqs", F.regexp_extract("id", ID_RE_JAVA, 2))
          .filter(F.col("seqs") != "")
          .withColumn("seq", F.col("seqs").cast("long")))
    w = (Window.partitionBy("run", "process", "queue", "producer").orderBy("index")
         .rowsBetween(Window.unboundedPreceding, -1))
    return (oc.withColumn("after_seq", F.max("seq").over(w))
            .filter(F.col("seq") < F.col("after_seq"))
            .select("run", F.col("process").alias("consumer"), "queue", "producer", "id", "seq", "after_seq", "index"))


def payload_sql(mid: str, seed: int | str, size: str) -> str:
    """The seeded filler of ``harness.spec.message_body`` in Spark SQL (mid, seed, size: SQL expressions)."""
    head = f"concat({mid}, '|')"
    n = f"greatest(0, ({size}) - char_length({head}) - 17)"
    return f"substring(repeat(sha2(concat(cast({seed} as string), ':', {mid}), 256), ({n}) div 64 + 1), 1, {n})"


def body_from_payload_sql(mid: str, payload: str) -> str:
    """``id|check|payload``, check being the first 16 hex digits of the payload's sha256."""
    return f"concat({mid}, '|', substring(sha2({payload}, 256), 1, 16), '|', {payload})"


def digest_sql(body: str) -> str:
    """``harness.spec.body_digest`` in Spark SQL."""
    return f"substring(sha2({body}, 256), 1, 32)"


def _bucket(name: str, width_s: str) -> Any:
    """Exact floor division on longs (Spark's div truncates toward zero): the timeline bucket
    (width_s: an SQL expression)."""
    from pyspark.sql import functions as F

    def floordiv(x: str, d: int | str) -> str:
        return f"((({x}) - pmod(({x}), {d})) div {d})"

    return F.expr(f"{floordiv(floordiv(name, NS_PER_S), width_s)} * {width_s}")


_SMALL = ("index", "time_ns", "process", "node", "type", "f", "queue", "value", "error")


def _small_rows(path: Path) -> list[dict]:
    """The nemesis and drain records (a handful), read on the driver with a pushed-down filter.

    The driver reads the file's footer anyway; this saves a Spark job before the real one.
    """
    import pyarrow.parquet as pq

    present = set(pq.read_schema(path).names)
    columns = [c for c in _SMALL if c in present]
    table = pq.read_table(path, columns=columns, filters=[[("process", "=", NEMESIS)], [("f", "=", "drain")]])
    rows = table.to_pylist()
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


class _Ranks:
    """Exact nearest-rank order statistics of long columns "v" (values >= 0), several series at once.

    A full sort of a hundred million latencies is what this avoids: the first
    histogram (2^HIST_BITS buckets per power of two, at most ~16k buckets) comes with
    the other aggregates; each refinement (``query``, then ``feed`` its rows) splits only
    the buckets that hold a wanted rank, 2^16 ways, for every series in one job, until
    each wanted rank sits on one exact value. Only bucket counts reach the driver.
    """

    def __init__(self, series: dict[str, tuple[Any, list[tuple[int, int, int]]]]) -> None:
        self.series = series
        self.out: dict[str, tuple[int, dict[str, int | None]]] = {}
        self.pending: dict[tuple[str, str], tuple[int, int, int]] = {}
        for name, (_df, first) in series.items():
            buckets = sorted(first)
            total = sum(b[2] for b in buckets)
            self.out[name] = (total, {})
            if total == 0:
                continue
            wanted = {f"p{p}": rank_for(p, total) for p in PERCENTILES}
            wanted["max"] = total
            for stat, rank in wanted.items():
                self.pending[(name, stat)] = _locate(buckets, rank)
        self.ranges: dict[str, list[tuple[int, int]]] = {}
        self._settle()

    def _settle(self) -> None:
        for key, (lo, hi, _rank) in list(self.pending.items()):
            if hi - lo == 1:
                self.out[key[0]][1][key[1]] = lo
                del self.pending[key]

    def query(self) -> Any:
        """The next refinement as a tagged part ("rank"), or None when every rank is exact."""
        from pyspark.sql import functions as F

        if not self.pending:
            return None
        self.ranges = {name: sorted({(lo, hi) for (s, _), (lo, hi, _r) in self.pending.items() if s == name})
                       for name in self.series}
        v = F.col("v")
        parts = []
        for name, rs in self.ranges.items():
            if not rs:
                continue
            tag, base, sh = F.lit(None).cast("int"), F.lit(None).cast("long"), F.lit(None).cast("int")
            for i, (lo, hi) in enumerate(rs):
                inside = (v >= F.lit(lo)) & (v < F.lit(hi))
                tag = F.when(inside, F.lit(i)).otherwise(tag)
                base = F.when(inside, F.lit(lo).cast("long")).otherwise(base)
                sh = F.when(inside, F.lit(max((hi - lo - 1).bit_length() - 16, 0))).otherwise(sh)
            parts.append(self.series[name][0].select(F.lit(name).alias("series"), tag.alias("t"), base.alias("b"),
                                                     sh.alias("sh"), "v").filter(F.col("t").isNotNull()))
        df = parts[0]
        for p in parts[1:]:
            df = df.unionByName(p)
        return _tagged(df.groupBy("series", "t", "b", "sh", F.expr("shiftright(v - b, sh)").alias("k")).count(), "rank")

    def feed(self, rows: list[dict]) -> None:
        split: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
        for r in rows:
            lo, s = int(r["b"]), int(r["sh"])
            split.setdefault((r["series"], int(r["t"])), []).append(
                (lo + (r["k"] << s), lo + ((r["k"] + 1) << s), int(r["count"])))
        for (name, stat), (lo, hi, rank) in list(self.pending.items()):
            i = self.ranges[name].index((lo, hi))
            self.pending[(name, stat)] = _locate(sorted(split[(name, i)]), rank)
        self._settle()

    def result(self) -> dict[str, tuple[int, dict[str, int | None]]]:
        assert not self.pending
        return self.out


def _locate(buckets: list[tuple[int, int, int]], rank: int) -> tuple[int, int, int]:
    """The bucket holding the rank-th smallest value, and the rank inside it."""
    seen = 0
    for lo, hi, count in buckets:
        if seen + count >= rank:
            return lo, hi, rank - seen
        seen += count
    raise ValueError(f"rank {rank} beyond {seen} values")
