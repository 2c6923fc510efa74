"""The atomicity checks on literal histories: one per anomaly, clean ones, and both engines agreeing."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from spark_reports.engines.atomicity import (
    ANOMALIES,
    check_atomicity_python,
    check_atomicity_spark,
    check_rows,
)
from spark_reports.engines.plugin import brokerchaos_register_checkers
from tests.spark_reports.rows import Rows


class H(Rows):
    """A history written by hand, as the transactional driver writes it."""

    def __init__(self) -> None:
        super().__init__()
        self._tx = 0

    def tx(self, process: str, kind: str, ids: list[str], outcome: str | None = "ok", f: str = "commit") -> H:
        """One transaction's end: its commit or rollback op covering ``ids`` (None: never completed)."""
        self._tx += 1
        value = f"{process}:tx{self._tx}"
        self._row(process, "invoke", f, value, {kind: ids})
        if outcome is not None:
            self._row(process, outcome, f, value)
        return self

    def deliver(self, *ids: str, process: str = "c1") -> H:
        for mid in ids:
            self._row(process, "invoke", "consume")
            self._row(process, "ok", "consume", mid)
        return self

    def drain(self, ok: bool = True) -> H:
        self._row("d1", "invoke", "drain")
        self._row("d1", "ok" if ok else "info", "drain", {"consumed": 0})
        return self


def _anomalies(h: H) -> dict[str, int]:
    return {k: v for k, v in check_rows(h.rows)["counts"].items() if k in ANOMALIES and v}


def test_whole_transactions_are_valid() -> None:
    h = (
        H()
        .tx("p1", "publish", ["p1:1", "p1:2"])
        .deliver("p1:1", "p1:2")
        .tx("p1", "publish", ["p1:3", "p1:4"], f="rollback")
        .tx("p1", "publish", ["p1:5", "p1:6"], outcome="info")  # unknown, applied whole
        .tx("p1", "publish", ["p1:7", "p1:8"], outcome=None)  # unknown, not applied at all
        .deliver("p1:5", "p1:6")
        .tx("c1", "ack", ["p1:1", "p1:2"])
        .tx("c1", "ack", ["p1:5", "p1:6"], outcome="info")
        .deliver("p1:5", "p1:6", process="c2")
        .tx("c2", "ack", ["p1:5", "p1:6"])
        .drain()
    )
    res = check_rows(h.rows)
    assert (res["valid"], res["verdict"]) == (True, "durable"), res
    c = res["counts"]
    assert (c["transactions"], c["committed"], c["rolled_back"], c["unknown"]) == (7, 3, 1, 3)
    assert (c["publish_transactions"], c["ack_transactions"]) == (4, 3)


def test_committed_publishes_not_all_delivered() -> None:
    h = H().tx("p1", "publish", ["p1:1", "p1:2", "p1:3"]).deliver("p1:1").drain()
    res = check_rows(h.rows)
    assert res["verdict"] == "INTEGRITY"
    assert res["anomalies"]["incomplete_commits"][0]["ids"] == ["p1:2", "p1:3"]


def test_rolled_back_or_failed_commit_delivered() -> None:
    assert _anomalies(
        H().tx("p1", "publish", ["p1:1"], f="rollback", outcome="info").deliver("p1:1").drain()
    ) == {"rolled_back_delivered": 1}
    assert _anomalies(H().tx("p1", "publish", ["p1:1", "p1:2"], outcome="fail").deliver("p1:2").drain()) == {
        "rolled_back_delivered": 1
    }


def test_unknown_commit_half_applied() -> None:
    assert _anomalies(H().tx("p1", "publish", ["p1:1", "p1:2"], outcome="info").deliver("p1:1").drain()) == {
        "partial_transactions": 1
    }
    # acks: after the commit was sent one message came back, the other did not
    h = (
        H()
        .deliver("p1:1", "p1:2")
        .tx("c1", "ack", ["p1:1", "p1:2"], outcome=None)
        .deliver("p1:2", process="c2")
    )
    assert _anomalies(h.drain()) == {"partial_transactions": 1}


def test_committed_acks_undone() -> None:
    h = H().deliver("p1:1").tx("c1", "ack", ["p1:1"]).deliver("p1:1", process="c2").drain()
    assert _anomalies(h) == {"acks_undone": 1}


def test_an_unfinished_drain_leaves_delivery_questions_open() -> None:
    h = H().tx("p1", "publish", ["p1:1", "p1:2"]).deliver("p1:1").drain(ok=False)
    res = check_rows(h.rows)
    assert (res["valid"], res["verdict"]) == ("unknown", "unknown")
    assert res["counts"]["incomplete_commits"] == 0


def test_registered_as_a_checker_reading_a_stored_run(tmp_path: Path) -> None:
    added: dict[str, Any] = {}

    class Reg:
        def add_checker(self, name: str, fn: Any, default: bool = False) -> None:
            added[name] = fn

    brokerchaos_register_checkers(register=Reg())
    assert added["atomicity"] is check_atomicity_python and "atomicity-spark" in added
    run = H().tx("p1", "publish", ["p1:1"], f="rollback").deliver("p1:1").drain().write(tmp_path)
    assert added["atomicity"](run, {})["counts"]["rolled_back_delivered"] == 1


def random_history(rng: random.Random, p: int) -> H:
    h = H()
    for t in range(rng.randint(3, 8)):
        ids = [f"p{p}:{t}.{i}" for i in range(rng.randint(1, 4))]
        outcome = rng.choice(["ok", "ok", "info", "fail", None])
        kind = rng.choice(["publish", "ack"])
        if kind == "ack":
            h.deliver(*ids)
        h.tx(f"p{p}", kind, ids, outcome=outcome, f=rng.choice(["commit", "commit", "commit", "rollback"]))
        h.deliver(*[i for i in ids if rng.random() < 0.6], process=f"c{rng.randint(1, 2)}")
    return h


@pytest.mark.spark
def test_spark_and_python_agree(tmp_path: Path) -> None:
    """Every literal case above and seeded random histories in one history (one Spark job): one answer."""
    combined = H()
    cases = [
        H().tx("p1", "publish", ["p1:1", "p1:2", "p1:3"]).deliver("p1:1"),
        H().tx("p2", "publish", ["p2:1"], f="rollback").deliver("p2:1"),
        H().tx("p3", "publish", ["p3:1", "p3:2"], outcome="info").deliver("p3:1"),
        H().deliver("p4:1").tx("c4", "ack", ["p4:1"]).deliver("p4:1", process="c5"),
        H().tx("p5", "publish", [], outcome="ok"),
    ]
    cases += [random_history(random.Random(seed), 10 + seed) for seed in range(6)]
    for h in cases:
        for r in h.rows:
            combined.rows.append({**r, "index": len(combined.rows)})
    combined.drain()
    run = combined.write(tmp_path)
    py, sp = check_atomicity_python(run), check_atomicity_spark(run)
    assert {k: v for k, v in py.items() if k != "engine"} == {k: v for k, v in sp.items() if k != "engine"}
    assert py["valid"] is False and all(py["counts"][k] > 0 for k in ANOMALIES)
