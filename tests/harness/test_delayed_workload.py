"""``workload.delay``: the scenario option, the seeded choice of delays, and the AMQP driver's delayed publishes
against the reference broker in this process, checked by the ``delay`` checker."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import scenario as S
from harness.errors import ScenarioError
from harness.spec import Delays, DelaySection
from spark_reports.engines.delay import check_rows
from tests.plugins.test_amqp091_driver import (
    Node,
    driver,
    history,
    publish_and_consume_all,
    workload,
)

MINIMAL = {"broker": {"plugin": "reference"}}


def _with_delay(value: Any) -> dict[str, Any]:
    return {**MINIMAL, "workload": {"delay": value}}


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (0.3, "workload.delay: expected a mapping, got float"),
        ({"share": 1.5}, "workload.delay.share: 1.5 is out of range; allowed from 0 to 1"),
        ({"share": "often"}, "workload.delay.share: expected a number"),
        ({"min_ms": 0}, "workload.delay.min_ms: 0 is out of range; allowed from 1 to 4294967295"),
        ({"max_ms": 2**32}, "workload.delay.max_ms: 4294967296 is out of range"),
        ({"min_ms": 2.5}, "workload.delay.min_ms: expected an integer"),
        (
            {"min_ms": 500, "max_ms": 100},
            "workload.delay.min_ms: 500 is greater than workload.delay.max_ms (100)",
        ),
        ({"late_ms": -1}, "workload.delay.late_ms: -1 is out of range; allowed >= 0"),
        ({"delay": 5}, "workload.delay.delay: unknown field; allowed: late_ms, max_ms, min_ms, share"),
    ],
)
def test_a_bad_delay_is_one_line_naming_the_field(value: Any, needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        S.from_dict(_with_delay(value), source="s.yaml")
    assert str(e.value).startswith("s.yaml: ") and needle in str(e.value) and "\n" not in str(e.value)


def test_delay_is_off_by_default_and_round_trips() -> None:
    assert S.from_dict(MINIMAL).workload.delay is None
    assert S.from_dict(json.loads(json.dumps(S.from_dict(MINIMAL).to_dict()))).workload.delay is None
    sc = S.from_dict(_with_delay({"share": 0.5, "min_ms": 10, "max_ms": 20}))
    assert sc.workload.delay == DelaySection(share=0.5, min_ms=10, max_ms=20, late_ms=5000)
    assert S.from_dict(json.loads(json.dumps(sc.to_dict()))) == sc


def test_delays_are_seeded_per_producer_and_within_bounds() -> None:
    section = DelaySection(share=0.4, min_ms=100, max_ms=200)
    draws = Delays(section, 7, "p1")
    seq = [draws.next() for _ in range(500)]
    again = Delays(section, 7, "p1")
    assert [again.next() for _ in range(500)] == seq
    other = Delays(section, 7, "p2")
    assert [other.next() for _ in range(500)] != seq
    delayed = [d for d in seq if d is not None]
    assert all(100 <= d <= 200 for d in delayed) and 0 < len(delayed) < 500
    assert {Delays(None, 7, "p1").next() for _ in range(50)} == {None}
    assert {Delays(dataclasses.replace(section, share=0.0), 7, "p1").next() for _ in range(50)} == {None}


@pytest.fixture
def n1(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path, "n1").start()
    yield node
    node.stop()


def test_the_driver_publishes_delayed_messages_that_arrive_never_early(tmp_path: Path, n1: Node) -> None:
    w = workload(rate=100, delay=DelaySection(share=0.5, min_ms=50, max_ms=600))

    async def go() -> None:
        d, rec = driver(tmp_path, [n1], w)
        await publish_and_consume_all(d, rec, 40, "every confirmed message acked")

    asyncio.run(go())
    records = history(tmp_path)
    delayed = [r for r in records if r["f"] == "publish" and r["type"] == "invoke" and r["detail"]]
    assert delayed and all(50 <= json.loads(r["detail"])["delay_ms"] <= 600 for r in delayed)
    res = check_rows(records)
    assert res["valid"] is True and res["counts"]["early"] == 0
    assert res["counts"]["delayed_delivered"] == res["counts"]["delayed_confirmed"] > 0


def test_the_nats_driver_refuses_a_delay_it_cannot_give() -> None:
    from plugins.nats.client import NatsDriver

    with pytest.raises(ScenarioError, match="workload.delay: NATS JetStream has no delayed-message exchange"):
        NatsDriver({}, None, workload=S.WorkloadSection(delay=DelaySection()))  # type: ignore[arg-type]
