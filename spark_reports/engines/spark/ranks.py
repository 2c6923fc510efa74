"""Exact nearest-rank order statistics of a long column in Spark, without a sort."""

from __future__ import annotations

from typing import Any

from spark_reports.engines.common import PERCENTILES, rank_for
from spark_reports.engines.spark.sql import tagged


class Ranks:
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
        self.ranges = {
            name: sorted({(lo, hi) for (s, _), (lo, hi, _r) in self.pending.items() if s == name})
            for name in self.series
        }
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
            parts.append(
                self.series[name][0]
                .select(F.lit(name).alias("series"), tag.alias("t"), base.alias("b"), sh.alias("sh"), "v")
                .filter(F.col("t").isNotNull())
            )
        df = parts[0]
        for p in parts[1:]:
            df = df.unionByName(p)
        return tagged(
            df.groupBy("series", "t", "b", "sh", F.expr("shiftright(v - b, sh)").alias("k")).count(), "rank"
        )

    def feed(self, rows: list[dict]) -> None:
        split: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
        for r in rows:
            lo, s = int(r["b"]), int(r["sh"])
            split.setdefault((r["series"], int(r["t"])), []).append(
                (lo + (r["k"] << s), lo + ((r["k"] + 1) << s), int(r["count"]))
            )
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
