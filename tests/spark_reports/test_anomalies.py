"""Jepsen's finer classes (``results.anomalies``) on planted histories: each class found where it
was planted and nowhere else, by the Python engine and, exactly alike, by the Spark job."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from harness.spec import entry_offset
from spark_reports import check_python
from spark_reports.synth import HistoryBuilder


def _stream(b: HistoryBuilder, n: int = 10, *, consumed: Iterable[int] = ()) -> None:
    """p1:1..n confirmed at offsets 1..n, the ones in ``consumed`` consumed (the test drains after)."""
    for i in range(1, n + 1):
        b.publish(f"p1:{i}")
    for i in consumed:
        b.consume(f"p1:{i}")


def _check(b: HistoryBuilder, tmp_path: Path) -> dict[str, Any]:
    return dict(check_python(b.write(tmp_path), {}))


def _positions(r: dict) -> tuple[int, int, int]:
    c = r["anomalies"]["counts"]
    return c["lost_prefix"], c["lost_middle"], c["lost_postfix"]


def test_a_truncated_tail_is_lost_postfix(tmp_path: Path) -> None:
    b = HistoryBuilder()
    _stream(b, consumed=range(1, 7))
    b.drain()
    r = _check(b, tmp_path)
    assert r["verdict"] == "LOST" and _positions(r) == (0, 0, 4)
    assert r["anomalies"]["lost_positions"] == [
        {"producer": "p1", "lost": 4, "prefix": 0, "middle": 0, "postfix": 4, "first_seen": 1, "last_seen": 6}
    ]


@pytest.mark.parametrize(
    ("consumed", "positions"),
    [
        pytest.param([1, 2, 3, 7, 8, 9, 10], (0, 3, 0), id="a hole is lost_middle"),
        pytest.param(range(4, 11), (3, 0, 0), id="a lost head is lost_prefix"),
    ],
)
def test_a_lost_run_is_classed_by_where_it_stands(
    tmp_path: Path, consumed: Iterable[int], positions: tuple[int, int, int]
) -> None:
    b = HistoryBuilder()
    _stream(b, consumed=consumed)
    b.drain()
    assert _positions(_check(b, tmp_path)) == positions


def test_a_producer_with_no_survivor_is_all_postfix_and_reads_are_no_survivors(tmp_path: Path) -> None:
    b = HistoryBuilder()
    _stream(b, 3)
    b.read("p1:2", 2)  # a read is not a consumption: nothing of p1 survived
    b.drain()
    r = _check(b, tmp_path)
    assert _positions(r) == (0, 0, 3)


def test_missing_but_not_lost_has_no_positions(tmp_path: Path) -> None:
    """An unfinished drain: what is missing is unreachable, not lost, and has no position class."""
    b = HistoryBuilder()
    _stream(b, consumed=range(1, 5))
    b.drain(outcome="info")
    r = _check(b, tmp_path)
    assert r["counts"]["unreachable"] == 6 and _positions(r) == (0, 0, 0)
    assert r["anomalies"]["lost_positions"] == []


def test_a_durable_history_without_holdings_or_reads_has_no_anomaly(tmp_path: Path) -> None:
    b = HistoryBuilder()
    _stream(b, consumed=range(1, 11))
    b.drain()
    r = _check(b, tmp_path)
    assert r["verdict"] == "durable"
    assert not any(r["anomalies"]["counts"].values())


def test_lost_on_node_from_holdings_is_integrity(tmp_path: Path) -> None:
    """Every message consumed, but n2's copy lacks the last two that n1 and n3 hold."""
    b = HistoryBuilder()
    _stream(b, consumed=range(1, 11))
    b.drain()
    full = [(k, f"p1:{k}") for k in range(1, 11)]
    b.holdings("n1", full)
    b.holdings("n2", full[:8])
    b.holdings("n3", full)
    b.holdings("n4", None)  # cannot tell: not a replica the check can judge
    r = _check(b, tmp_path)
    a = r["anomalies"]
    assert a["counts"]["lost_on_node"] == 2 and a["counts"]["holdings"] == 3
    assert a["lost_on_node"] == [{"queue": "q", "node": "n2", "count": 2, "ids": ["p1:9", "p1:10"]}]
    assert [h["outcome"] for h in a["holdings"]] == ["ok", "ok", "ok", "info"]
    assert (r["valid"], r["verdict"]) == (False, "INTEGRITY")
    assert "missing from a node's copy" in r["reason"]


