"""The Spark job splits message ids into producer and seq by the rule of the Python engine's
``ID_RE`` (the order check compares seqs per producer), without a regular expression."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_reports.engines.common import ID_RE

pytestmark = pytest.mark.spark

EDGES = [
    "p1:0",
    "p1:123",
    "a:b:7",
    "a:7:b",
    ":5",
    "p1:",
    "p1",
    "",
    ":",
    "::",
    "p:1x",
    "p:x1",
    "p:-1",
    "p:+1",
    "p: 1",
    "p:1 ",
    "p:\n1",
    "p\n:1",
    "p:" + "9" * 18,
    "p:" + "9" * 19,
    "p:٣",
    "p:1٣",
    "ü:1",
    "p:0001",
]


def _python(mid: str) -> tuple[str, str]:
    m = ID_RE.fullmatch(mid)
    return (m.group(1), m.group(2)) if m else ("", "")


@settings(max_examples=25)
@given(st.lists(st.text(alphabet=st.sampled_from(list("ab:0123456789 \n٣+-ü")), max_size=24), max_size=60))
def test_producer_and_seq_split_ids_as_id_re_does(spark_engine, ids: list[str]) -> None:
    from spark_reports import spark_session
    from spark_reports.engines.spark.sql import producer_and_seq

    rows = [(i, mid) for i, mid in enumerate(EDGES + ids)]
    df = spark_session().createDataFrame(rows, "i int, id string")
    producer, seq = producer_and_seq("id")
    got = {r["i"]: (r["p"], r["s"]) for r in df.select("i", producer.alias("p"), seq.alias("s")).collect()}
    assert got == {i: _python(mid) for i, mid in rows}
