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

import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    rank_for,
)

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


_COLUMN_TYPES = {"error": "string", "digest": "string", "detail": "string", "schema": "int"}
_DELIVERY = ("index", "time_ns", "node", "queue", "process", "redelivered")


def check_spark(run_dir: Path, scenario: dict, *, spark_master: str | None = None,
                driver_memory: str | None = None) -> Results:
    """Reconcile a stored run with Spark; same results schema as check_python.

    With spark_master pointing at a real cluster, the run directory must be on a
    filesystem every executor can read at the same path.
    """
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    path = history_path(Path(run_dir), allow_jsonl=False).resolve()
    conf = (scenario or {}).get("spark") or {}
    spark = spark_session(spark_master or conf.get("master"), driver_memory or conf.get("driver_memory"))
    footer = _footer(pq.ParquetFile(path).metadata)
    spark.conf.set("spark.sql.shuffle.partitions", str(max(1, min(400, footer.rows // 500_000))))
    raw = spark.read.parquet(str(path))
    present = set(raw.columns)
    # Histories written before schema 2 have no digest or detail column: they read as nulls.
    h = raw.select(*[F.col(c) if c in present else F.lit(None).cast(_COLUMN_TYPES[c]).alias(c)
                     for c in HISTORY_COLUMNS])
    job = _Job(spark, h, footer, scenario, has_schema="schema" in present)
    try:
        return job.run()
    finally:
        job.release()


class _Job:
    def __init__(self, spark: Any, h: Any, footer: _Footer, scenario: dict, *, has_schema: bool) -> None:
        self.spark = spark
        self.h = h
        self.footer = footer
        self.scenario = scenario
        self.has_schema = has_schema
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
        ops, end_ns, schema = self.footer.rows, self.footer.max_time, self.footer.min_schema
        if end_ns is None:
            ops, end_ns = h.agg(F.count(F.lit(1)), F.max("time_ns")).first()
        if not self.has_schema:
            schema = 1
        elif schema is None:
            schema = h.agg(F.min(F.coalesce("schema", F.lit(1)))).first()[0]
        small = [r.asDict() for r in h.filter((F.col("process") == NEMESIS) | (F.col("f") == "drain"))
                 .select("index", "time_ns", "process", "node", "type", "f", "queue", "value", "error").collect()]
        ctx = make_context(int(ops), end_ns, small, self.scenario, schema)
        progress("spark", "prelude", ops=int(ops), faults=len(ctx.windows), drain_ops=len(small),
                 schema=ctx.history_schema)
        facts = self.reconcile(ctx)
        progress("spark", "done", lost=facts.counts["lost"])
        return assemble("spark", ctx, facts)

    def events(self, ctx: Context) -> Any:
        """Client records that matter per message id, each tagged with its kind ``k``.

        p publish, d delivery; with acks (schema 2) also ai/ao/af/an ack invoke, ok,
        fail, info (anything else that is not invoke, ok or fail is indeterminate), and
        ab abandon invoke.
        """
        from pyspark.sql import functions as F

        f, ty = F.col("f"), F.col("type")
        kind = F.when(f == "publish", "p").when((f == "consume") & (ty == "ok"), "d")
        if ctx.acks:
            ack = f == "ack"
            kind = (kind.when(ack & (ty == "invoke"), "ai").when(ack & (ty == "ok"), "ao")
                    .when(ack & (ty == "fail"), "af").when(ack, "an")
                    .when((f == "abandon") & (ty == "invoke"), "ab"))
        client = ~F.col("process").eqNullSafe(NEMESIS) & F.col("value").isNotNull()
        return (self.h.filter(client)
                .select(F.col("value").alias("id"), "index", "type", "time_ns", "node", "queue", "process",
                        "redelivered", "digest", "detail", kind.alias("k"))
                .filter(F.col("k").isNotNull()))

    def reconcile(self, ctx: Context) -> Facts:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        h = self.h
        ev = self.events(ctx)
        k, idx = F.col("k"), F.col("index")
        is_d = k == "d"
        cause = F.get_json_object("detail", "$.cause")
        if ctx.acks:
            # Per id in index order: was an ack ok already recorded, which abandon came last.
            # Per (id, process): the k-th ack completion closes the k-th ack invoke (FIFO), which
            # gives each ack that ended info the index at which it was written.
            before = Window.partitionBy("id").orderBy("index").rowsBetween(Window.unboundedPreceding, -1)
            upto = (Window.partitionBy("id", "process").orderBy("index")
                    .rowsBetween(Window.unboundedPreceding, Window.currentRow))
            ew = ev.withColumns({
                "ack_before": F.min(F.when(k == "ao", idx)).over(before),
                "ab_before": F.max(F.when(k == "ab", F.struct(idx.alias("index"), cause.alias("cause")))).over(before),
            }).withColumns({
                "invs": F.collect_list(F.when(k == "ai", idx)).over(upto),
                "done": F.sum(F.when(k.isin("ao", "af", "an"), 1).otherwise(0)).over(upto),
            }).withColumn("paired", F.when(k == "an", F.expr("try_element_at(invs, cast(done as int))")))
        else:
            ew = ev.withColumns({
                "ack_before": F.lit(None).cast("long"),
                "ab_before": F.lit(None).cast("struct<index:bigint,cause:string>"),
                "paired": F.lit(None).cast("long"),
            })

        def n(cond: Any) -> Any:
            return F.sum(F.when(cond, 1).otherwise(0))

        resurrecting = is_d & F.col("ack_before").isNotNull()
        delivery = F.struct(*_DELIVERY)
        agg = ew.groupBy("id").agg(
            F.sort_array(F.collect_list(F.when(k == "p", F.struct("index", "type", "time_ns", "node")))).alias("ev"),
            n(is_d).alias("delivered"),
            F.slice(F.sort_array(F.collect_list(F.when(is_d, delivery))), 1, DELIVERY_CAP).alias("deliveries"),
            F.max(F.when(is_d, idx)).alias("last_d"),
            F.min(F.when(is_d, F.col("digest"))).alias("dig_min"),
            F.max(F.when(is_d, F.col("digest"))).alias("dig_max"),
            n(is_d & F.col("digest").isNotNull()).alias("n_dig"),
            n(is_d & F.col("digest").isNull()).alias("undigested"),
            n(k == "ao").alias("acked"),
            F.min(F.when(k == "ao", F.struct("index", "time_ns", "node", "process", "queue"))).alias("first_ack"),
            F.max(F.when(k == "an", F.col("paired"))).alias("ack_info_inv"),
            n(k == "ab").alias("abandons"),
            F.max(F.when(k == "ab", F.struct(idx.alias("index"), cause.alias("cause")))).alias("last_ab"),
            n(resurrecting).alias("res_n"),
            F.min(F.when(resurrecting, delivery)).alias("res_first"),
            n(is_d & F.col("ab_before").isNotNull() & ~F.col("redelivered").eqNullSafe(True)).alias("unflagged"),
        )
        base = agg.withColumn("a", F.expr(_PAIR)).select(
            "*", F.size("a").alias("attempts"), F.expr(_OUTCOME).alias("outcome"),
            F.expr("try_element_at(filter(ev, e -> e.type = 'invoke'), 1).time_ns").alias("fi_t"),
            F.expr("try_element_at(filter(a, x -> x.o = 'ok'), 1)").alias("c"))
        consumed = F.col("acked") if ctx.acks else F.col("delivered")
        unacked = (F.col("outcome") == "ok") & (consumed == 0)
        ack_unknown = unacked & F.col("ack_info_inv").isNotNull() & (
            F.col("last_d").isNull() | (F.col("ack_info_inv") > F.col("last_d")))
        if ctx.check_bodies:
            assert ctx.params.seed is not None and ctx.params.message_size is not None
            need = (F.col("attempts") > 0) & (F.col("n_dig") > 0)
            base = base.withColumn("payload", F.when(need, F.expr(payload_sql("id", ctx.params.seed,
                                                                                str(ctx.params.message_size)))))
            base = base.withColumn("exp", F.expr(digest_sql(body_from_payload_sql("id", "payload"))))
        else:
            base = base.withColumn("exp", F.lit(None).cast("string"))
        exp = F.col("exp")
        fa = F.col("first_ack")
        if ctx.spans:
            spans = _spans_column(ctx)
            split = fa.isNotNull() & F.exists(spans, lambda s: (
                (s["p"] == fa["process"]) & s["q"].eqNullSafe(fa["queue"]) & (fa["index"] > s["lo"])
                & (fa["index"] < s["hi"]) & ~s["n"].eqNullSafe(fa["node"]) & (fa["time_ns"] > s["e"])))
        else:
            split = F.lit(False)
        j = self.persist(base.select(
            "id", "a", "attempts", "outcome", "fi_t",
            F.col("c.di").alias("c_i"), F.col("c.dt").alias("c_t"), F.col("c.dn").alias("c_n"),
            "delivered", consumed.alias("consumed"), "deliveries", "undigested", "abandons", "unflagged",
            "first_ack", "res_n", "res_first",
            (fa["index"] if ctx.acks else F.col("deliveries")[0]["index"]).alias("first_consumed"),
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

        row = j.agg(
            n(F.col("attempts") > 0).alias("attempted"), n(F.col("outcome") == "ok").alias("confirmed"),
            n(F.col("outcome") == "fail").alias("failed"), n(F.col("outcome") == "info").alias("unknown"),
            F.sum("attempts").alias("publish_attempts"),
            n(F.col("delivered") > 0).alias("delivered_unique"), F.sum("delivered").alias("delivered_total"),
            n(F.col("consumed") > 0).alias("consumed_unique"), F.sum("consumed").alias("consumed_total"),
            F.sum("abandons").alias("abandoned"), n(F.col("is_lost")).alias("lost"),
            n(F.col("is_ack_unknown")).alias("ack_unknown"), n(F.col("is_unexpected")).alias("unexpected"),
            n(F.col("is_corrupted")).alias("corrupted"), n(F.col("is_dup")).alias("duplicated"),
            n(F.col("is_resurrected")).alias("resurrected"), n(F.col("is_recovered")).alias("recovered"),
            n(F.col("is_split")).alias("split_brain"), F.sum("unflagged").alias("unflagged_redeliveries"),
            F.sum("undigested").alias("undigested"),
        ).first()
        counts = {k: int(v or 0) for k, v in row.asDict().items()}
        undigested = counts.pop("undigested")
        progress("spark", "reconciled", messages=counts["attempted"], consumed=counts["consumed_total"])

        def details(flag: str, order: Any, *extra: Any) -> list[dict]:
            rows = j.filter(F.col(flag)).orderBy(order).limit(LIST_CAP).select(
                "id", "attempts", "outcome", F.col("fi_t").alias("first_invoke_ns"),
                F.col("c_t").alias("confirm_ns"), F.col("c_n").alias("confirm_node"), "delivered", "consumed",
                "deliveries", *extra,
            ).collect()
            return [r.asDict(recursive=True) for r in rows]

        lost = details("is_lost", F.col("c_i"), "cause", "abandon_cause")
        lost_by_cause = [(r["cause"], r["abandon_cause"], int(r["count"]))
                         for r in j.filter("is_lost").groupBy("cause", "abandon_cause").count().collect()]
        ack_unknown_list = details("is_ack_unknown", F.col("c_i"))
        unexpected = details("is_unexpected", F.col("first_consumed"))
        duplicated = details("is_dup", F.col("deliveries")[0]["index"])
        recovered = details("is_recovered", F.col("first_consumed"))
        resurrected = [r.asDict(recursive=True) for r in j.filter("is_resurrected").orderBy("res_first.index")
                       .limit(LIST_CAP).select("id", F.col("first_ack").alias("ack"),
                                               F.col("res_n").alias("deliveries_after"),
                                               F.col("res_first").alias("delivery")).collect()]
        split_brain = [r.asDict(recursive=True) for r in j.filter("is_split").orderBy("first_ack.index")
                       .limit(LIST_CAP).select("id", F.col("first_ack").alias("ack")).collect()]
        corrupted = self.corrupted(ev, j) if counts["corrupted"] else []
        unflagged = self.unflagged(ev) if counts["unflagged_redeliveries"] else []
        progress("spark", "lists", lost=len(lost), unexpected=len(unexpected), corrupted=len(corrupted))

        att = j.select(F.explode("a").alias("x")).select("x.*")
        # Both latency series are read by several passes (histogram, refinement, timeline): keep them.
        ok_att = self.persist(att.filter(F.col("o") == "ok").select(
            "dt", F.greatest(F.expr("(dt - it) div 1000"), F.lit(0)).alias("lat")))
        confirm_us = _order_stats(ok_att.select(F.col("lat").alias("v")))
        e2e = self.persist(j.filter((F.col("attempts") > 0) & (F.col("delivered") > 0)).select(
            F.greatest(F.expr("(deliveries[0].time_ns - fi_t) div 1000"), F.lit(0)).alias("v")))
        e2e_us = _order_stats(e2e)
        progress("spark", "latency", confirmed_attempts=confirm_us[0], delivered=e2e_us[0])

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
            kk = by_kind.setdefault(r["kind"], [0, 0])
            kk[0] += int(r["count"])
            if r["is_lost"]:
                kk[1] += int(r["count"])
                attribution_rows.append((r["kind"], r["c_n"], int(r["count"])))
        exposure_rows = [(kind, v[0], v[1]) for kind, v in by_kind.items()]
        progress("spark", "attribution", rows=len(attribution_rows))

        n_viol, violations = self.order_violations(ev.filter(is_d))
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
            counts=counts, lost=lost, lost_by_cause=lost_by_cause, ack_unknown=ack_unknown_list,
            unexpected=unexpected, duplicated=duplicated, recovered=recovered, resurrected=resurrected,
            corrupted=corrupted, split_brain=split_brain, unflagged=unflagged, undigested=undigested,
            order_violations=violations, attribution_rows=attribution_rows, exposure_rows=exposure_rows,
            confirm_us=confirm_us, e2e_us=e2e_us, availability=availability, timeline=timeline,
            latency_timeline=lat_tl,
        )

    def corrupted(self, ev: Any, j: Any) -> list[dict]:
        """The first corrupted delivery of each corrupted id: only those ids' deliveries are joined."""
        from pyspark.sql import functions as F

        bad = j.filter("is_corrupted").select("id", "exp")
        rows = (ev.filter((F.col("k") == "d") & F.col("digest").isNotNull()).join(bad, "id")
                .filter(F.col("digest") != F.col("exp"))
                .groupBy("id").agg(F.count(F.lit(1)).alias("deliveries"),
                                   F.min(F.struct(*_DELIVERY, "digest", "detail")).alias("delivery"))
                .orderBy("delivery.index").limit(LIST_CAP).collect())
        return [r.asDict(recursive=True) for r in rows]

    def unflagged(self, ev: Any) -> list[dict]:
        """Deliveries after an abandon without the redelivered flag, with the latest abandon before each."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        k = F.col("k")
        before = Window.partitionBy("id").orderBy("index").rowsBetween(Window.unboundedPreceding, -1)
        ab = F.struct(F.col("index").alias("index"), F.get_json_object("detail", "$.cause").alias("cause"))
        rows = (ev.filter(k.isin("d", "ab"))
                .withColumn("ab_before", F.max(F.when(k == "ab", ab)).over(before))
                .filter((k == "d") & F.col("ab_before").isNotNull() & ~F.col("redelivered").eqNullSafe(True))
                .orderBy("index").limit(LIST_CAP)
                .select("id", *_DELIVERY, F.col("ab_before.index").alias("abandon_index"),
                        F.col("ab_before.cause").alias("abandon_cause")).collect())
        return [r.asDict() for r in rows]

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


def payload_sql(mid: str, seed: int, size: str) -> str:
    """The seeded filler of ``harness.spec.message_body`` in Spark SQL (mid, size: SQL expressions)."""
    head = f"concat({mid}, '|')"
    n = f"greatest(0, ({size}) - char_length({head}) - 17)"
    return f"substring(repeat(sha2(concat('{int(seed)}:', {mid}), 256), ({n}) div 64 + 1), 1, {n})"


def body_from_payload_sql(mid: str, payload: str) -> str:
    """``id|check|payload``, check being the first 16 hex digits of the payload's sha256."""
    return f"concat({mid}, '|', substring(sha2({payload}, 256), 1, 16), '|', {payload})"


def digest_sql(body: str) -> str:
    """``harness.spec.body_digest`` in Spark SQL."""
    return f"substring(sha2({body}, 256), 1, 32)"


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


def _spans_column(ctx: Context) -> Any:
    """The drain spans (a handful) as a literal array the split-brain test runs over per id."""
    from pyspark.sql import functions as F

    return F.array(*[
        F.struct(F.lit(s.process).alias("p"), F.lit(s.queue).cast("string").alias("q"),
                 F.lit(s.lo).cast("long").alias("lo"), F.lit(s.hi).cast("long").alias("hi"),
                 F.lit(s.node).alias("n"), F.lit(s.empty_at_ns).cast("long").alias("e"))
        for s in ctx.spans])


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
