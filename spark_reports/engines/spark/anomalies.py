"""Jepsen's finer anomaly classes in Spark: the same rows as ``_anomalies`` computes in Python.

Every part is per run (the ``run`` column), so one job serves a single check and a grade's
many runs alike; each list is ranked and capped in Spark (``ANOMALY_EXAMPLES`` per run) with
its count beside it, and only those rows reach the driver, where ``parse`` orders them as the
Python engine does.
"""

from __future__ import annotations

from typing import Any

from harness.spec.history import HOLDINGS, READ, SEEK
from harness.spec.results import ANOMALY_EXAMPLES
from spark_reports.engines.anomalies import LISTS, empty_findings
from spark_reports.engines.common import NEMESIS
from spark_reports.engines.spark.sql import tagged

_ENTRIES = "struct<entries:array<array<string>>>"


def _top(df: Any, name: str, order: list[Any]) -> list[Any]:
    """Per run, ``df``'s count and its first ANOMALY_EXAMPLES rows by ``order`` (values, ascending,
    nulls first; unique per row), from one aggregate per run. (A window partitioned by the run
    alone has no partition at all in a check of one run, whose number is a constant: Spark moved
    every row to one partition for it, and read ``df`` twice, once more for the count.)"""
    from pyspark.sql import functions as F

    keyed = F.struct(
        F.struct(
            *[(F.col(o) if isinstance(o, str) else o).alias(f"k{i}") for i, o in enumerate(order)]
        ).alias("k"),
        F.struct(*[c for c in df.columns if c != "run"]).alias("r"),
    )
    first = F.slice(F.sort_array(F.collect_list(keyed)), 1, ANOMALY_EXAMPLES)
    top = df.groupBy("run").agg(F.count(F.lit(1)).alias("n"), first.alias("top"))
    return [tagged(top.select("run", "n", F.col("top.r").alias("rows")), name)]


def parts(h: Any, ids: Any, *, streams: bool = True) -> list[Any]:
    """Tagged parts (``_spark_sql.collect_parts``) of every class, from the history ``h`` and the
    per-id rows ``ids`` (``is_lost``, ``outcome``, ``delivered``, ``consumed``). ``streams=False``:
    the history has no holdings, reads or seeks (``STREAM_OPS``), so every stream class is empty,
    as ``parse`` gives it when no row came: nothing is asked for. (The lost positions are a part of
    the check's one window: ``window.positions_source``.)"""
    from pyspark.sql import functions as F

    out: list[Any] = []
    if not streams:
        return out
    client = h.filter(~F.col("process").eqNullSafe(NEMESIS))
    hold, entries = _holdings(client)
    out.append(tagged(_summary(hold, entries), "a_holdings"))
    reads, placed, seeks = _reads(client)
    out.append(_reads_part(reads, placed))
    seen = _seen(entries, placed)
    out += _offset_parts(seen)
    out += _copy_parts(ids, hold, entries, reads)
    out += _poll_parts(placed, seeks, seen)
    return out


def _q0() -> Any:
    from pyspark.sql import functions as F

    return F.coalesce(F.col("queue"), F.lit(""))


def _holdings(client: Any) -> tuple[Any, Any]:
    """The last holdings completion per (run, queue, node), and the entries of the ok ones."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    last = Window.partitionBy("run", "queue", "node").orderBy(F.col("index").desc())
    hold = (
        client.filter((F.col("f") == HOLDINGS) & (F.col("type") != "invoke"))
        .withColumn("_last", F.row_number().over(last))
        .filter(F.col("_last") == 1)
        .select("run", "queue", "node", "type", "error", "value")
    )
    e = F.col("e")
    entries = (
        hold.filter(F.col("type") == "ok")
        .select("run", "queue", "node", F.explode(F.from_json("value", _ENTRIES)["entries"]).alias("e"))
        .select(
            "run",
            "queue",
            "node",
            F.expr("try_cast(get(e, 0) AS BIGINT)").alias("offset"),
            F.get(e, 1).alias("id"),
        )
        .filter(F.col("id").isNotNull())
    )
    return hold, entries


def _summary(hold: Any, entries: Any) -> Any:
    """Per node's copy: its outcome, how many entries and their first and last offset."""
    from pyspark.sql import functions as F

    per_copy = entries.groupBy("run", "queue", "node").agg(
        F.count(F.lit(1)).alias("n"), F.min("offset").alias("lo"), F.max("offset").alias("hi")
    )
    summary = hold.join(per_copy, ["run", "queue", "node"], "left").select(
        "run",
        "queue",
        "node",
        F.col("type").alias("outcome"),
        F.when(F.col("type") == "ok", F.coalesce("n", F.lit(0))).alias("entries"),
        F.col("lo").alias("first_offset"),
        F.col("hi").alias("last_offset"),
        "error",
    )
    return summary


