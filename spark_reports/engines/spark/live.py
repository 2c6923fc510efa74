"""Liveness in Spark: the ``LiveFacts`` of every run from the ok ops, as tagged parts of the
check's first job (``_spark_sql.collect_parts``).

Per (run, queue, kind, node) one aggregate row (count, first, last, and per fault window the
first ok at or after its heal: one conditional minimum per window, the heal times looked up
by run); the gaps longer than the threshold between consecutive oks of a queue and kind (a
lag over the oks in time order: only the few long ones reach the driver); per queue the
publish span. Everything else is ``_liveness``'s, shared with the Python engine.
"""

from __future__ import annotations

from typing import Any

from harness.spec.results import UNAVAILABLE_S
from spark_reports.engines.common import NEMESIS
from spark_reports.engines.liveness import NS_PER_S, LiveFacts, NodeOks, heal_times
from spark_reports.engines.spark.scope import Scope
from spark_reports.engines.spark.sql import tagged


def live_parts(h: Any, scope: Scope) -> list[Any]:
    """The tagged parts (``live_ok``, ``live_gap``, ``live_pub``) for ``parse_live``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    f, ty, t = F.col("f"), F.col("type"), F.col("time_ns")
    client = h.filter(
        ~F.col("process").eqNullSafe(NEMESIS) & F.col("value").isNotNull() & F.col("queue").isNotNull()
    )
    acks = scope.scalar("x_acks")
    kind = F.when((f == "publish") & (ty == "ok"), "publish").when(
        (ty == "ok") & ((acks & (f == "ack")) | (~acks & (f == "consume"))), "consume"
    )
    ok = (
        client.withColumn("kind", kind)
        .filter(F.col("kind").isNotNull())
        .select("run", "queue", "kind", "node", "time_ns")
    )
    ctxs = dict(sorted(scope.ctxs.items()))
    heals = [heal_times(c.windows) for c in ctxs.values()]
    at = [
        scope.per_run([x[i] if i < len(x) else None for x in heals], "bigint")
        for i in range(max((len(x) for x in heals), default=0))
    ]
    after = [F.min(F.when(t >= h, t)) for h in at]
    before = [F.max(F.when(t < h, t)) for h in at]
    nodes = ok.groupBy("run", "queue", "kind", "node").agg(
        F.count(F.lit(1)).alias("count"),
        F.min(t).alias("first"),
        F.max(t).alias("last"),
        (F.array(*after) if after else F.array().cast("array<bigint>")).alias("after"),
        (F.array(*before) if before else F.array().cast("array<bigint>")).alias("before"),
    )
    w = Window.partitionBy("run", "queue", "kind").orderBy("time_ns")
    gaps = (
        ok.withColumn("prev", F.lag(t).over(w))
        .filter(t - F.col("prev") > UNAVAILABLE_S * NS_PER_S)
        .select("run", "queue", "kind", F.col("prev").alias("a"), t.alias("b"))
    )
    invoke = F.when(ty == "invoke", t)
    pub = (
        client.filter(f == "publish")
        .groupBy("run", "queue")
        .agg(F.min(invoke).alias("first_invoke"), F.max(t).alias("last"), F.max(invoke).alias("last_invoke"))
    )
    return [tagged(nodes, "live_ok"), tagged(gaps, "live_gap"), tagged(pub, "live_pub")]


def parse_live(parts: dict[str, list[dict]], runs: int) -> dict[int, LiveFacts]:
    """Each run's ``LiveFacts`` from the collected parts."""
    out = {i: LiveFacts() for i in range(runs)}
    for r in parts.get("live_ok", []):
        out[r["run"]].oks[(r["queue"], r["kind"], r["node"])] = NodeOks(
            count=int(r["count"]),
            first_ns=int(r["first"]),
            last_ns=int(r["last"]),
            after_heal=list(r["after"]),
            before_heal=list(r["before"]),
        )
    for r in parts.get("live_gap", []):
        out[r["run"]].gaps.append((r["queue"], r["kind"], int(r["a"]), int(r["b"])))
    for r in parts.get("live_pub", []):
        out[r["run"]].publish[r["queue"]] = (r["first_invoke"], int(r["last"]), r["last_invoke"])
    for facts in out.values():
        facts.gaps.sort()
    return out
