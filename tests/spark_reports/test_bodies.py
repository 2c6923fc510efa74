"""The Spark job recomputes each sent body in SQL: it must be byte for byte ``message_body``."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from harness.spec import body_digest, message_body
from spark_reports.engines.spark.sql import body_from_payload_sql, digest_sql, payload_sql
from tests.factories import fixture_settings

IDS = st.text(st.characters(codec="utf-8"), max_size=40) | st.from_regex(
    r"p[0-9]{1,3}:[0-9]{1,18}", fullmatch=True
)
SIZES = st.integers(0, 300) | st.sampled_from([4096, 70_000])


def _sql_bodies(spark, seed: int, pairs: list[tuple[str, int]]) -> list[tuple[str, str]]:
    from pyspark.sql import functions as F

    df = spark.createDataFrame(pairs, "id string, size int")
    body = F.expr(body_from_payload_sql("id", payload_sql("id", seed, "size")))
    rows = df.select(body.alias("b")).select("b", F.expr(digest_sql("b")).alias("d")).collect()
    return [(r["b"], r["d"]) for r in rows]


@pytest.mark.spark
@fixture_settings(12, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), pairs=st.lists(st.tuples(IDS, SIZES), min_size=1, max_size=60))
@example(
    seed=0,
    pairs=[
        ("p1:1", 0),
        ("p1:1", 5),
        ("p12:345", 8),
        ("p1:1", 21),
        ("p1:1", 22),
        ("p1:1", 23),
        ("p1:1", 86),
        ("p1:1", 87),
        ("p1:1", 88),
        ("", 0),
        ("", 17),
        ("ü:1", 40),
        ("p1:1", 256),
    ],
)
def test_sql_body_and_digest_equal_message_body(
    seed: int, pairs: list[tuple[str, int]], spark_engine
) -> None:
    from spark_reports import spark_session

    got = _sql_bodies(spark_session(), seed, pairs)
    want = [(message_body(i, seed, n).decode(), body_digest(message_body(i, seed, n))) for i, n in pairs]
    assert got == want
    # Sizes smaller than the id still give the id, a check and an empty payload.
    for (i, n), (b, _) in zip(pairs, got, strict=True):
        assert b.startswith(i + "|") and len(b) == max(n, len(i) + 18)
