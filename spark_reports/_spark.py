"""The Spark reconciliation job.

It never brings a whole history to the driver: the only things collected are the
nemesis and drain ops (a handful), aggregates, capped lists and histograms of at
most a few tens of thousands of buckets. Everything per message stays in Spark,
where it spills to disk when the driver's heap (spark.driver.memory, 1g by default)
is too small to hold it.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from ._common import (
    DELIVERY_CAP,
    HISTORY_COLUMNS,
    NEMESIS,
    NS_PER_S,
    PERCENTILES,
    Context,
    Facts,
    assemble,
    history_path,
    make_context,
    progress,
    rank_for,
)
from .schema import LIST_CAP, Results

DEFAULT_DRIVER_MEMORY = "1g"
ID_RE_JAVA = r"(?s)^(.*):([0-9]{1,18})\z"

_session: Any = None
_session_key: tuple[str, str] | None = None


def spark_session(master: str | None = None, driver_memory: str | None = None) -> Any:
    """One session per process: JVM start-up is paid once for every run checked.

    The driver's heap is fixed when the JVM starts; asking for another size later in
    the same process keeps the first one (Spark cannot resize a running JVM).
    """
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
    if _session is not None:
        _session.stop()
    _session, _session_key = None, None


def check_spark(run_dir: Path, scenario: dict, *, spark_master: str | None = None,
                driver_memory: str | None = None) -> Results:
    """Reconcile a stored run with Spark; same results schema as check_python.

    With spark_master pointing at a real cluster, the run directory must be on a
    filesystem every executor can read at the same path.
    """
    import pyarrow.parquet as pq

    path = history_path(Path(run_dir), allow_jsonl=False).resolve()
    conf = (scenario or {}).get("spark") or {}
    spark = spark_session(spark_master or conf.get("master"), driver_memory or conf.get("driver_memory"))
    n_rows, max_time = _footer(pq.ParquetFile(path).metadata)
    spark.conf.set("spark.sql.shuffle.partitions", str(max(1, min(400, n_rows // 500_000))))
    h = spark.read.parquet(str(path)).select(*HISTORY_COLUMNS)
    job = _Job(spark, h, n_rows, max_time)
    try:
        return job.run()
    finally:
        job.release()


class _Job:
    def __init__(self, spark: Any, h: Any, n_rows: int, max_time: int | None) -> None:
        self.spark = spark
        self.h = h
        self.n_rows, self.max_time = n_rows, max_time
        self.cached: list[Any] = []

    def persist(self, df: Any) -> Any:
        from pyspark import StorageLevel

        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        self.cached.append(df)
        return df

    def release(self) -> None:
        for df in self.cached:
            df.unpersist()

    def run(self) -> Results:
        from pyspark.sql import functions as F

        h = self.h
        ops, end_ns = self.n_rows, self.max_time
        if end_ns is None:
            ops, end_ns = h.agg(F.count(F.lit(1)), F.max("time_ns")).first()
        small = [r.asDict() for r in h.filter((F.col("process") == NEMESIS) | (F.col("f") == "drain"))
                 .select("index", "time_ns", "process", "node", "type", "f", "value").collect()]
        ctx = make_context(int(ops), end_ns, small)
        progress("spark", "prelude", ops=int(ops), faults=len(ctx.windows), drain_ops=len(small))
        facts = self.reconcile(ctx)
        progress("spark", "done", lost=facts.counts["lost"])
        return assemble("spark", ctx, facts)

    def reconcile(self, ctx: Context) -> Facts:
        from pyspark.sql import functions as F

        h = self.h
        client = ~F.col("process").eqNullSafe(NEMESIS) & F.col("value").isNotNull()
        pub = h.filter(client & (F.col("f") == "publish")).select(
            F.col("value").alias("id"), F.struct("index", "type", "time_ns", "node").alias("e"))
        pm = (pub.groupBy("id").agg(F.sort_array(F.collect_list("e")).alias("ev"))
              .select("id", F.expr(_PAIR).alias("a"), "ev")
              .select(
                  "id", "a", F.size("a").alias("attempts"), F.expr(_OUTCOME).alias("outcome"),
                  F.expr("try_element_at(filter(ev, e -> e.type = 'invoke'), 1).time_ns").alias("fi_t"),
                  F.expr("try_element_at(filter(a, x -> x.o = 'ok'), 1)").alias("c")))
        cons = h.filter(client & (F.col("f") == "consume") & (F.col("type") == "ok")).select(
            F.col("value").alias("id"), "index", "time_ns", "node", "queue", "process", "redelivered")
        cg = cons.groupBy("id").agg(
            F.count(F.lit(1)).alias("consumed"),
            F.slice(F.sort_array(F.collect_list(F.struct("index", "time_ns", "node", "queue", "process",
                                                         "redelivered"))), 1, DELIVERY_CAP).alias("deliveries"))
        j = self.persist(pm.join(cg, "id", "full_outer").select(
            "id", "a", F.coalesce("attempts", F.lit(0)).alias("attempts"),
            F.coalesce("outcome", F.lit("none")).alias("outcome"), "fi_t",
            F.col("c.di").alias("c_i"), F.col("c.dt").alias("c_t"), F.col("c.dn").alias("c_n"),
            F.coalesce("consumed", F.lit(0)).alias("consumed"), "deliveries",
        ).withColumns({
            "is_lost": (F.col("outcome") == "ok") & (F.col("consumed") == 0),
            "is_unexpected": (F.col("attempts") == 0) & (F.col("consumed") > 0),
            "is_dup": F.col("consumed") > 1,
            "is_recovered": F.col("outcome").isin("fail", "info") & (F.col("consumed") > 0),
        }))

        def n(cond: Any) -> Any:
            return F.sum(F.when(cond, 1).otherwise(0))

        row = j.agg(
            n(F.col("attempts") > 0).alias("attempted"), n(F.col("outcome") == "ok").alias("confirmed"),
            n(F.col("outcome") == "fail").alias("failed"), n(F.col("outcome") == "info").alias("unknown"),
            F.sum("attempts").alias("publish_attempts"), n(F.col("consumed") > 0).alias("consumed_unique"),
            F.sum("consumed").alias("consumed_total"), n(F.col("is_lost")).alias("lost"),
            n(F.col("is_unexpected")).alias("unexpected"), n(F.col("is_dup")).alias("duplicated"),
            n(F.col("is_recovered")).alias("recovered"),
        ).first()
        counts = {k: int(v or 0) for k, v in row.asDict().items()}
        progress("spark", "reconciled", messages=counts["attempted"], consumed=counts["consumed_total"])

        def details(flag: str, order: Any) -> list[dict]:
            rows = j.filter(F.col(flag)).orderBy(order).limit(LIST_CAP).select(
                "id", "attempts", "outcome", F.col("fi_t").alias("first_invoke_ns"),
                F.col("c_t").alias("confirm_ns"), F.col("c_n").alias("confirm_node"), "consumed", "deliveries",
            ).collect()
            return [r.asDict(recursive=True) for r in rows]

        first_delivery = F.col("deliveries")[0]["index"]
        lost = details("is_lost", F.col("c_i"))
        unexpected = details("is_unexpected", first_delivery)
        duplicated = details("is_dup", first_delivery)
        recovered = details("is_recovered", first_delivery)
        progress("spark", "lists", lost=len(lost), unexpected=len(unexpected))

        att = j.select(F.explode("a").alias("x")).select("x.*")
        # Both latency series are read by several passes (histogram, refinement, timeline): keep them.
        ok_att = self.persist(att.filter(F.col("o") == "ok").select(
            "dt", F.greatest(F.expr("(dt - it) div 1000"), F.lit(0)).alias("lat")))
        confirm_us = _order_stats(ok_att.select(F.col("lat").alias("v")))
        e2e = self.persist(j.filter((F.col("attempts") > 0) & (F.col("consumed") > 0)).select(
            F.greatest(F.expr("(deliveries[0].time_ns - fi_t) div 1000"), F.lit(0)).alias("v")))
        e2e_us = _order_stats(e2e)
        progress("spark", "latency", confirmed_attempts=confirm_us[0], consumed=e2e_us[0])

        windows = _windows_column(ctx)
        it = F.col("it")
        wids = F.transform(F.filter(windows, lambda w: (it >= w["s"]) & (it <= w["e"])), lambda w: w["id"])
        avail_rows = (att.select(F.explode(F.when(F.size(wids) == 0, F.array(F.lit("outside"))).otherwise(wids))
                                 .alias("w"), "o")
                      .groupBy("w").agg(F.count(F.lit(1)).alias("n"), n(F.col("o") == "ok").alias("ok")).collect())
        availability = {r["w"]: (int(r["n"]), int(r["ok"])) for r in avail_rows}

        drain_end = F.lit(ctx.drain_end_ns).cast("long")
        c_t = F.col("c_t")
        kinds = F.array_distinct(F.transform(
            F.filter(windows, lambda w: (w["s"] <= drain_end) & (w["e"] >= c_t)), lambda w: w["k"]))
        exposed = j.filter(F.col("outcome") == "ok").select(
            "c_n", "is_lost", F.explode(F.when(F.size(kinds) == 0, F.array(F.lit("none"))).otherwise(kinds))
            .alias("kind"))
        # One small aggregate (kinds x nodes x lost?) gives both the exposure and the attribution table.
        by_kind: dict[str, list[int]] = {}
        attribution_rows = []
        for r in exposed.groupBy("kind", "c_n", "is_lost").count().collect():
            k = by_kind.setdefault(r["kind"], [0, 0])
            k[0] += int(r["count"])
            if r["is_lost"]:
                k[1] += int(r["count"])
                attribution_rows.append((r["kind"], r["c_n"], int(r["count"])))
        exposure_rows = [(kind, v[0], v[1]) for kind, v in by_kind.items()]
        progress("spark", "attribution", rows=len(attribution_rows))

        n_viol, violations = self.order_violations(cons)
        progress("spark", "order", violations=n_viol)
        counts["order_violations"] = n_viol

        bucket = _bucket("time_ns", ctx.bucket_s)
        timeline = [(int(r["t"]), r["f"], r["type"], int(r["count"]))
                    for r in h.groupBy(bucket.alias("t"), "f", "type").count().collect()]
        ok_bucket = _bucket("dt", ctx.bucket_s)
        lat_tl = [(int(r["t"]), int(r["n"]), int(r["s"]), int(r["m"])) for r in ok_att.groupBy(ok_bucket.alias("t"))
                  .agg(F.count(F.lit(1)).alias("n"), F.sum("lat").alias("s"), F.max("lat").alias("m")).collect()]
        progress("spark", "timeline", buckets=len(timeline))

        return Facts(
            counts=counts, lost=lost, unexpected=unexpected, duplicated=duplicated, recovered=recovered,
            order_violations=violations, attribution_rows=attribution_rows, exposure_rows=exposure_rows,
            confirm_us=confirm_us, e2e_us=e2e_us, availability=availability, timeline=timeline,
            latency_timeline=lat_tl,
        )

    def order_violations(self, cons: Any) -> tuple[int, list[dict]]:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        oc = (cons.filter(~F.col("redelivered").eqNullSafe(True))
              .withColumn("producer", F.regexp_extract("id", ID_RE_JAVA, 1))
              .withColumn("seqs", F.regexp_extract("id", ID_RE_JAVA, 2))
              .filter(F.col("seqs") != "")
              .withColumn("seq", F.col("seqs").cast("long")))
        w = (Window.partitionBy("process", "queue", "producer").orderBy("index")
             .rowsBetween(Window.unboundedPreceding, -1))
        v = self.persist(oc.withColumn("after_seq", F.max("seq").over(w))
                         .filter(F.col("seq") < F.col("after_seq"))
                         .select(F.col("process").alias("consumer"), "queue", "producer", "id", "seq",
                                 "after_seq", "index"))
        count = v.count()
        rows = v.orderBy("index").limit(LIST_CAP).collect() if count else []
        return count, [r.asDict() for r in rows]


# Pair each publish completion with the earliest invoke of the same id still waiting
# (FIFO); invokes left waiting at the end are indeterminate attempts. Mirrors the
# deque in the Python engine.
_PAIR = """
aggregate(ev,
  named_struct('p', cast(array() as array<struct<i:bigint,t:bigint>>),
               'a', cast(array() as array<struct<ii:bigint,it:bigint,o:string,di:bigint,dt:bigint,dn:string>>)),
  (acc, x) -> CASE
    WHEN x.type = 'invoke' THEN
      named_struct('p', concat(acc.p, array(named_struct('i', x.index, 't', x.time_ns))), 'a', acc.a)
    WHEN size(acc.p) = 0 THEN acc
    ELSE named_struct(
      'p', slice(acc.p, 2, size(acc.p) - 1),
      'a', concat(acc.a, array(named_struct(
        'ii', acc.p[0].i, 'it', acc.p[0].t,
        'o', CASE WHEN x.type IN ('ok', 'fail') THEN x.type ELSE 'info' END,
        'di', x.index, 'dt', x.time_ns, 'dn', x.node))))
  END,
  acc -> concat(acc.a, transform(acc.p, q -> named_struct(
    'ii', q.i, 'it', q.t, 'o', 'info',
    'di', cast(null as bigint), 'dt', cast(null as bigint), 'dn', cast(null as string)))))
