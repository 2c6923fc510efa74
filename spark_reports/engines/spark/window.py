"""One window for every part of a check that needs its rows in an order: one shuffle, one sort.

The capped detail lists (each list's first LIST_CAP by its order), the order check (per consumer,
queue and producer, each delivery against the highest seq that consumer got before it), the
liveness gaps (per queue and kind, each ok against the one before it) and the lost positions (per
producer, the first and last seq still seen) each were a window or an aggregate of their own, each
a shuffle and a stage. Here their rows are one union, partitioned by (run, part, k1, k2, k3) and
ordered by ``o``: each part reads only the window functions it needs, all over the same partitions
and order, so Spark plans one exchange and one sort for them all. Each part's rows come out as
the tagged rows of ``sql.collect_parts`` (``lists``, ``order_n``, ``live_gap``, ``live_near``,
``a_positions``).

An order violation is one of a partition's; each partition keeps its first LIST_CAP (by index)
and its count, so the driver takes the first LIST_CAP of all (``order_rows``).
"""

from __future__ import annotations

from functools import reduce
from typing import Any

from harness.spec.results import LIST_CAP, UNAVAILABLE_S
from spark_reports.engines.liveness import NS_PER_S
from spark_reports.engines.spark.live import KINDS
from spark_reports.engines.spark.sql import producer_and_seq

ORDER, GAP, POS = "~order", "~gap", "~pos"
"""The parts that are not a list (a list's part is its name)."""


def _row(
    df: Any,
    part: Any,
    *,
    k: tuple[Any, ...] = (),
    o: Any,
    x: Any = None,
    a: Any = None,
    b: Any = None,
    s: Any = None,
) -> Any:
    """``df``'s rows as the window's: part, keys k1-k3 (strings), order o, a long x, flags a and b,
    a string s."""
    from pyspark.sql import functions as F

    keys = [*k, *[None] * (3 - len(k))]
    return df.select(
        "run",
        (part if not isinstance(part, str) else F.lit(part)).alias("p"),
        *[(F.lit(None) if v is None else v).cast("string").alias(f"k{i + 1}") for i, v in enumerate(keys)],
        o.cast("long").alias("o"),
        (F.lit(None) if x is None else x).cast("long").alias("x"),
        (F.lit(False) if a is None else a).cast("boolean").alias("a"),
        (F.lit(False) if b is None else b).cast("boolean").alias("b"),
        (F.lit(None) if s is None else s).cast("string").alias("s"),
    )


def order_source(ids: Any) -> Any:
    """Every delivery not flagged redelivered of a producer's id (``ds``: each id's deliveries), a
    delayed publish's id left out (it has no place in its producer's order)."""
    from pyspark.sql import functions as F

    d = (
        ids.filter(~F.col("delayed") & (F.size("ds") > 0))
        .select("run", "id", F.explode("ds").alias("d"))
        .select("run", "id", "d.*")
        .filter(~F.col("redelivered").eqNullSafe(True))
    )
    producer, seqs = producer_and_seq("id")
    d = d.withColumn("producer", producer).withColumn("seqs", seqs).filter(F.col("seqs") != "")
    return _row(
        d,
        ORDER,
        k=(F.col("process"), F.col("queue"), F.col("producer")),
        o=F.col("index"),
        x=F.col("seqs").cast("long"),
        s=F.col("id"),
    )


def gap_source(ok: Any, publishes: Any) -> Any:
    """The ok records of ``live``'s kinds (``kind``: 0 publish, 1 consume), per queue and kind, each
    with its time as ``x``; among a queue's consume oks, its publish records of every type as
    markers (flag ``a``, no ``x``): at the last of them, the last consume ok at or before it
    (``LiveFacts.consume_by_publish_end``)."""
    from pyspark.sql import functions as F

    kind = F.element_at(F.array(*[F.lit(k) for k in KINDS]), F.col("kind") + 1)
    t = F.col("time_ns")
    oks = _row(ok, GAP, k=(F.col("queue"), kind), o=t, x=t)
    return oks.unionByName(_row(publishes, GAP, k=(F.col("queue"), F.lit(KINDS[1])), o=t, a=F.lit(True)))


def positions_source(ids: Any) -> Any:
    """Every id of a producer (a valid ``producer:seq``): seen (delivered or consumed) and lost."""
    from pyspark.sql import functions as F

    producer, seqs = producer_and_seq("id")
    placed = ids.select("run", "is_lost", "delivered", "consumed", producer.alias("pr"), seqs.alias("seqs"))
    placed = placed.filter(F.col("seqs") != "")
    seq = F.col("seqs").cast("long")
    alive = (F.col("delivered") > 0) | (F.col("consumed") > 0)
    return _row(placed, POS, k=(F.col("pr"),), o=seq, x=seq, a=alive, b=F.col("is_lost"))


