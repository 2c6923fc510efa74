"""What a run shows of liveness outside the checkers: the terminal table, the node log lines
that name a queue that never came back, and an Allure step per fault step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.liveness import scrape_logs
from harness.verdicts import summary_table
from spark_reports import check_python
from spark_reports.synth import HistoryBuilder
from tests.harness.allure_user import allure_result


def never_back(tmp_path: Path) -> Path:
    """f1 heals and the queue recovers; f2 heals and it never does (the drain times out on every node)."""
    b = HistoryBuilder(step_ns=50_000_000)
    for i in range(1, 400):
        ok = i < 100 or 180 < i < 250
        b.publish(f"p1:{i}", "ok" if ok else "info", node="n1")
        if i < 100 or 180 < i < 230:
            b.consume(f"p1:{i}", node="n2")
        if i == 100:
            b.fault("f1", "partition", node="n1")
        if i == 170:
            b.heal("f1")
        if i == 240:
            b.fault("f2", "kill", node="n2")
        if i == 300:
            b.heal("f2")
    down = {"error": "queue depth: timed out"}
    b.drain(outcome="info", nodes={"n1": down, "n2": down})
    run = b.write(tmp_path / "run", jsonl=False)
    results = dict(check_python(run, {"budgets": {"recovery_s": {"partition": 60}}}))
    for node, text in (
        ("n1", "boot\nqueue 'q' in vhost '/': Stopping all nodes on master shutdown\n"),
        ("n2", "boot\n"),
    ):
        (run / "nodes" / node).mkdir(parents=True)
        (run / "nodes" / node / "broker.log").write_text(text)
    scrape_logs(run, results)
    (run / "results.json").write_text(json.dumps(results))
    return run


def test_the_terminal_names_the_queue_the_step_and_what_the_nodes_said(tmp_path: Path) -> None:
    results = json.loads((never_back(tmp_path) / "results.json").read_text())
    assert results["verdict"] == "UNAVAILABLE"
    [u] = results["liveness"]["unavailable"]
    assert (u["queue"], u["fault_id"], u["kinds"]) == ("q", "f2", ["publish", "consume"])
    assert u["log"] == ["n1: queue 'q' in vhost '/': Stopping all nodes on master shutdown"]
    text = summary_table(results)
    assert "queue q never recovered: no publish or consume ok since" in text
    assert "n1: queue depth: timed out; n2: queue depth: timed out" in text
    assert (
        "f1 (partition on n1) q: publish ok after" in text and "recovered in" in text and "budget 60s" in text
    )
    assert "f2 (kill on n2) q: publish ok after never, consume ok after never: NOT recovered" in text
    assert "log: n1: queue 'q' in vhost '/': Stopping all nodes on master shutdown" in text
    assert "unreachable" in text and results["counts"]["lost"] == 0 and results["counts"]["unreachable"] > 0


def test_allure_has_a_liveness_step_per_fault_failed_where_a_queue_did_not_come_back(tmp_path: Path) -> None:
    result, _ = allure_result(tmp_path, never_back(tmp_path))
    steps: dict[str, Any] = {s["name"]: s for s in result["steps"]}
    assert steps["liveness f1 (partition): recovered"]["status"] == "passed"
    assert steps["liveness f2 (kill): did not recover"]["status"] == "failed"
    params = {x["name"]: x["value"] for x in steps["liveness f2 (kill): did not recover"]["parameters"]}
    assert "NOT recovered" in params["q"]
