"""Liveness from hand-written histories: a queue that recovers late (in the final drain), one that
never recovers, one that recovers and goes down again, a budget overrun, and what is not an
outage (a heal just before the producers stop, an idle queue after a completed drain)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from spark_reports import check_python
from spark_reports.synth import HistoryBuilder

S = 1_000_000_000
STEP = 100_000_000  # 0.1 s per record


def _workload(b: HistoryBuilder, n: int, *, ok: bool = True, consume: bool = True, start: int = 0) -> None:
    for i in range(start, start + n):
        b.publish(f"p1:{i}", "ok" if ok else "info", node="n1")
        if consume and ok:
            b.consume(f"p1:{i}", node="n2", consumer="c1")


def _after_heal(r: Mapping[str, Any]) -> dict[str, Any]:
    [rec] = r["liveness"]["recovery"]
    return rec


def test_a_queue_that_comes_back_in_the_final_drain_recovered_late_with_its_time(tmp_path: Path) -> None:
    b = HistoryBuilder(step_ns=STEP)
    _workload(b, 20)
    b.fault("f1", "partition", node="n1")
    _workload(b, 30, ok=False)  # nothing confirmed during the fault ...
    b.heal("f1")
    heal = b.t - STEP  # recovery counts from the heal's invoke, the record before its ok
    _workload(b, 60, ok=False, start=100)  # ... nor for 12 s after it
    _workload(b, 10, consume=False, start=200)  # then publishes are confirmed again, nobody consumes
    b.drain_invoke()
    for i in range(200, 210):  # the drain gets them: the queue came back late
        b.consume(f"p1:{i}", consumer="d1", node="n3")
    b.drain_done(consumed=10, nodes={"n3": {"consumed": 10, "ready": 0, "unacked": 0}})
    r = check_python(b.write(tmp_path), {})
    rec = _after_heal(r)
    assert rec["recovered"] and rec["publish_demand"]
    first_publish_ok = next(
        x["time_ns"] for x in b.rows if x["f"] == "publish" and x["type"] == "ok" and x["time_ns"] > heal
    )
    first_drain_ack = next(
        x["time_ns"] for x in b.rows if x["f"] == "ack" and x["type"] == "ok" and x["process"] == "d1"
    )
    assert rec["publish_ok_ns"] == first_publish_ok - heal
    assert rec["consume_ok_ns"] == rec["recovery_ns"] == first_drain_ack - heal
    assert rec["recovery_ns"] > 12 * S
    assert {n["node"]: n["consume_ok_ns"] for n in rec["nodes"]} == {
        "n1": None,
        "n2": None,
        "n3": first_drain_ack - heal,
    }
    assert r["verdict"] == "durable" and r["liveness"]["unavailable"] == []
    assert any(w["kind"] == "consume" and w["ended_by_ok"] for w in r["liveness"]["windows"])


def test_a_queue_that_never_recovers_is_unavailable_and_its_messages_unreachable(tmp_path: Path) -> None:
    b = HistoryBuilder(step_ns=STEP)
    _workload(b, 20)
    _workload(b, 5, consume=False, start=50)  # confirmed, not yet consumed
    b.fault("f1", "partition", node="n1")
    b.heal("f1")
    _workload(b, 100, ok=False, start=100)
    down = {"consumed": 0, "ready": None, "unacked": None, "error": "queue depth: timed out"}
    b.drain(outcome="info", nodes={"n1": down, "n2": down, "n3": down})
    r = check_python(b.write(tmp_path), {})
    assert (r["verdict"], r["valid"]) == ("UNAVAILABLE", False)
    assert (r["counts"]["lost"], r["counts"]["unreachable"]) == (0, 5)
    [u] = r["liveness"]["unavailable"]
    assert (u["queue"], u["kinds"], u["fault_id"]) == ("q", ["publish", "consume"], "f1")
    assert u["nodes"] == dict.fromkeys(("n1", "n2", "n3"), "queue depth: timed out")
    assert r["reason"].startswith("queue q never recovered: no publish or consume ok since")
    assert r["reason"].endswith("; 5 confirmed messages unreachable behind it")
    assert not _after_heal(r)["recovered"]


def test_a_queue_that_recovers_then_goes_down_for_good_is_unavailable(tmp_path: Path) -> None:
    b = HistoryBuilder(step_ns=STEP)
    _workload(b, 10)
    b.fault("f1", "partition", node="n1")
    b.heal("f1")
    _workload(b, 10)  # back at once ...
    _workload(b, 100, ok=False, start=100)  # ... then down, with no fault, to the end
    b.drain(outcome="info", nodes={"n1": {"error": "connect: refused"}})
    r = check_python(b.write(tmp_path), {})
    assert _after_heal(r)["recovered"]
    assert r["verdict"] == "UNAVAILABLE"
    [u] = r["liveness"]["unavailable"]
    assert u["fault_id"] == "f1" and set(u["kinds"]) == {"publish", "consume"}


def test_a_recovery_over_its_budget_is_unavailable_and_safety_verdicts_win(tmp_path: Path) -> None:
    b = HistoryBuilder(step_ns=STEP)
    _workload(b, 10)
    b.fault("f1", "kill", node="n1")
    b.heal("f1")
    _workload(b, 20, ok=False, start=100)  # 4 s without a confirm after the heal
    _workload(b, 10, start=200)
    b.drain()
    run = b.write(tmp_path)
    r = check_python(run, {"budgets": {"recovery_s": {"kill": 3, "partition": 60}}})
    rec = _after_heal(r)
    assert rec["recovered"] and rec["budget_s"] == 3 and rec["over_budget"]
    assert r["verdict"] == "UNAVAILABLE" and r["liveness"]["over_budget"] == ["f1 q"]
    assert "over the recovery budget of 3s" in r["reason"]
    assert check_python(run, {"budgets": {"recovery_s": 5}})["verdict"] == "durable"
    assert check_python(run, {"budgets": {"recovery_s": {"partition": 1}}})["verdict"] == "durable"

    b.publish("p9:1")  # confirmed, never consumed, after a completed drain: lost
    b.drain()
    r = check_python(b.write(tmp_path / "lost"), {"budgets": {"recovery_s": 3}})
    assert r["verdict"] == "LOST" and "; also unavailable: queue q recovered" in r["reason"]


def test_a_heal_as_producers_stop_and_an_idle_drained_queue_are_not_outages(tmp_path: Path) -> None:
    b = HistoryBuilder(step_ns=STEP)
    _workload(b, 30)
    b.fault("f1", "partition", node="n1")
    _workload(b, 10)
    b.heal("f1")
    b.publish("p1:999", "info")  # the last publish, in flight as the producers stop
    b.t += 20 * S  # 20 s of settling with nothing to do
    b.drain()
    r = check_python(b.write(tmp_path), {"budgets": {"recovery_s": 1}})
    rec = _after_heal(r)
    assert not rec["publish_demand"] and rec["recovered"]
    assert r["verdict"] == "durable" and r["liveness"]["windows"] == []


def test_producers_that_stop_before_the_queue_answers_again_are_no_outage(tmp_path: Path) -> None:
    """A restarted master still booting when the workload ends: every publish after the heal
    refused, then the drain consumes everything. The queue came back; nobody published once it
    had, so publish is not seen failing on a live queue (the windows still show the refusals)."""
    b = HistoryBuilder(step_ns=STEP)
    _workload(b, 20, consume=False)
    b.fault("f1", "kill", node="n1")
    _workload(b, 30, ok=False, start=100)
    b.heal("f1")
    _workload(b, 60, ok=False, start=200)  # 6 s of refused publishes after the heal began
    b.t += 20 * S  # the workload is over; the node finishes booting
    b.drain_invoke()
    for i in range(20):
        b.consume(f"p1:{i}", consumer="d1", node="n2")
    b.drain_done(consumed=20, nodes={"n2": {"consumed": 20, "ready": 0, "unacked": 0}})
    r = check_python(b.write(tmp_path), {})
    rec = _after_heal(r)
    assert rec["publish_demand"] and rec["publish_ok_ns"] is None and rec["consume_ok_ns"] is not None
    assert (r["verdict"], r["liveness"]["unavailable"]) == ("durable", [])
    assert any(w["kind"] == "publish" and not w["ended_by_ok"] for w in r["liveness"]["windows"])
    assert r["counts"]["confirmed"] == r["counts"]["consumed_unique"] == 20


def test_producers_that_stop_before_a_cold_start_ends_then_an_empty_drain_are_no_outage(
    tmp_path: Path,
) -> None:
    """The same with nothing left to read: every confirmed message consumed before a power cut of
    every node, publishes refused while the nodes cold-start, the workload over before they are
    back. The drain then finds every node answering with an empty queue: the queue came back,
    and a completed drain is its answer even when it reads nothing."""
    b = HistoryBuilder(step_ns=STEP)
    _workload(b, 20)
    b.fault("f1", "power-loss-coordinated", node=None)
    b.heal("f1")
    _workload(b, 60, ok=False, start=200)  # 6 s of refused publishes while the nodes boot
    b.t += 20 * S  # the workload is over; the nodes finish booting
    empty = {"consumed": 0, "ready": None, "unacked": None, "error": None}
    b.drain(nodes={"n1": empty, "n2": empty, "n3": empty})
    r = check_python(b.write(tmp_path), {})
    rec = _after_heal(r)
    assert rec["publish_demand"] and rec["publish_ok_ns"] is None
    assert (r["verdict"], r["liveness"]["unavailable"]) == ("durable", [])
    assert any(w["kind"] == "publish" and not w["ended_by_ok"] for w in r["liveness"]["windows"])

    b = HistoryBuilder(step_ns=STEP)  # the drain that did not complete proves nothing
    _workload(b, 20)
    b.fault("f1", "power-loss-coordinated", node=None)
    b.heal("f1")
    _workload(b, 60, ok=False, start=200)
    b.t += 20 * S
    down = {"consumed": 0, "ready": None, "unacked": None, "error": "connect: refused"}
    b.drain(outcome="info", nodes={"n1": down, "n2": down, "n3": down})
    assert check_python(b.write(tmp_path / "down"), {})["verdict"] == "UNAVAILABLE"


GONE = "the cluster holds no such stream"


def test_a_stall_after_the_recovery_that_the_drain_ends_is_no_outage_to_the_end(tmp_path: Path) -> None:
    """A queue that came back after the heal, then stalled for good while the workload ran (NATS
    2.9.10's minority-paused seed 2: the consumer lost quorum, every publish refused to the
    end) and answered the drain afterwards. Its last delivery came a moment after its last
    confirmed publish: that moment is no consume "served while publish failed", so the queue
    was down whole, and the completed drain is its answer: no queue that never came back."""
    b = HistoryBuilder(step_ns=STEP)
    _workload(b, 20)
    b.fault("f1", "pause", node="n1")
    b.heal("f1")
    _workload(b, 20, start=20)  # back after the heal: recovered
    _workload(b, 60, ok=False, start=100)  # then 6 s and more of refused publishes, nothing read
    b.t += 20 * S
    empty = {"consumed": 0, "ready": None, "unacked": None, "error": None}
    b.drain(nodes={"n1": empty, "n2": empty, "n3": empty})
    r = check_python(b.write(tmp_path), {})
    assert _after_heal(r)["recovered"]
    assert (r["verdict"], r["liveness"]["unavailable"]) == ("durable", [])
    assert {w["kind"] for w in r["liveness"]["windows"] if not w["ended_by_ok"]} == {"publish", "consume"}


def _bracketed(b: HistoryBuilder, late_s: float) -> None:
    """The last confirmed publish at 12.4 s, then publishes refused to 18.8 s (the workload's last
    op); beside them one delivery at 17.2 s and, ``late_s`` after the last refusal, another; then a
    drain that completed (every node empty)."""
    _workload(b, 20)
    b.publish("p1:50", "ok", node="n1")
    b.publish("p1:51", "ok", node="n1")
    for i in range(22):
        b.publish(f"p1:{100 + i}", "info", node="n1")
    b.consume("p1:50", node="n2", consumer="c1")
    for i in range(8):
        b.publish(f"p1:{200 + i}", "info", node="n1")
    b.t += int(late_s * S) - STEP
    b.consume("p1:51", node="n2", consumer="c1")
    empty = {"consumed": 0, "ready": 0, "unacked": 0, "error": None}
    b.drain(nodes={"n1": empty, "n2": empty, "n3": empty})


@pytest.mark.parametrize("late_s", [0.9, 6.0])
def test_deliveries_either_side_of_the_quiet_stretch_serve_nothing_in_it(
    tmp_path: Path, late_s: float
) -> None:
    """Publish fails from 12.4 s to 18.8 s; consume answered at 17.2 s, within the outage threshold
    of the window's start, and next only after 18.8 s. Nothing was served from 17.4 s to 18.8 s,
    so the whole queue was quiet there, and the completed drain (and the later delivery) answer
    it: no queue that never came back, whether the later delivery is 0.9 s after the last refusal
    (the two deliveries less than the threshold apart) or 6 s (a gap longer than it)."""
    b = HistoryBuilder(step_ns=STEP)
    _bracketed(b, late_s)
    r = check_python(b.write(tmp_path), {})
    assert (r["verdict"], r["liveness"]["unavailable"]) == ("durable", [])
    publish = [w for w in r["liveness"]["windows"] if w["kind"] == "publish"]
    assert [(w["start_ns"], w["end_ns"], w["ended_by_ok"]) for w in publish] == [
        (int(12.4 * S), int(18.8 * S), False)
    ]


@pytest.mark.spark
@pytest.mark.parametrize("served", [False, True])
def test_spark_agrees_on_deliveries_either_side_of_a_quiet_stretch(
    tmp_path: Path, spark_engine: Any, served: bool
) -> None:
    """Both ways the last consume at or before the last publish record decides: none in the quiet
    stretch (no outage), and deliveries beside every refused publish (publish never came back)."""
    b = HistoryBuilder(step_ns=STEP)
    if served:
        _refused_beside_deliveries(b)
    else:
        _bracketed(b, 0.9)
    run = b.write(tmp_path)
    expected = dict(check_python(run, {}))
    got = dict(spark_engine(run, {}))
    assert (got.pop("engine"), expected.pop("engine")) == ("spark", "python")
    assert [u["kinds"] for u in got["liveness"]["unavailable"]] == ([["publish"]] if served else [])
    assert got == expected


def _gone_stream(gone: dict[str, str] | None) -> HistoryBuilder:
    """Confirmed messages never consumed, a power cut of every node, publishes refused after the
    heal, then a drain whose every node answered ``gone`` (or, with None, reported empty)."""
    b = HistoryBuilder(step_ns=STEP)
    _workload(b, 20)
    _workload(b, 5, consume=False, start=50)  # confirmed, never consumed
    b.fault("f1", "power-loss-coordinated", node=None)
    b.heal("f1")
    _workload(b, 60, ok=False, start=200)  # 6 s of refused publishes after the heal
    b.t += 20 * S
    empty = {"consumed": 0, "ready": 0, "unacked": 0, "error": None}
    b.drain(nodes=dict.fromkeys(("n1", "n2", "n3"), empty), gone=gone)
    return b


def test_a_drain_that_ends_because_the_queue_does_not_exist_loses_and_is_no_recovery(tmp_path: Path) -> None:
    """A power cut of every node took the stream whole, and the drain ends because every node
    answers that the queue does not exist (``gone`` in its value). The drain is complete, so
    the confirmed messages nobody consumed are lost (LOST), and it is no answer of the queue's,
    so the queue never came back (UNAVAILABLE beside it). The same drain without ``gone`` (every
    node reported the queue empty) is the queue answering: LOST, and no outage."""
    said = GONE
    r = check_python(_gone_stream(dict.fromkeys(("n1", "n2", "n3"), said)).write(tmp_path), {})
    assert (r["verdict"], r["valid"]) == ("LOST", False)
    assert (r["counts"]["lost"], r["counts"]["unreachable"]) == (5, 0)
    assert r["drain"]["completed"] and r["drain"]["ops"][0]["gone"] == dict.fromkeys(("n1", "n2", "n3"), said)
    assert not _after_heal(r)["recovered"] and _after_heal(r)["consume_ok_ns"] is None
    [u] = r["liveness"]["unavailable"]
    assert (u["queue"], u["fault_id"]) == ("q", "f1")
    assert u["nodes"] == dict.fromkeys(("n1", "n2", "n3"), f"the queue does not exist ({said})")
    assert "; also unavailable: queue q never recovered" in r["reason"]

    r = check_python(_gone_stream(None).write(tmp_path / "empty"), {})
    assert (r["verdict"], r["counts"]["lost"]) == ("LOST", 5)
    assert _after_heal(r)["consume_ok_ns"] is not None  # the drain's end, as the queue's answer
    assert r["liveness"]["unavailable"] == [] and "also unavailable" not in r["reason"]


@pytest.mark.spark
def test_spark_agrees_on_a_drain_that_ends_with_the_queue_gone(tmp_path: Path, spark_engine: Any) -> None:
    run = _gone_stream(dict.fromkeys(("n1", "n2", "n3"), GONE)).write(tmp_path)
    expected = dict(check_python(run, {}))
    got = dict(spark_engine(run, {}))
    assert (got.pop("engine"), expected.pop("engine")) == ("spark", "python")
    assert (got["verdict"], got["counts"]["lost"], len(got["liveness"]["unavailable"])) == ("LOST", 5, 1)
    assert got == expected


def test_publishes_refused_to_the_end_while_consumers_are_served_are_an_outage(tmp_path: Path) -> None:
    """The converse: consumers served after the heal while every publish is refused until the
    producers stop, and nothing answers the queue after that: publish never came back."""
    b = HistoryBuilder(step_ns=STEP)
    _refused_beside_deliveries(b)
    r = check_python(b.write(tmp_path), {})
    assert r["verdict"] == "UNAVAILABLE"
    [u] = r["liveness"]["unavailable"]
    assert u["kinds"] == ["publish"]


def _refused_beside_deliveries(b: HistoryBuilder) -> None:
    """A backlog published, a heal, then every publish refused beside a delivery of the backlog
    (the last delivery after the last refusal), then a drain."""
    _workload(b, 60, consume=False)
    b.fault("f1", "partition", node="n1")
    b.heal("f1")
    for i in range(60):  # each refused publish beside a delivery of the backlog
        b.publish(f"p1:{100 + i}", "info", node="n1")
        b.consume(f"p1:{i}", node="n2", consumer="c1")
    b.drain()


def _backlog(b: HistoryBuilder) -> None:
    """Publishes through two faults, nothing consumed until the drain, 10 s of settle before it."""
    _workload(b, 40, consume=False)
    b.fault("f1", "power-loss", node="n1")
    b.heal("f1")
    _workload(b, 40, consume=False, start=100)
    b.fault("f2", "power-loss", node="n1")
    b.heal("f2")
    _workload(b, 40, consume=False, start=200)
    b.t += 10 * S  # settle
    b.drain_invoke()
    for i in [*range(40), *range(100, 140), *range(200, 240)]:
        b.consume(f"p1:{i}", consumer="d1", node="n1")
    b.drain_done(consumed=120, nodes={"n1": {"consumed": 120, "ready": 0, "unacked": 0}})


def test_a_backlog_scenario_without_consumers_asks_no_consume_and_shows_no_window(tmp_path: Path) -> None:
    """``consumers: 0`` (power-loss.yaml): nobody was asked to consume while the workload ran, so no
    consume outage "during f1, f2" and no availability below 100 %."""
    b = HistoryBuilder(step_ns=STEP)
    _backlog(b)
    r = check_python(b.write(tmp_path), {"workload": {"consumers": 0}})
    live = r["liveness"]
    assert [w for w in live["windows"] if w["kind"] == "consume"] == []
    assert all(not rec["consume_demand"] for rec in live["recovery"])
    assert {q["kind"] for q in live["queues"]} == {"publish"} and live["available_share"] == 1.0
    assert r["verdict"] == "durable"
    # The same history with consumers that consumed nothing is an outage, as before.
    with_consumers = check_python(b.write(tmp_path / "c"), {"workload": {"consumers": 1}})
    assert any(w["kind"] == "consume" for w in with_consumers["liveness"]["windows"])


def test_the_settle_before_the_drain_is_no_consume_outage(tmp_path: Path) -> None:
    """Consumers served to the workload's end, 10 s of settle, then the drain finds what a
    restarted node held: the wait from the workload's end to the drain is nobody's outage."""
    b = HistoryBuilder(step_ns=STEP)
    _workload(b, 40)
    b.fault("f1", "kill", node="n3")
    _workload(b, 10, consume=False, start=100)  # published to n3, forwarded nowhere
    b.heal("f1")
    _workload(b, 40, start=200)
    end = b.t
    b.t += 10 * S  # settle: the nemesis healed, consumers idle
    b.drain_invoke()
    for i in range(100, 110):
        b.consume(f"p1:{i}", consumer="d1", node="n3")
    b.drain_done(consumed=10, nodes={"n3": {"consumed": 10, "ready": 0, "unacked": 0}})
    r = check_python(b.write(tmp_path), {"workload": {"consumers": 1}})
    late = [w for w in r["liveness"]["windows"] if w["kind"] == "consume" and w["end_ns"] > end]
    assert late == [], late
    assert r["verdict"] == "durable"