def list_source(rows: Any) -> Any:
    """Rows (list, o, js) of the capped detail lists."""
    from pyspark.sql import functions as F

    return _row(rows, F.col("list"), o=F.col("o"), s=F.col("js"))


def window_parts(sources: list[Any]) -> Any:
    """The tagged rows (part, js) of every part, from one window over the union of ``sources``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    col, p = F.col, F.col("p")
    w = Window.partitionBy("run", "p", "k1", "k2", "k3").orderBy("o")
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    whole = w.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    u = reduce(lambda a, b: a.unionByName(b), sources)
    u = u.select(
        "*",
        F.row_number().over(w).alias("rn"),
        F.max("x").over(before).alias("after_seq"),
        F.max("x").over(w.rangeBetween(Window.unboundedPreceding, Window.currentRow)).alias("x_upto"),
        F.min(F.when(col("a"), col("x"))).over(whole).alias("first_seen"),
        F.max(F.when(col("a"), col("x"))).over(whole).alias("last_seen"),
    )
    viol = (p == ORDER) & (col("x") < col("after_seq"))
    first, last, x = col("first_seen"), col("last_seen"), col("x")
    where = {
        "prefix": first.isNotNull() & (x < first),
        "middle": ~(first.isNotNull() & (x < first)) & last.isNotNull() & (x < last),
    }
    where["postfix"] = ~where["prefix"] & ~where["middle"]
    lost = (p == POS) & col("b")
    u = u.select(
        "*",
        F.sum(viol.cast("long")).over(upto).alias("nv"),
        F.sum(viol.cast("long")).over(whole).alias("n_order"),
        F.sum(lost.cast("long")).over(whole).alias("lost"),
        F.max(F.when((p == GAP) & col("a"), col("x_upto"))).over(whole).alias("near"),
        *[F.sum((lost & c).cast("long")).over(whole).alias(k) for k, c in where.items()],
    )
    return _emit(u, viol)


def _emit(u: Any, viol: Any) -> Any:
    """The window's rows that reach the driver, each as its part's tagged row."""
    from pyspark.sql import functions as F

    col, p = F.col, F.col("p")
    listed = ~p.startswith("~") & (col("rn") <= LIST_CAP)
    violation = viol & (col("nv") <= LIST_CAP)
    order_n = (p == ORDER) & (col("rn") == 1) & (col("n_order") > 0)
    # A liveness ok's previous one is the greatest ok time (``x``) before it: the markers have none.
    gap = (p == GAP) & ~col("a") & (col("o") - col("after_seq") > UNAVAILABLE_S * NS_PER_S)
    near = (p == GAP) & (col("rn") == 1) & col("near").isNotNull()
    pos = (p == POS) & (col("rn") == 1) & (col("lost") > 0)

    def js(*cols: Any) -> Any:
        return F.to_json(F.struct(*cols), {"ignoreNullFields": "false"}).alias("js")

    order = js(
        col("k1").alias("consumer"),
        col("k2").alias("queue"),
        col("k3").alias("producer"),
        col("s").alias("id"),
        col("x").alias("seq"),
        "after_seq",
        col("o").alias("index"),
    ).alias("js")

    def tagged(name: str, *cols: Any) -> Any:
        return F.struct(F.lit(name).alias("part"), js(*cols))

    part = (
        F.when(listed, tagged("lists", p.alias("list"), "o", col("s").alias("js")))
        .when(violation, tagged("lists", F.lit("order").alias("list"), "o", order.alias("js")))
        .when(order_n, tagged("order_n", "run", col("n_order").alias("n")))
        .when(
            gap,
            tagged(
                "live_gap",
                "run",
                col("k1").alias("queue"),
                col("k2").alias("kind"),
                col("after_seq").alias("a"),
                col("o").alias("b"),
            ),
        )
        .when(near, tagged("live_near", "run", col("k1").alias("queue"), col("near").alias("at")))
        .when(
            pos,
            tagged(
                "a_positions",
                "run",
                col("k1").alias("producer"),
                "first_seen",
                "last_seen",
                "lost",
                "prefix",
                "middle",
                "postfix",
            ),
        )
    )
    return u.select(part.alias("t")).filter(F.col("t").isNotNull()).select("t.part", "t.js")