def test_unconfirmed_messages_on_one_copy_are_not_lost_on_node(tmp_path: Path) -> None:
    b = HistoryBuilder()
    _stream(b, 2, consumed=[1, 2])
    b.publish("p1:3", "info")
    b.drain()
    b.holdings("n1", [(1, "p1:1"), (2, "p1:2"), (3, "p1:3")])
    b.holdings("n2", [(1, "p1:1"), (2, "p1:2")])
    r = _check(b, tmp_path)
    assert r["anomalies"]["counts"]["lost_on_node"] == 0 and r["verdict"] == "durable"


def test_unseen_is_held_confirmed_and_never_consumed_nor_read(tmp_path: Path) -> None:
    b = HistoryBuilder()
    _stream(b, 5, consumed=[1, 2])
    b.read("p1:3", 3)
    b.drain()
    copy = [(k, f"p1:{k}") for k in range(1, 6)]
    b.holdings("n1", copy)
    b.holdings("n2", copy[:4])
    r = _check(b, tmp_path)
    a = r["anomalies"]
    assert [(u["id"], u["offset"], u["nodes"]) for u in a["unseen"]] == [
        ("p1:4", 4, ["n1", "n2"]),
        ("p1:5", 5, ["n1"]),
    ]
    assert r["verdict"] == "LOST"  # unseen refines it; p1:3 was read but never consumed: lost, seen


def test_inconsistent_offsets_and_duplicates(tmp_path: Path) -> None:
    b = HistoryBuilder()
    _stream(b, 4, consumed=range(1, 5))
    b.read("p1:1", 1)
    b.read("p1:3", 2, reader="r2")  # offset 2 holds p1:2 on the nodes
    b.drain()
    b.holdings("n1", [(1, "p1:1"), (2, "p1:2"), (3, "p1:3"), (4, "p1:4")])
    b.holdings("n2", [(1, "p1:1"), (2, "p1:2"), (3, "p1:3"), (4, "p1:4"), (5, "p1:4")])
    r = _check(b, tmp_path)
    a = r["anomalies"]
    assert a["inconsistent_offsets"] == [
        {"queue": "q", "offset": 2, "ids": ["p1:2", "p1:3"], "sources": ["n1", "n2", "r2"]}
    ]
    assert a["duplicate"] == [
        {"queue": "q", "id": "p1:3", "offsets": [2, 3]},
        {"queue": "q", "id": "p1:4", "offsets": [4, 5]},
    ]
    assert r["verdict"] == "INTEGRITY"


def _reader_history() -> HistoryBuilder:
    b = HistoryBuilder()
    _stream(b, 8, consumed=range(1, 9))
    for k in (1, 2, 4):  # skips 3, which r2 reads
        b.read(f"p1:{k}", k)
    b.read("p1:2", 2)  # back to 2 with no seek: nonmonotonic
    b.seek(2)
    b.read("p1:2", 2)  # after a seek to 2: fine
    b.read("p1:3", 3)
    b.seek(5)
    b.read("p1:8", 8)  # from a seek to 5 to 8: skips 5..7 that the copy holds
    b.read("p1:8", 8, reader="r3")
    b.read("p1:3", 3, reader="r2")
    b.drain()
    b.holdings("n1", [(k, f"p1:{k}") for k in range(1, 9)])
    return b


