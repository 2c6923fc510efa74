"""Stuck deliveries on the reference broker (issue 31): with planted bug 14 a closed channel's
unacked deliveries are neither requeued nor dropped, so the queue keeps them unacked for consumers
that no longer exist. The run ends LOST with them classified stuck (node, queue, count reported,
since when), not "unknown"; the unmodified broker on the same scenario stays durable
(tests/e2e/test_detection.py's control)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.detection import SOURCE_ENV, apply_patch, load_catalogue
from harness.spec.results import STUCK_CAUSE

pytestmark = [pytest.mark.docker, pytest.mark.slow]

BUG = next(b for b in load_catalogue() if b.name == "closed-channel-keeps-unacked")


def test_deliveries_held_for_no_consumer_are_stuck_and_lost(
    chaos_run: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(SOURCE_ENV, str(apply_patch(BUG, tmp_path)))
    # A shorter drain: the deliveries are held for good, waiting longer shows nothing more.
    result = chaos_run(str(BUG.scenario), workload={"drain_timeout": 40})
    res = result.results
    assert (res["verdict"], res["valid"]) == ("LOST", False), result.loss_table()
    c = res["counts"]
    assert c["stuck"] > 0 and c["lost"] == 0, c
    assert STUCK_CAUSE in res["reason"]
    assert res["stuck"] and all(q["node"] == "n1" and q["unacked"] > 0 for q in res["stuck"]), res["stuck"]
    assert all(q["since_ns"] <= q["last_ns"] for q in res["stuck"])
    # the reference plugin lists what holds them: no consumer on the queue, no client connection
    holders = res["stuck"][0]["holders"]
    assert holders is not None and holders[0]["consumers"] == 0, holders
    assert {d["cause"] for d in res["stuck_detail"]} == {STUCK_CAUSE}
    assert not res["drain"]["completed"]
    depth = [r for r in result.history() if r["f"] == "depth" and r["type"] == "ok"]
    assert depth, "the drain records each look at a node's depth"
    page = (result.run_dir / "report.html").read_text()
    assert "Stuck deliveries" in page
