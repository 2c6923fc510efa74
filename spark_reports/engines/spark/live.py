"""Liveness in Spark: the ``LiveFacts`` of every run from the ok ops.

Per (run, queue, kind, node) and stretch between consecutive heal times, the count, first and
last ok (``live_metrics``: keyed metric rows of the check's one aggregate, so liveness reads the
history in the same pass as the timeline); the first ok at or after a fault's heal and the
last before it are then the least first of the stretches after the heal and the greatest last
of those before, on the driver. Per queue the publish span, likewise. The gaps longer than the
threshold between consecutive oks of a queue and kind are a running maximum over the oks in time
order, in the check's one window (``window``): only the few long ones reach the driver; the last
consume ok at or before a queue's last publish record is one more row of that window per queue. Everything else is
``_liveness``'s, shared with the Python engine.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from typing import Any

from spark_reports.engines.common import NEMESIS
from spark_reports.engines.liveness import NS_PER_S, LiveFacts, NodeOks, heal_times
from spark_reports.engines.spark.scope import Scope
from spark_reports.engines.spark.sql import tagged


def _client(h: Any) -> Any:
    from pyspark.sql import functions as F

    return ~F.col("process").eqNullSafe(NEMESIS) & F.col("value").isNotNull() & F.col("queue").isNotNull()


def _kind(scope: Scope) -> Any:
    """A client record's liveness kind: 0 an ok publish, 1 an ok consume (an ack with acks), else null."""
    from pyspark.sql import functions as F

    f, ty = F.col("f"), F.col("type")
    acks = scope.scalar("x_acks")
    return F.when((f == "publish") & (ty == "ok"), 0).when(
        (ty == "ok") & ((acks & (f == "ack")) | (~acks & (f == "consume"))), 1
    )


def _heals(scope: Scope) -> list[list[int]]:
    """Per run, its distinct heal times in order: the bounds of the stretches ``live_metrics`` keys by."""
    return [
        sorted({x for x in heal_times(c.windows) if x is not None}) for _r, c in sorted(scope.ctxs.items())
    ]


def live_metrics(h: Any, scope: Scope, metric: Callable[..., Any]) -> list[Any]:
    """Metric structs (``metric``: the check's ``_metric``) of a history record ``h``'s row: an ok's
    (``live_ok``: queue, node, stretch, kind; its count, first and last) and a publish record's
    (``live_pub``: queue, invoke or not; first and last)."""
    from pyspark.sql import functions as F

    t = F.col("time_ns")
    heals = _heals(scope)
    bounds = [
        scope.per_run([x[i] if i < len(x) else None for x in heals], "bigint")
        for i in range(max((len(x) for x in heals), default=0))
    ]
    stretch = reduce(lambda a, b: a + b, [F.when(t >= b, 1).otherwise(0) for b in bounds], F.lit(0))
    client, kind = _client(h), _kind(scope)
    ok = metric(
        "live_ok",
        keys={"s1": F.col("queue"), "s2": F.col("node"), "l1": stretch, "l2": kind},
        mn=t,
        mx=t,
        when=client & kind.isNotNull(),
    )
    pub = metric(
        "live_pub",
        keys={"s1": F.col("queue"), "l1": (F.col("type") == "invoke").cast("long")},
        mn=t,
        mx=t,
        when=client & (F.col("f") == "publish"),
    )
    return [ok, pub]


def ok_records(h: Any, scope: Scope) -> Any:
    """The ok client records of a liveness kind (``kind``: 0 publish, 1 consume), whose gaps longer
    than the threshold per queue and kind ``window.gap_source`` finds."""
    from pyspark.sql import functions as F

    return h.filter(_client(h)).withColumn("kind", _kind(scope)).filter(F.col("kind").isNotNull())


def publish_records(h: Any) -> Any:
    """The client publish records of every type (``live_pub``'s), the markers among a queue's
    consume oks in ``window.gap_source``."""
    from pyspark.sql import functions as F

    return h.filter(_client(h) & (F.col("f") == "publish"))


def stranded_part(ids: Any) -> Any:
    """The tagged part ``live_stranded`` (``LiveFacts.stranded``): the per-id rows flagged
    ``is_drain_first`` (confirmed, first acked by the drain) by run, queue, drain node and confirm
    second."""
    from pyspark.sql import functions as F

    fa = F.col("first_ack")
    first = ids.filter(F.col("is_drain_first")).select(
        "run",
        fa["queue"].alias("queue"),
        fa["node"].alias("node"),
        F.floor(F.col("c_t") / NS_PER_S).cast("long").alias("second"),
        F.col("c_t").alias("c_t"),
        fa["time_ns"].alias("read"),
    )
    grouped = first.groupBy("run", "queue", "node", "second").agg(
        F.count(F.lit(1)).alias("n"),
        F.min("c_t").alias("c_from"),
        F.max("c_t").alias("c_to"),
        F.max("read").alias("read_to"),
        F.max(F.col("read") - F.col("c_t")).alias("wait"),
    )
    return tagged(grouped, "live_stranded")


KINDS = ("publish", "consume")


def parse_live(metrics: list[dict], parts: dict[str, list[dict]], scope: Scope) -> dict[int, LiveFacts]:
    """Each run's ``LiveFacts`` from the check's metric rows (``live_metrics``) and the gaps part."""
    out = {i: LiveFacts() for i in range(len(scope.ctxs))}
    stretches: dict[tuple[int, str, str, str], list[dict]] = {}
    for r in metrics:
        if r["tag"] == "live_ok":
            key = (r["run"], r["s1"], KINDS[int(r["l2"])], r["s2"])
            stretches.setdefault(key, []).append(r)
        elif r["tag"] == "live_pub":
            first, last, last_invoke = out[r["run"]].publish.get(r["s1"], (None, int(r["mx"]), None))
            if int(r["l1"]):
                first, last_invoke = _least(first, int(r["mn"])), _most(last_invoke, int(r["mx"]))
            out[r["run"]].publish[r["s1"]] = (first, max(last, int(r["mx"])), last_invoke)
    heals = _heals(scope)
    for (run, queue, kind, node), rows in stretches.items():
        at = [heals[run].index(x) + 1 if x is not None else None for x in heal_times(scope.ctxs[run].windows)]
        out[run].oks[(queue, kind, node)] = NodeOks(
            count=sum(int(r["v"][0]) for r in rows),
            first_ns=min(int(r["mn"]) for r in rows),
            last_ns=max(int(r["mx"]) for r in rows),
            after_heal=[
                None if k is None else _least(*[int(r["mn"]) for r in rows if r["l1"] >= k]) for k in at
            ],
            before_heal=[
                None if k is None else _most(*[int(r["mx"]) for r in rows if r["l1"] < k]) for k in at
            ],
        )
    for r in parts.get("live_gap", []):
        out[r["run"]].gaps.append((r["queue"], r["kind"], int(r["a"]), int(r["b"])))
    for r in parts.get("live_near", []):
        out[r["run"]].consume_by_publish_end[r["queue"]] = int(r["at"])
    for r in parts.get("live_stranded", []):
        second, n, c_from, c_to, read_to, wait = (
            int(r[k]) for k in ("second", "n", "c_from", "c_to", "read_to", "wait")
        )
        out[r["run"]].stranded.append((r["queue"], r["node"], second, n, c_from, c_to, read_to, wait))
    for facts in out.values():
        facts.gaps.sort()
    return out


def _least(*xs: int | None) -> int | None:
    got = [x for x in xs if x is not None]
    return min(got) if got else None


def _most(*xs: int | None) -> int | None:
    got = [x for x in xs if x is not None]
    return max(got) if got else None