def test_poll_skip_and_nonmonotonic_poll(tmp_path: Path) -> None:
    r = _check(_reader_history(), tmp_path)
    a = r["anomalies"]
    assert [(s["from_offset"], s["to_offset"], s["skipped"], s["after_seek"]) for s in a["poll_skip"]] == [
        (2, 4, 1, False),
        (4, 8, 3, True),
    ]
    assert [(s["reader"], s["from_offset"], s["to_offset"]) for s in a["nonmonotonic_poll"]] == [("r1", 4, 2)]
    assert a["counts"]["readers"] == 3 and a["counts"]["reads"] == 9
    assert r["verdict"] == "INTEGRITY"


def test_a_jump_over_offsets_nobody_saw_is_no_skip(tmp_path: Path) -> None:
    b = HistoryBuilder()
    _stream(b, 2, consumed=[1, 2])
    b.read("p1:1", 1)
    b.read("p1:2", 5)  # 2..4 exist nowhere (removed, or never written)
    b.drain()
    r = _check(b, tmp_path)
    assert r["anomalies"]["counts"]["poll_skip"] == 0 and r["verdict"] == "durable"


@pytest.mark.spark
def test_spark_agrees_on_every_planted_class(tmp_path: Path, spark_engine) -> None:
    b = _reader_history()
    for k in range(9, 13):
        b.publish(f"p2:{k}")
    b.consume("p2:11")
    b.holdings("n2", [(k, f"p1:{k}") for k in range(1, 8)] + [(3, "p2:9")])
    b.holdings("n3", None)
    b.write(tmp_path, jsonl=False)
    expected: dict[str, Any] = dict(check_python(tmp_path, {}))
    got: dict[str, Any] = dict(spark_engine(tmp_path, {}))
    assert any(
        expected["anomalies"]["counts"][k] for k in ("lost_on_node", "poll_skip", "inconsistent_offsets")
    )
    assert (got.pop("engine"), expected.pop("engine")) == ("spark", "python")
    assert got["anomalies"] == expected["anomalies"]
    assert got == expected


def test_report_terminal_and_grade_show_the_classes_only_when_they_occur(tmp_path: Path) -> None:
    from harness.verdicts import summary_table
    from spark_reports.engines.grade import describe_grade, grade_results
    from spark_reports.reports.report import render_report

    b = HistoryBuilder()
    _stream(b, consumed=range(1, 7))
    b.drain()
    b.holdings("n1", [(k, f"p1:{k}") for k in range(1, 11)])
    lossy = _check(b, tmp_path / "lossy")
    clean = HistoryBuilder()
    _stream(clean, consumed=range(1, 11))
    clean.drain()
    durable = _check(clean, tmp_path / "durable")
    page = render_report(tmp_path / "lossy", lossy).read_text()  # type: ignore[arg-type]
    assert "Anomaly classes" in page and "lost_postfix" in page and "What each node" in page
    assert "lost_prefix" not in page  # none occurred
    page = render_report(tmp_path / "durable", durable).read_text()  # type: ignore[arg-type]
    assert "Anomaly classes" not in page and "What each node" not in page
    assert "lost postfix" in summary_table(lossy) and "lost postfix" not in summary_table(durable)
    grade = grade_results([("a", lossy, 1), ("b", durable, 2)])
    assert grade["anomalies"] == {"lost_postfix": [1, 4], "unseen": [1, 4]}
    assert grade["runs"][1]["anomalies"] == {}
    assert any("lost postfix in 1 run (4)" in line for line in describe_grade(grade))


# -- sparse offsets (Redis Streams entry ids ``ms-seq`` as ``ms * 1_000_000 + seq``) -------------

_MS = 1_700_000_000_000
_IDS = ["0-0", "0-1", "5-0", "5-1", "17-0", "42-0", "42-1", "100-0"]  # p1:1..8, ms after _MS


def _at(k: int) -> int:
    """The offset of p1:k's entry id."""
    ms, seq = _IDS[k - 1].split("-")
    return entry_offset(f"{_MS + int(ms)}-{seq}")


