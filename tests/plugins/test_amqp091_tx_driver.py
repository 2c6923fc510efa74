"""Transactional producers and consumers (``workload.transactions``) against the reference broker in this process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.scenario import TransactionsSection
from harness.workload import run_workload
from spark_reports.engines.atomicity import check_rows
from tests.plugins.test_amqp091_driver import (
    QUEUE,
    SEED,
    Node,
    consume_until,
    driver,
    history,
    publish,
    workload,
)

TX = TransactionsSection(publish_batch=4, ack_batch=3, rollback=0.3)


@pytest.fixture
def n1(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path, "n1").start()
    yield node
    node.stop()


def _detail(r: dict[str, Any]) -> dict[str, Any]:
    return json.loads(r["detail"]) if r["detail"] else {}


def test_transactions_record_their_ids_and_outcomes_and_hold_atomicity(tmp_path: Path, n1: Node) -> None:

    async def go() -> None:
        d, rec = driver(tmp_path, [n1], workload(transactions=TX, duration=2.0, rate=400))
        await run_workload(d, d.w, ["n1"], SEED, rec)
        rec.close()

    asyncio.run(go())
    records = history(tmp_path)
    publishes = {r["value"]: r["type"] for r in records if r["f"] == "publish" and r["type"] != "invoke"}
    delivered = {r["value"] for r in records if r["f"] == "consume" and r["type"] == "ok"}
    ends = [r for r in records if r["f"] in ("commit", "rollback") and r["type"] != "invoke"]
    invokes = {
        (r["process"], r["value"]): r
        for r in records
        if r["f"] in ("commit", "rollback") and r["type"] == "invoke"
    }
    kinds = {(r["f"], next(iter(_detail(invokes[(r["process"], r["value"])])))) for r in ends}
    assert kinds == {("commit", "publish"), ("rollback", "publish"), ("commit", "ack"), ("rollback", "ack")}
    for r in ends:
        inv = invokes[(r["process"], r["value"])]
        ids = _detail(inv).get("publish")
        if ids is None:
            continue
        assert len(ids) == TX.publish_batch
        if r["f"] == "commit":
            assert r["type"] == "ok" and all(publishes[i] == "ok" for i in ids) and set(ids) <= delivered
        else:
            assert all(publishes[i] == "fail" for i in ids) and not set(ids) & delivered
    result = check_rows(records)
    assert result["valid"] is True, result
    assert result["counts"]["committed"] > 0 and result["counts"]["rolled_back"] > 0


def test_a_rolled_back_ack_leaves_the_delivery_to_ack_again(tmp_path: Path, n1: Node) -> None:

    async def go() -> None:
        await publish(n1, [f"p1:{i}" for i in range(1, 31)])
        d, rec = driver(tmp_path, [n1], workload(transactions=TransactionsSection(ack_batch=5, rollback=0.5)))
        await consume_until(d, rec, 30, "30 acks committed")

    asyncio.run(go())
    records = history(tmp_path)
    failed = [r["value"] for r in records if r["f"] == "ack" and r["type"] == "fail"]
    assert failed, "no ack transaction was rolled back"
    acked = [r["value"] for r in records if r["f"] == "ack" and r["type"] == "ok"]
    assert sorted(acked) == sorted(f"p1:{i}" for i in range(1, 31))  # each exactly once, rolled back ones too
    assert n1.depth(QUEUE) == (0, 0)
    assert check_rows(records)["valid"] is True
