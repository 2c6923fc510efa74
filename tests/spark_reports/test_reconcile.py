"""Each class of the reconciliation on a literal history, checked by the Python engine.

The same literal histories are then run through Spark (test_spark_matches_python_on_literals)
so each class is pinned for both engines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_reports import HistoryError, check_python
from spark_reports.synth import HistoryBuilder


def _lost() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.publish("p1:2", node="n2")
    b.consume("p1:1")
    b.drain()
    return b


def _lost_undrained() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.drain(complete=False)
    return b


def _unexpected() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.consume("p1:1")
    b.consume("p7:3")
    b.drain()
    return b


def _duplicated() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.consume("p1:1", node="n1")
    b.consume("p1:1", node="n2", consumer="c2", redelivered=True)
    b.drain()
    return b


def _recovered() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1", "info")
    b.publish("p1:2", "fail")
    b.publish("p1:3", None)  # the run died before the confirm: indeterminate
    b.consume("p1:1")
    b.consume("p1:2")
    b.drain()
    return b


def _reordered() -> HistoryBuilder:
    b = HistoryBuilder()
    for i in range(1, 5):
        b.publish(f"p1:{i}")
    b.publish("p2:1")
    b.consume("p1:2")
    b.consume("p2:1")
    b.consume("p1:1")  # after p1:2 on the same consumer and queue: a violation
    b.consume("p1:4", consumer="c2")
    b.consume("p1:3", consumer="c2")  # after p1:4: a second violation
    b.consume("p1:1", redelivered=True)  # redeliveries are not order violations
    b.drain()
    return b


def _info_ops() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1", "info")
    b.publish("p1:1", "ok")  # retried with the same id, confirmed the second time
    b.publish("p1:2", "info")
    b.publish("p1:3", None)
    b.consume("p1:1")
    b.drain()
    return b


def _consumed_in_fault() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.fault("f1", "partition", node="n2", partitions=[["n1"], ["n2", "n3"]])
    b.publish("p1:2", "info")
    b.consume("p1:1", node="n1")
    b.heal("f1")
    b.drain()
    return b


def _attributed() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1", node="n1")  # confirmed before any fault, consumed: exposed, not lost
    b.fault("f1", "kill", node="n2")
    b.publish("p1:2", node="n2")  # confirmed by n2 during the kill, never consumed
    b.heal("f1")
    b.fault("f2", "power-loss", node="n3")  # never healed: open to the end
    b.publish("p1:3", node="n3")
    b.consume("p1:1")
    b.drain()
    return b


LITERALS = {
    "lost": _lost, "lost_undrained": _lost_undrained, "unexpected": _unexpected, "duplicated": _duplicated,
    "recovered": _recovered, "reordered": _reordered, "info_ops": _info_ops,
    "consumed_in_fault": _consumed_in_fault, "attributed": _attributed,
}


def run(tmp_path: Path, name: str, **kw) -> dict:
    LITERALS[name]().write(tmp_path / name, **kw)
    return check_python(tmp_path / name, {})


def test_lost(tmp_path: Path) -> None:
    r = run(tmp_path, "lost")
    assert (r["valid"], r["verdict"]) == (False, "LOST")
    assert r["lost"] == ["p1:2"] and not r["lost_truncated"]
    assert r["counts"]["lost"] == 1 and r["counts"]["confirmed"] == 2
    assert r["attribution"]["rows"] == [{"fault_kind": "none", "node": "n2", "count": 1}]


def test_lost_without_completed_drain_is_unknown(tmp_path: Path) -> None:
    r = run(tmp_path, "lost_undrained")
    assert (r["valid"], r["verdict"]) == ("unknown", "unknown")
    assert r["counts"]["lost"] == 1 and r["drain"]["completed"] is False
    assert "did not complete" in r["reason"]


def test_no_drain_at_all_is_unknown(tmp_path: Path) -> None:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.write(tmp_path)
    r = check_python(tmp_path, {})
    assert r["verdict"] == "unknown" and "no drain" in r["reason"]


def test_unexpected(tmp_path: Path) -> None:
    r = run(tmp_path, "unexpected")
    assert (r["valid"], r["verdict"]) == (False, "INTEGRITY")
    assert r["unexpected"] == ["p7:3"]
    assert r["unexpected_detail"][0]["outcome"] == "none"
    assert r["counts"]["consumed_unique"] == 2


def test_duplicated_is_reported_not_failed(tmp_path: Path) -> None:
    r = run(tmp_path, "duplicated")
    assert (r["valid"], r["verdict"]) == (True, "durable")
    assert r["counts"]["duplicated"] == 1 and r["counts"]["consumed_total"] == 2
    [d] = r["duplicated"]
    assert [(x["node"], x["redelivered"]) for x in d["deliveries"]] == [("n1", False), ("n2", True)]


def test_recovered(tmp_path: Path) -> None:
    r = run(tmp_path, "recovered")
    assert (r["valid"], r["verdict"]) == (True, "durable")
    c = r["counts"]
    assert (c["confirmed"], c["failed"], c["unknown"], c["recovered"], c["lost"]) == (0, 1, 2, 2, 0)
    assert [d["id"] for d in r["recovered"]] == ["p1:1", "p1:2"]
    assert [d["outcome"] for d in r["recovered"]] == ["info", "fail"]


def test_reordered(tmp_path: Path) -> None:
    r = run(tmp_path, "reordered")
    assert r["valid"] is True
    assert r["counts"]["order_violations"] == 2
    assert [(v["consumer"], v["id"], v["after_seq"]) for v in r["order_violations"]] == [
        ("c1", "p1:1", 2), ("c2", "p1:3", 4)]


def test_info_ops_and_retries(tmp_path: Path) -> None:
    r = run(tmp_path, "info_ops")
    c = r["counts"]
    assert (c["attempted"], c["publish_attempts"], c["confirmed"], c["unknown"], c["lost"]) == (3, 4, 1, 2, 0)
    assert r["verdict"] == "durable"
    # The confirm latency is measured from the retry that got the ok, one tick (1 ms) earlier.
    assert r["latency"]["confirm_ms"] == {"n": 1, "p50": 1.0, "p95": 1.0, "p99": 1.0, "max": 1.0}
    # Unconfirmed attempts count against availability.
    assert r["availability"] == [{"window": "outside", "kind": None, "attempts": 4, "confirmed": 1, "share": 0.25}]


def test_message_consumed_only_during_a_fault_is_not_lost(tmp_path: Path) -> None:
    r = run(tmp_path, "consumed_in_fault")
    assert (r["valid"], r["verdict"]) == (True, "durable")
    [w] = r["faults"]
    assert (w["fault_id"], w["kind"], w["node"], w["healed"], w["applied"]) == ("f1", "partition", "n2", True, True)
    assert w["params"] == {"partitions": [["n1"], ["n2", "n3"]]}
    [d] = [x for x in LITERALS["consumed_in_fault"]().rows if x["f"] == "consume" and x["type"] == "ok"]
    assert w["start_ns"] <= d["time_ns"] <= w["end_ns"]
    assert r["availability"][0] == {"window": "f1", "kind": "partition", "attempts": 1, "confirmed": 0,
                                    "share": 0.0}


def test_attribution(tmp_path: Path) -> None:
    r = run(tmp_path, "attributed")
    assert r["lost"] == ["p1:2", "p1:3"]
    a = r["attribution"]
    assert a["rows"] == [
        {"fault_kind": "kill", "node": "n2", "count": 1},
        {"fault_kind": "power-loss", "node": "n2", "count": 1},
        {"fault_kind": "power-loss", "node": "n3", "count": 1},
    ]
    assert [(m["id"], m["confirm_node"], m["fault_ids"], m["fault_kinds"]) for m in a["messages"]] == [
        ("p1:2", "n2", ["f1", "f2"], ["kill", "power-loss"]), ("p1:3", "n3", ["f2"], ["power-loss"])]
    f2 = r["faults"][1]
    assert f2["healed"] is False and f2["end_ns"] == r["end_ns"]
    assert {e["fault_kind"]: (e["confirmed"], e["lost"]) for e in a["exposure"]} == {
        "kill": (2, 1), "power-loss": (3, 2)}


def test_percentiles_are_nearest_rank(tmp_path: Path) -> None:
    b = HistoryBuilder()
    for i in range(1, 101):
        b.op("p1", "invoke", "publish", f"p1:{i}")
        b.op("p1", "ok", "publish", f"p1:{i}", at=b.t + i * 1000)  # latency i microseconds
    b.drain()
    b.write(tmp_path)
    lat = check_python(tmp_path, {})["latency"]["confirm_ms"]
    assert lat == {"n": 100, "p50": 0.05, "p95": 0.095, "p99": 0.099, "max": 0.1}


def test_python_reads_jsonl_when_parquet_is_missing(tmp_path: Path) -> None:
    r_jsonl = run(tmp_path, "attributed", parquet=False)
    r_parquet = check_python(_write(tmp_path / "pq", "attributed"), {})
    assert r_jsonl == r_parquet


def _write(d: Path, name: str) -> Path:
    LITERALS[name]().write(d)
    return d


def test_missing_history_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="no history.parquet or history.jsonl in"):
        check_python(tmp_path, {})


@pytest.mark.spark
@pytest.mark.slow
def test_spark_matches_python_on_literals(tmp_path: Path, spark_engine) -> None:
    for name, make in LITERALS.items():
        make().write(tmp_path / name)
        expected = check_python(tmp_path / name, {})
        got = spark_engine(tmp_path / name, {})
        assert got["engine"] == "spark"
        got["engine"] = "python"
        assert got == expected, name


@pytest.mark.spark
def test_spark_needs_parquet(tmp_path: Path, spark_engine) -> None:
    _lost().write(tmp_path, parquet=False)
    with pytest.raises(HistoryError, match="no history.parquet in"):
        spark_engine(tmp_path, {})


@pytest.mark.spark
@pytest.mark.slow
def test_spark_master_option_runs_the_same_job(tmp_path: Path, spark_engine) -> None:
    from spark_reports import spark_session

    _attributed().write(tmp_path, jsonl=False)
    got = spark_engine(tmp_path, {}, spark_master="local[1]")
    assert spark_session("local[1]").sparkContext.master == "local[1]"
    got["engine"] = "python"
    assert got == check_python(tmp_path, {})