def _redis_history() -> HistoryBuilder:
    """Readers of a Redis stream: one skip over an entry a node holds, one read back without a
    seek, a seek after which a read skips two entries, a message at two ids on one node, and one
    id read as another message than the nodes hold; every other step jumps millions of integers
    that are no entries."""
    b = HistoryBuilder()
    _stream(b, 8, consumed=range(1, 9))
    for k in (1, 2, 4):  # from 0-1 to 5-1: skips 5-0 (p1:3), which the copies hold
        b.read(f"p1:{k}", _at(k))
    b.read("p1:2", _at(2))  # back to 0-1 with no seek: nonmonotonic
    b.seek(_at(2) + 1)  # XREAD from 0-1 again, on purpose
    b.read("p1:3", _at(3))  # the first entry after it: no skip, though 5 million integers lie between
    b.seek(_at(5) + 1)
    b.read("p1:8", _at(8))  # from after 17-0 to 100-0: skips 42-0 and 42-1
    b.read("p1:9", _at(5), reader="r2")  # 17-0 holds p1:5 on the nodes
    b.read("p1:6", _at(6), reader="r2")
    b.drain()
    copy = [(_at(k), f"p1:{k}") for k in range(1, 9)]
    b.holdings("n1", copy)
    b.holdings("n2", [*copy, (_at(8) + 1, "p1:8")])  # p1:8 again, at 100-1
    return b


def test_sparse_offsets_poll_skip_nonmonotonic_duplicate_inconsistent(tmp_path: Path) -> None:
    r = _check(_redis_history(), tmp_path)
    a = r["anomalies"]
    assert [(s["from_offset"], s["to_offset"], s["skipped"], s["after_seek"]) for s in a["poll_skip"]] == [
        (_at(2), _at(4), 1, False),
        (_at(5), _at(8), 2, True),
    ]
    assert [(s["reader"], s["from_offset"], s["to_offset"]) for s in a["nonmonotonic_poll"]] == [
        ("r1", _at(4), _at(2))
    ]
    assert a["duplicate"] == [{"queue": "q", "id": "p1:8", "offsets": [_at(8), _at(8) + 1]}]
    assert a["inconsistent_offsets"] == [
        {"queue": "q", "offset": _at(5), "ids": ["p1:5", "p1:9"], "sources": ["n1", "n2", "r2"]}
    ]
    assert a["counts"]["readers"] == 2 and a["counts"]["lost_on_node"] == 0
    assert r["verdict"] == "INTEGRITY"


@pytest.mark.spark
def test_spark_agrees_on_sparse_offsets(tmp_path: Path, spark_engine) -> None:
    b = _redis_history()
    b.write(tmp_path, jsonl=False)
    expected: dict[str, Any] = dict(check_python(tmp_path, {}))
    got: dict[str, Any] = dict(spark_engine(tmp_path, {}))
    assert expected["anomalies"]["counts"]["poll_skip"] == 2
    assert (got.pop("engine"), expected.pop("engine")) == ("spark", "python")
    assert got == expected


@pytest.mark.spark
def test_spark_skips_the_stream_classes_of_a_queue_history_and_still_agrees(
    tmp_path: Path, spark_engine
) -> None:
    """A history without holdings, reads or seeks (a queue's) is checked without the stream parts:
    its lost positions still come from Spark, every stream class is empty, as Python has them."""
    from harness.spec.history import STREAM_OPS
    from spark_reports.engines.spark.check import _distinct

    b = HistoryBuilder()
    _stream(b, consumed=[1, 2, 3, 8, 9, 10])
    b.drain()
    path = b.write(tmp_path, jsonl=False)
    assert not _distinct(path / "history.parquet", ("f",))["f"] & STREAM_OPS
    expected: dict[str, Any] = dict(check_python(path, {}))
    got: dict[str, Any] = dict(spark_engine(path, {}))
    assert _positions(expected) == (0, 4, 0)
    assert (got.pop("engine"), expected.pop("engine")) == ("spark", "python")
    assert got == expected
