"""The per-row bit sets the Spark job groups by (fault kinds a message was exposed to, fault
windows an attempt fell in), with more conditions than one long holds."""

from __future__ import annotations

import pytest

from spark_reports.engines.spark.check import BITS, _bit_chunks, _named


def test_named_reads_each_chunk_and_says_none_once() -> None:
    names = [f"w{i}" for i in range(BITS + 3)]
    assert _named(0, 0, names, "outside") == ["outside"]
    assert _named(2, 0, names, "outside") == []  # the second chunk of a row that met nothing
    assert _named(1, 0b101, names, "outside") == ["w0", "w2"]
    assert _named(3, 0b10, names, "outside") == [f"w{BITS + 1}"]
    assert _named(1, 0, names, "outside") == []  # met something, but in another chunk


@pytest.mark.spark
def test_bit_chunks_give_every_met_condition_once(spark_engine) -> None:
    from pyspark.sql import functions as F

    from spark_reports import spark_session

    spark = spark_session()
    n = 2 * BITS + 5  # three chunks
    values = [-1, 0, 1, BITS - 1, BITS, 2 * BITS + 4, 7]
    df = spark.createDataFrame([(0, v) for v in values], "run int, v long")
    conds = [(F.col("v") == i) | ((F.col("v") == 7) & F.lit(i % 40 == 0)) for i in range(n)]
    names = [f"c{i}" for i in range(n)]
    pairs = [F.struct(c.alias("chunk"), b.alias("bits")) for c, b in _bit_chunks(conds)]
    rows = df.select("v", F.explode(F.array(*pairs)).alias("p")).select("v", "p.chunk", "p.bits").collect()
    met: dict[int, list[str]] = {}
    for r in rows:
        met.setdefault(r["v"], []).extend(_named(r["chunk"], r["bits"], names, "none"))
    assert len(rows) == 3 * len(values)
    assert met == {
        -1: ["none"],
        0: ["c0"],
        1: ["c1"],
        BITS - 1: [f"c{BITS - 1}"],
        BITS: [f"c{BITS}"],
        2 * BITS + 4: [f"c{2 * BITS + 4}"],
        7: ["c0", "c7", "c40", "c80", "c120"],
    }