"""

_OUTCOME = """CASE WHEN size(a) = 0 THEN 'none'
  WHEN exists(a, x -> x.o = 'ok') THEN 'ok'
  WHEN exists(a, x -> x.o = 'info') THEN 'info'
  ELSE 'fail' END"""


def _bucket(name: str, width_s: int) -> Any:
    """Exact floor division on longs (Spark's div truncates toward zero): the timeline bucket."""
    from pyspark.sql import functions as F

    def floordiv(x: str, d: int) -> str:
        return f"((({x}) - pmod(({x}), {d})) div {d})"

    return F.expr(f"{floordiv(floordiv(name, NS_PER_S), width_s)} * {width_s}")


def _footer(meta: Any) -> tuple[int, int | None]:
    """Row count and max(time_ns) from the Parquet footer, saving a full scan when stats exist."""
    col = meta.schema.names.index("time_ns")
    best: int | None = None
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(col).statistics
        if stats is None or not stats.has_min_max:
            return meta.num_rows, None
        best = stats.max if best is None else max(best, stats.max)
    return meta.num_rows, best


def _windows_column(ctx: Context) -> Any:
    from pyspark.sql import functions as F

    if not ctx.windows:
        return F.expr("cast(array() as array<struct<id:string,k:string,s:bigint,e:bigint>>)")
    return F.array(*[
        F.struct(F.lit(w["fault_id"]).alias("id"), F.lit(w["kind"]).alias("k"),
                 F.lit(w["start_ns"]).cast("long").alias("s"), F.lit(w["end_ns"]).cast("long").alias("e"))
        for w in ctx.windows])


def _order_stats(df: Any) -> tuple[int, dict[str, int | None]]:
    """Exact nearest-rank order statistics of a long column "v" (values >= 0).

    A full sort of a hundred million latencies is what this avoids: a first pass
    counts values in 256 buckets per power of two (at most ~16k buckets), later
    passes split only the buckets that hold a wanted rank, 2^16 ways, until each
    wanted rank sits on one exact value. Only bucket counts reach the driver.
    """
    from pyspark.sql import functions as F

    v = F.col("v")
    bitlen = F.when(v > 0, F.length(F.bin(v))).otherwise(0)
    df = df.withColumn("s", F.greatest(bitlen - 8, F.lit(0)))
    rows = df.groupBy("s", F.expr("shiftright(v, s)").alias("k")).count().collect()
    buckets = sorted((r["k"] << r["s"], (r["k"] + 1) << r["s"], int(r["count"])) for r in rows)
    n = sum(b[2] for b in buckets)
    if n == 0:
        return 0, {}
    wanted = {f"p{p}": rank_for(p, n) for p in PERCENTILES}
    wanted["max"] = n
    found: dict[str, int | None] = {}
    pending = {name: _locate(buckets, rank) for name, rank in wanted.items()}
    while pending:
        for name, (lo, hi, _rank) in list(pending.items()):
            if hi - lo == 1:
                found[name] = lo
                del pending[name]
        if not pending:
            break
        ranges = sorted({(lo, hi) for lo, hi, _ in pending.values()})
        shifts = [max((hi - lo - 1).bit_length() - 16, 0) for lo, hi in ranges]
        tag = F.lit(None).cast("int")
        base = F.lit(None).cast("long")
        sh = F.lit(None).cast("int")
        for i, ((lo, hi), s) in enumerate(zip(ranges, shifts, strict=True)):
            inside = (v >= F.lit(lo)) & (v < F.lit(hi))
            tag = F.when(inside, F.lit(i)).otherwise(tag)
            base = F.when(inside, F.lit(lo).cast("long")).otherwise(base)
            sh = F.when(inside, F.lit(s)).otherwise(sh)
        sub = (df.select(tag.alias("t"), base.alias("b"), sh.alias("sh"), "v").filter(F.col("t").isNotNull())
               .groupBy("t", F.expr("shiftright(v - b, sh)").alias("k")).count().collect())
        per_range: dict[int, list[tuple[int, int, int]]] = {}
        for r in sub:
            i = int(r["t"])
            lo, s = ranges[i][0], shifts[i]
            per_range.setdefault(i, []).append((lo + (r["k"] << s), lo + ((r["k"] + 1) << s), int(r["count"])))
        for name, (lo, hi, rank) in list(pending.items()):
            i = ranges.index((lo, hi))
            pending[name] = _locate(sorted(per_range[i]), rank)
    return n, found


def _locate(buckets: list[tuple[int, int, int]], rank: int) -> tuple[int, int, int]:
    """The bucket holding the rank-th smallest value, and the rank inside it."""
    seen = 0
    for lo, hi, count in buckets:
        if seen + count >= rank:
            return lo, hi, rank - seen
        seen += count
    raise ValueError(f"rank {rank} beyond {seen} values")
