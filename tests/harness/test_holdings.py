"""The harness's look at each node's own copy after the drain (``holdings`` ops)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ClusterError
from harness.history import Recorder, read_jsonl
from harness.scenario import WorkloadSection
from harness.spec.broker import BrokerPlugin, NodeHandle
from harness.workload import node_holdings_reader, run_workload
from tests.harness.test_workload import MemoryDriver


@dataclass
class Named:
    """A node as ``node_holdings`` sees it: only its name is read here."""

    name: str

    def exec(self, cmd: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
        raise AssertionError("not used")


class FixedHoldings(BrokerPlugin):
    """Answers from a table: n1 holds two entries, n2 one, n3's command fails, n2 cannot tell chaos-2."""

    name = "fixed-holdings"
    client_port = 5999
    data_dir = "/d"

    def __init__(self) -> None:
        self.threads: set[int] = set()

    def node_holdings(self, node: NodeHandle, queue: str) -> list[tuple[int | None, str]] | None:
        self.threads.add(threading.get_ident())
        if node.name == "n3":
            raise ClusterError("n3: redis-cli failed: Connection refused")
        if node.name == "n2" and queue == "chaos-2":
            return None
        return [(1, "p1:1"), (2, "p1:2")] if node.name == "n1" else [(None, "p1:1")]


NODES = ["n1", "n2", "n3"]


def test_every_node_and_queue_gets_one_holdings_op_after_the_drain(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "h.jsonl")
    plugin = FixedHoldings()
    holdings = node_holdings_reader(plugin, {n: Named(n) for n in NODES})
    assert holdings is not None
    w = WorkloadSection(producers=1, consumers=1, queues=2, duration=0.2, rate=50, confirm_timeout=1)
    asyncio.run(run_workload(MemoryDriver(rec, rate=50), w, NODES, 7, rec, holdings=holdings))
    rec.close()
    records = list(read_jsonl(tmp_path / "h.jsonl"))
    ops = [r for r in records if r["f"] == "holdings"]
    last_drain = max(r["index"] for r in records if r["f"] == "drain" or r["process"].startswith("d"))
    assert min(r["index"] for r in ops) > last_drain, "asked after the drain ended"
    assert {r["process"] for r in ops} == {"holdings"}
    done = {(r["node"], r["queue"]): r for r in ops if r["type"] != "invoke"}
    assert len(done) == len([r for r in ops if r["type"] == "invoke"]) == 6
    assert done[("n1", "chaos-1")]["type"] == "ok"
    assert json.loads(done[("n1", "chaos-1")]["value"]) == {"entries": [[1, "p1:1"], [2, "p1:2"]]}
    assert json.loads(done[("n2", "chaos-1")]["value"]) == {"entries": [[None, "p1:1"]]}
    assert done[("n2", "chaos-2")]["type"] == "info"
    assert "cannot tell" in done[("n2", "chaos-2")]["error"]
    assert done[("n3", "chaos-1")]["type"] == "info"
    assert "Connection refused" in done[("n3", "chaos-1")]["error"]
    assert threading.get_ident() not in plugin.threads, "a blocking plugin call ran on the event loop"


def test_a_plugin_without_the_hook_adds_no_holdings_ops(tmp_path: Path) -> None:
    class QueueBroker(BrokerPlugin):
        name = "queue-broker"
        client_port = 5999
        data_dir = "/d"

    assert node_holdings_reader(QueueBroker(), {n: Named(n) for n in NODES}) is None
    rec = Recorder(tmp_path / "h.jsonl")
    w = WorkloadSection(producers=1, consumers=1, duration=0.1, rate=50, confirm_timeout=1)
    asyncio.run(run_workload(MemoryDriver(rec, rate=50), w, NODES, 7, rec, holdings=None))
    rec.close()
    assert not [r for r in read_jsonl(tmp_path / "h.jsonl") if r["f"] == "holdings"]
