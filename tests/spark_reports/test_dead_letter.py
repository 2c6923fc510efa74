"""Dead-lettering (``workload.dead_letter``): a confirmed message must be consumed from its queue or
from the queue's dead-letter queue; one consumed from the dead-letter queue counts as consumed (and
as ``dead_lettered``), one in neither is lost. Both engines, on planted histories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.spec import dead_letter_queue
from spark_reports import check_python
from spark_reports.synth import HistoryBuilder

DLQ = dead_letter_queue("q")
EXPIRED = {"dead_letter": {"reason": "expired", "queue": "q"}}
EXPECTED = {"workload": {"dead_letter": True}}  # the scenario asks for dead-lettering


def _dead_lettered(b: HistoryBuilder, mid: str, *, ack: str = "ok") -> None:
    """A delivery from the dead-letter queue as the AMQP consumer records it (its ``x-death``)."""
    b.op("c3", "invoke", "consume", None, queue=DLQ)
    b.op("c3", "ok", "consume", mid, queue=DLQ, redelivered=False, detail=EXPIRED)
    b.ack(mid, ack, consumer="c3", queue=DLQ)


def history(run_dir: Path, *, lose: bool) -> Path:
    b = HistoryBuilder()
    b.fault("f1", "kill")
    for i in range(1, 5):
        b.publish(f"p1:{i}")
    b.consume("p1:1")
    _dead_lettered(b, "p1:2")  # expired in q, consumed from q.dead: consumed
    _dead_lettered(b, "p1:3", ack="info")  # its ack's outcome unknown: not consumed, not lost
    if not lose:
        b.consume("p1:4")
    b.heal("f1")
    b.drain(drainer="d1", queue="q")
    b.drain(drainer="d2", queue=DLQ)
    return b.write(run_dir, jsonl=False)


def test_a_message_consumed_from_the_dead_letter_queue_is_consumed(tmp_path: Path) -> None:
    r = check_python(history(tmp_path, lose=False), EXPECTED)
    assert (r["verdict"], r["lost"]) == ("durable", [])
    c = r["counts"]
    assert (c["confirmed"], c["consumed_unique"], c["dead_lettered"], c["ack_unknown"]) == (4, 3, 1, 1)


def test_a_confirmed_message_in_neither_queue_is_lost(tmp_path: Path) -> None:
    r = check_python(history(tmp_path, lose=True), EXPECTED)
    assert (r["verdict"], r["lost"], r["counts"]["lost"], r["counts"]["dead_lettered"]) == (
        "LOST",
        ["p1:4"],
        1,
        1,
    )


def test_the_dead_letter_queue_drained_last_decides_lost_or_unreachable(tmp_path: Path) -> None:
    """The dead-letter queue's drain is a drain like any: unfinished, what is missing is unreachable."""
    b = HistoryBuilder()
    b.publish("p1:1")
    b.drain(drainer="d1", queue="q")
    b.drain(drainer="d2", queue=DLQ, outcome="info")
    r = check_python(b.write(tmp_path, jsonl=False), {})
    assert (r["counts"]["lost"], r["counts"]["unreachable"], r["verdict"]) == (0, 1, "unknown")


def _broker_dead_lettered(run_dir: Path) -> Path:
    """ActiveMQ's own dead-lettering: a message moved to ``ActiveMQ.DLQ`` (a poison ack, a duplicate),
    read there by the drain and recorded under the dead-letter name of the queue it died in, with
    the broker's reason (``plugins.activemq.client``)."""
    b = HistoryBuilder()
    b.publish("p1:1")
    b.publish("p1:2")
    b.consume("p1:1")
    b.drain(drainer="d1", queue="q")
    b.drain_invoke(drainer="d2", queue="ActiveMQ.DLQ")
    why = {"dead_letter": {"reason": "duplicate from store", "queue": "ActiveMQ.DLQ"}}
    b.op("d2", "invoke", "consume", None, queue=DLQ)
    b.op("d2", "ok", "consume", "p1:2", queue=DLQ, redelivered=False, detail=why)
    b.ack("p1:2", consumer="d2", queue=DLQ)
    b.drain_done(drainer="d2", queue="ActiveMQ.DLQ", consumed=1)
    return b.write(run_dir, jsonl=False)


def test_a_broker_dead_lettering_nobody_asked_for_fails_the_run(tmp_path: Path) -> None:
    r = check_python(_broker_dead_lettered(tmp_path), {})
    assert (r["valid"], r["verdict"], r["counts"]["dead_lettered"], r["counts"]["lost"]) == (
        False,
        "DEAD_LETTERED",
        1,
        0,
    )
    assert r["reason"].startswith("1 messages consumed from a dead-letter queue")


def test_dead_lettering_the_scenario_asks_for_is_durable(tmp_path: Path) -> None:
    r = check_python(_broker_dead_lettered(tmp_path), EXPECTED)
    assert (r["verdict"], r["counts"]["dead_lettered"]) == ("durable", 1)


@pytest.mark.spark
@pytest.mark.parametrize("lose", [False, True])
def test_spark_agrees(tmp_path: Path, spark_engine: Any, lose: bool) -> None:
    run = history(tmp_path, lose=lose)
    expected = dict(check_python(run, {}))
    got = dict(spark_engine(run, {}))
    assert (got.pop("engine"), expected.pop("engine")) == ("spark", "python")
    assert got["counts"]["dead_lettered"] == 1
    assert got == expected
