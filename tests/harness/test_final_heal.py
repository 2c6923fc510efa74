"""A final heal that cannot bring a node back (``NodesDown``): the run records that node's outcome,
drains through the nodes that came back and is graded; with none left to serve, it is ``unknown``.

The nemesis, the final heal over every fault kind (``harness.runner.heal_all``), the workload with
its drain and the Python checker all run for real; only the broker is an in-process queue, whose
nodes n1..n3 share one copy (a replicated queue)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from harness import NodesDown
from harness.history import Recorder, read_jsonl
from harness.nemesis import Nemesis, Plan
from harness.runner import heal_all
from harness.scenario import WorkloadSection
from harness.spec.fault import Fault, FaultContext
from harness.spec.rundir import HISTORY_JSONL
from harness.verdicts import exit_code, summary_table
from harness.workload import run_workload
from spark_reports import render_report
from spark_reports.engines.python import check_python
from tests.harness.test_workload import MemoryDriver, MemoryReader

NODES = ["n1", "n2", "n3"]
WHY = "not ready after 300s (its broker exited with code 1 at 2026-11-29T03:40:02)\nlast log lines:\nWAL CRC"


class Refuses(Fault):
    """A kind whose final heal cannot bring back the nodes in ``down`` (as a broker that stops on a
    checksum at every start), having started the others."""

    name = "refuses"
    down: ClassVar[list[str]] = []

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        started = {n: {"start": True} for n in NODES if n not in cls.down}
        if cls.down:
            raise NodesDown({n: WHY for n in cls.down}, started)
        return started


class Proxies(Fault):
    """A kind healed after ``refuses`` (by name): it must still heal."""

    name = "reset"
    healed: ClassVar[list[bool]] = []

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        cls.healed.append(True)
        return {"proxies": "reset"}


class NodeReader(MemoryReader):
    """The shared queue, read through one node per visit; every visit's node is kept."""

    visited: ClassVar[list[str]] = []

    async def visit(self, node: str, left: Callable[[], float]) -> bool:
        NodeReader.visited.append(node)
        return await super().visit(node, left)


class Driver(MemoryDriver):
    def drain_reader(self, process: str, queue: str) -> NodeReader:
        return NodeReader(self, process, queue)


def run(tmp_path: Path, down: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    Refuses.down, Proxies.healed, NodeReader.visited = down, [], []
    rec = Recorder(tmp_path / HISTORY_JSONL)
    faults = {"refuses": Refuses, "reset": Proxies}
    ctx = FaultContext(None)
    nemesis = Nemesis(
        Plan(),
        faults,
        ctx,
        rec,
        settle=0.0,
        final_heal=lambda: heal_all(faults, ctx, frozenset()),
        serving=NODES,
    )
    w = WorkloadSection(producers=2, consumers=0, queues=1, duration=0.3, rate=100, confirm_timeout=1)
    asyncio.run(run_workload(Driver(rec, rate=50), w, NODES, 7, rec, nemesis=nemesis, down=nemesis.down))
    rec.close()
    scenario = {"name": "final-heal", "seed": 7, "workload": {"producers": 2, "consumers": 0}}
    return dict(check_python(tmp_path, scenario)), list(read_jsonl(tmp_path / HISTORY_JSONL))


def final_heal(history: list[dict[str, Any]]) -> dict[str, Any]:
    [done] = [r for r in history if r["f"] == "heal" and r["type"] != "invoke"]
    return done


def test_a_node_that_does_not_come_back_is_recorded_and_the_others_are_drained_and_graded(
    tmp_path: Path,
) -> None:
    results, history = run(tmp_path, ["n1"])
    heal = final_heal(history)
    value = json.loads(heal["value"])
    assert heal["type"] == "info" and "n1" in heal["error"]
    assert value["down"] == {"n1": WHY} and value["serving"] == ["n2", "n3"]
    assert value["done"] == {
        "refuses": {"n2": {"start": True}, "n3": {"start": True}},
        "reset": {"proxies": "reset"},
    }
    assert Proxies.healed == [True]  # the heal went on past the kind that could not bring n1 back
    assert NodeReader.visited and set(NodeReader.visited) == {"n2", "n3"}
    counts = results["counts"]
    assert (
        counts["confirmed"] > 10 and counts["consumed_unique"] == counts["confirmed"] and counts["lost"] == 0
    )
    assert results["drain"]["completed"]
    # Durable on what the drain read, but not plainly durable: n1 never came back.
    assert results["verdict"] == "UNAVAILABLE" and exit_code(results) == 1
    assert results["reason"].startswith("n1 did not come back after the final heal")
    assert "its broker exited with code 1" in results["reason"]
    [node] = results["liveness"]["nodes_down"]
    assert (node["node"], node["reason"]) == ("n1", WHY)
    assert results["liveness"]["serving"] == ["n2", "n3"]
    text = summary_table(results)  # the terminal names it, why, and its last log line
    assert "did not come back" in text and "drained through: n2, n3" in text and "n1 log: WAL CRC" in text
    page = render_report(tmp_path, results)  # type: ignore[arg-type]
    assert page is not None and "n1 did not come back after the final heal" in page.read_text()


def test_with_no_node_left_to_serve_nothing_is_drained_and_the_run_is_unknown(tmp_path: Path) -> None:
    results, history = run(tmp_path, NODES)
    assert json.loads(final_heal(history)["value"])["serving"] == []
    assert NodeReader.visited == [] and not [r for r in history if r["f"] == "drain"]
    assert results["verdict"] == "unknown" and exit_code(results) == 3
    assert results["reason"].startswith("no node that serves clients came back")
    assert "n1 did not come back" in results["reason"] and "n3 did not come back" in results["reason"]


def test_every_node_back_records_no_outcome(tmp_path: Path) -> None:
    results, history = run(tmp_path, [])
    heal = final_heal(history)
    assert heal["type"] == "ok" and "down" not in json.loads(heal["value"])
    assert results["verdict"] == "durable" and results["liveness"]["nodes_down"] == []