def _reads(client: Any) -> tuple[Any, Any, Any]:
    """The ok reads, those placed at an offset, and the seeks."""
    from pyspark.sql import functions as F

    seq = F.expr("try_cast(get_json_object(detail, '$.stream_seq') AS BIGINT)")
    reads = client.filter((F.col("f") == READ) & (F.col("type") == "ok") & F.col("value").isNotNull())
    placed = reads.select("run", "process", "queue", "index", F.col("value").alias("id"), seq.alias("offset"))
    placed = placed.filter(F.col("offset").isNotNull())
    seeks = client.filter((F.col("f") == SEEK) & (F.col("type") == "ok")).select(
        "run", "process", "queue", "index", seq.alias("offset")
    )
    return reads, placed, seeks


def _reads_part(reads: Any, placed: Any) -> Any:
    from pyspark.sql import functions as F

    return tagged(
        reads.groupBy("run")
        .agg(F.count(F.lit(1)).alias("reads"))
        .join(placed.groupBy("run").agg(F.countDistinct("process").alias("readers")), ["run"], "left"),
        "a_reads",
    )


def _seen(entries: Any, placed: Any) -> Any:
    """Every (offset, id) a copy or a read saw, with where."""
    from pyspark.sql import functions as F

    return (
        entries.filter(F.col("offset").isNotNull())
        .select("run", "queue", "offset", "id", F.col("node").alias("src"))
        .unionByName(placed.select("run", "queue", "offset", "id", F.col("process").alias("src")))
    )


def _offset_parts(seen: Any) -> list[Any]:
    """Offsets seen holding two ids, and ids seen at two offsets."""
    from pyspark.sql import functions as F

    q0 = _q0()
    out: list[Any] = []
    inconsistent = (
        seen.groupBy("run", "queue", "offset")
        .agg(
            F.sort_array(F.collect_set("id")).alias("ids"),
            F.sort_array(F.collect_set("src")).alias("sources"),
        )
        .filter(F.size("ids") > 1)
    )
    out += _top(inconsistent, "inconsistent_offsets", [q0, "offset"])
    dup = (
        seen.groupBy("run", "queue", "id")
        .agg(F.sort_array(F.collect_set("offset")).alias("offsets"))
        .filter(F.size("offsets") > 1)
    )
    out += _top(dup, "duplicate", [q0, F.col("offsets")[0], "id"])

    return out


def _copy_parts(ids: Any, hold: Any, entries: Any, reads: Any) -> list[Any]:
    """Confirmed ids a node's copy lacks (lost on node), and those held but never read (unseen)."""
    from pyspark.sql import functions as F

    q0 = _q0()
    replicas = hold.filter(F.col("type") == "ok").select("run", "queue", "node")
    out: list[Any] = []
    status = ids.select(
        "run",
        "id",
        (F.col("outcome") == "ok").alias("confirmed"),
        ((F.col("delivered") > 0) | (F.col("consumed") > 0)).alias("got"),
    )
    held = (
        entries.groupBy("run", "queue", "id")
        .agg(F.min("offset").alias("low"), F.sort_array(F.collect_set("node")).alias("nodes"))
        .join(status, ["run", "id"])
    )
    order_key = F.struct(F.col("low").isNull(), F.coalesce("low", F.lit(0)), F.col("id"))
    missing = (
        replicas.join(held.filter("confirmed"), ["run", "queue"])
        .join(entries.select("run", "queue", "node", "id"), ["run", "queue", "node", "id"], "left_anti")
        .groupBy("run", "queue", "node")
        .agg(F.count(F.lit(1)).alias("count"), F.sort_array(F.collect_list(order_key)).alias("k"))
        .select("run", "queue", "node", "count", F.slice(F.col("k.id"), 1, ANOMALY_EXAMPLES).alias("ids"))
    )
    out.append(tagged(missing, "lost_on_node"))
    read_ids = reads.select("run", F.col("value").alias("id")).distinct()
    unseen = (
        held.filter(F.col("confirmed") & ~F.col("got"))
        .join(read_ids, ["run", "id"], "left_anti")
        .select("run", "queue", "id", F.col("low").alias("offset"), "nodes")
    )
    out += _top(unseen, "unseen", [q0, F.col("offset").isNull(), "offset", "id"])

    return out


def _poll_parts(placed: Any, seeks: Any, seen: Any) -> list[Any]:
    """Each reader's steps: backwards (nonmonotonic) and over offsets that exist (skips)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    out: list[Any] = []
    # a seek to n stands for a read of n - 1
    w = Window.partitionBy("run", "process", "queue").orderBy("index")
    steps = (
        placed.select("run", "process", "queue", "index", "offset", F.lit(False).alias("seek"))
        .unionByName(
            seeks.filter(F.col("offset").isNotNull()).select(
                "run",
                "process",
                "queue",
                "index",
                (F.col("offset") - 1).alias("offset"),
                F.lit(True).alias("seek"),
            )
        )
        .withColumn("from_offset", F.lag("offset").over(w))
        .withColumn("after_seek", F.lag("seek").over(w))
        .filter(~F.col("seek") & F.col("from_offset").isNotNull())
        .select(
            "run",
            F.col("process").alias("reader"),
            "queue",
            "index",
            "from_offset",
            F.col("offset").alias("to_offset"),
            "after_seek",
        )
    )
    back = steps.filter(F.col("to_offset") <= F.col("from_offset")).withColumn(
        "skipped", F.lit(0).cast("bigint")
    )
    out += _top(back, "nonmonotonic_poll", ["index"])
    out += _top(
        _skips(steps.filter(F.col("to_offset") > F.col("from_offset") + 1), seen), "poll_skip", ["index"]
    )
    return out


def _skips(jumps: Any, seen: Any) -> Any:
    """The steps forward that jump over offsets that exist, with how many: the existing offsets
    below ``to`` less those at or below ``from``, both counted by one running count over the
    stream's offsets and the steps' two ends in offset order (never a range join, nor a walk
    over the integers between: offsets may be sparse, Redis entry ids)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    exists = seen.select("run", "queue", "offset").distinct()
    # at one offset: a step's end ``to`` counts what is strictly below it (rank 0), an offset that
    # exists counts itself (1), a step's start ``from`` counts what is at or below it (2)
    ends = jumps.select(
        "run", "queue", "index", F.col("from_offset").alias("offset"), F.lit(2).alias("rank")
    ).unionByName(
        jumps.select("run", "queue", "index", F.col("to_offset").alias("offset"), F.lit(0).alias("rank"))
    )
    marks = ends.withColumn("exists", F.lit(0)).unionByName(
        exists.select(
            "run",
            "queue",
            F.lit(None).cast("bigint").alias("index"),
            "offset",
            F.lit(1).alias("rank"),
            F.lit(1).alias("exists"),
        )
    )
    upto = (
        Window.partitionBy("run", "queue").orderBy("offset", "rank").rowsBetween(Window.unboundedPreceding, 0)
    )
    counted = (
        marks.withColumn("below", F.sum("exists").over(upto))
        .filter(F.col("index").isNotNull())
        .groupBy("run", "index")
        .agg(F.sum(F.when(F.col("rank") == 0, F.col("below")).otherwise(-F.col("below"))).alias("skipped"))
    )
    return (
        jumps.join(counted, ["run", "index"])
        .filter(F.col("skipped") > 0)
        .select("run", "reader", "queue", "index", "from_offset", "to_offset", "after_seek", "skipped")
    )


_TOPS = ("inconsistent_offsets", "duplicate", "unseen", "nonmonotonic_poll", "poll_skip")
"""The lists ``_top`` caps."""


def _q(x: dict) -> str:
    return x.get("queue") or ""


_ORDER = {
    "lost_on_node": lambda x: (_q(x), x["node"] or ""),
    "inconsistent_offsets": lambda x: (_q(x), x["offset"]),
    "duplicate": lambda x: (_q(x), x["offsets"][0], x["id"]),
    "unseen": lambda x: (_q(x), x["offset"] is None, x["offset"] or 0, x["id"]),
    "poll_skip": lambda x: x["index"],
    "nonmonotonic_poll": lambda x: x["index"],
}


def parse(got: dict[str, list[dict]], runs: int) -> list[tuple[list[dict], dict[str, Any]]]:
    """Per run: (lost positions, stream findings) as ``_anomalies`` returns them."""
    out: list[tuple[list[dict], dict[str, Any]]] = [([], empty_findings()) for _ in range(runs)]
    for r in got.get("a_positions", []):
        run = r.pop("run")
        out[run][0].append(
            {k: int(r[k]) if k in ("lost", "prefix", "middle", "postfix") else r[k] for k in r}
        )
    for pos, _f in out:
        pos.sort(key=lambda p: p["producer"])
        for p in pos:
            p.update(
                {k: p.pop(k) for k in ("lost", "prefix", "middle", "postfix", "first_seen", "last_seen")}
            )
    for r in got.get("a_holdings", []):
        out[r.pop("run")][1]["holdings"].append(r)
    for r in got.get("a_reads", []):
        c = out[r["run"]][1]["counts"]
        c["reads"], c["readers"] = int(r["reads"]), int(r["readers"] or 0)
    for name in LISTS:
        for r in got.get(name, []):
            f = out[r.pop("run")][1]
            if name in _TOPS:  # a run's count and first rows (``_top``)
                f["counts"][name] = int(r["n"])
                f[name] += r["rows"]
            else:
                f[name].append(r)
    for run, (_pos, f) in enumerate(out):
        f["holdings"].sort(key=lambda x: (_q(x), x["node"] or ""))
        f["counts"]["holdings"] = sum(1 for x in f["holdings"] if x["outcome"] == "ok")
        for name, key in _ORDER.items():
            f[name].sort(key=key)
        f["counts"]["lost_on_node"] = sum(x["count"] for x in f["lost_on_node"])
        f["lost_on_node"] = f["lost_on_node"][:ANOMALY_EXAMPLES]
        out[run] = (_pos, f)
    return out
