"""The harness's drain rounds over a driver's per-node reads (``harness.drain``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.drain import run_drain
from harness.history import Recorder, read_jsonl
from harness.scenario import WorkloadSection
from harness.spec.client import DrainUnfinished, NoCopy, NodeDrain
from harness.workload import run_workload
from tests.harness.test_workload import MemoryDriver


class StreamReader:
    """A drain over in-process copies: ``held[node]`` is what a visit to that node acks; a node
    in ``replicas`` refuses reads (a replica), one in ``down`` cannot be reached, one in
    ``gone`` answers that the cluster holds no such queue."""

    def __init__(
        self,
        recorder: Recorder,
        process: str,
        queue: str,
        held: dict[str, list[str]],
        replicas: set[str] = frozenset(),  # type: ignore[assignment]
        down: set[str] = frozenset(),  # type: ignore[assignment]
        gone: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> None:
        self.recorder, self.process, self.queue = recorder, process, queue
        self.held = held
        self.replicas, self.down, self.gone = replicas, down, gone
        self.consumed = 0
        self.seen: dict[str, dict[str, Any]] = {
            n: {"consumed": 0, "ready": None, "unacked": None, "empty_at_ns": None, "error": None}
            for n in held
        }

    async def visit(self, node: str, left: Callable[[], float]) -> bool | NoCopy:
        view = self.seen[node]
        if node in self.down:
            view["error"] = "connect: refused"
            return False
        if node in self.replicas:
            return NoCopy("READONLY You can't write against a read only replica")
        if node in self.gone:
            return NoCopy("no such queue", gone=True)
        while self.held[node]:
            msg_id = self.held[node].pop(0)
            self.recorder.invoke(self.process, "consume", node=node, queue=self.queue).ok(msg_id)
            self.recorder.invoke(self.process, "ack", node=node, queue=self.queue, value=msg_id).ok()
            self.consumed += 1
            view["consumed"] += 1
        view.update(ready=0, unacked=0, error=None)
        view["empty_at_ns"] = view["empty_at_ns"] or self.recorder.now_ns()
        return True

    def views(self) -> dict[str, dict[str, Any]]:
        return {n: dict(v) for n, v in self.seen.items()}

    async def extra(self) -> dict[str, Any]:
        return {"replicas": {n: len(held) for n, held in self.held.items()}}


def drain_op(path: Path) -> dict[str, Any]:
    done = [r for r in read_jsonl(path) if r["f"] == "drain" and r["type"] != "invoke"]
    assert len(done) == 1
    return done[0]


def test_a_drain_reads_the_primary_and_leaves_replicas_out_of_the_rule(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "h.jsonl")
    held = {"n1": [], "n2": ["p1:1", "p1:2", "p1:3"], "n3": []}
    reader = StreamReader(rec, "d1", "q", held, replicas={"n1", "n3"})
    n = asyncio.run(run_drain(reader, rec, "d1", "q", ["n1", "n2", "n3"], timeout=30, pause=0.0))
    rec.close()
    assert n == 3
    op = drain_op(tmp_path / "h.jsonl")
    assert op["type"] == "ok"
    value = json.loads(op["value"])
    assert value["consumed"] == 3 and value["nodes"]["n2"]["consumed"] == 3
    assert value["replicas"] == {"n1": 0, "n2": 0, "n3": 0}  # what the reader adds of its own
    assert value["no_copy"] == {
        n: "READONLY You can't write against a read only replica" for n in ("n1", "n3")
    }
    # The first round consumed three, so a second one had to find every serving node empty again.
    assert [r["empty"] for r in value["rounds"]] == [["n2"], ["n2"]]
    assert [r["consumed"] for r in value["rounds"]] == [3, 3]
    assert all(r["no_copy"] == ["n1", "n3"] and r["errors"] == {} for r in value["rounds"])


def test_a_drain_where_no_node_serves_reads_is_unfinished(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "h.jsonl")
    reader = StreamReader(rec, "d1", "q", {"n1": [], "n2": []}, replicas={"n1", "n2"})
    with pytest.raises(DrainUnfinished, match="no node served reads of it"):
        asyncio.run(run_drain(reader, rec, "d1", "q", ["n1", "n2"], timeout=0.3, pause=0.01))
    rec.close()
    op = drain_op(tmp_path / "h.jsonl")
    assert op["type"] == "info"
    assert "n1: holds no copy to drain (READONLY" in op["error"]
    assert all(r["empty"] == [] for r in json.loads(op["value"])["rounds"])


def test_a_node_that_cannot_be_reached_keeps_the_drain_going_until_the_time_runs_out(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "h.jsonl")
    reader = StreamReader(rec, "d1", "q", {"n1": ["p1:1"], "n2": []}, down={"n2"})
    with pytest.raises(DrainUnfinished) as info:
        asyncio.run(run_drain(reader, rec, "d1", "q", ["n1", "n2"], timeout=0.3, pause=0.01))
    rec.close()
    assert info.value.consumed == 1
    op = drain_op(tmp_path / "h.jsonl")
    assert op["type"] == "info" and "n2: connect: refused" in op["error"]
    rounds = json.loads(op["value"])["rounds"]
    assert rounds[0]["empty"] == ["n1"] and rounds[0]["errors"] == {"n2": "connect: refused"}
    assert "no_copy" not in json.loads(op["value"])


def test_a_round_in_which_every_node_says_the_queue_does_not_exist_ends_the_drain_gone(
    tmp_path: Path,
) -> None:
    """The cluster answers through every node that the queue does not exist: nothing is left to
    read, so the drain is complete (what was confirmed and not consumed is lost), and its value
    says the queue is gone, so the checkers do not take it for the queue answering."""
    rec = Recorder(tmp_path / "h.jsonl")
    reader = StreamReader(rec, "d1", "q", {"n1": [], "n2": [], "n3": []}, gone={"n1", "n2", "n3"})
    assert asyncio.run(run_drain(reader, rec, "d1", "q", ["n1", "n2", "n3"], timeout=30, pause=0.0)) == 0
    rec.close()
    op = drain_op(tmp_path / "h.jsonl")
    assert op["type"] == "ok"
    value = json.loads(op["value"])
    assert value["gone"] == dict.fromkeys(("n1", "n2", "n3"), "no such queue")
    assert "no_copy" not in value
    [only] = value["rounds"]
    assert only["empty"] == [] and only["gone"] == ["n1", "n2", "n3"]


def test_a_round_in_which_only_some_nodes_say_the_queue_does_not_exist_is_unfinished(tmp_path: Path) -> None:
    """Gone on two nodes, the third down: what the third holds is not known, so the drain is
    unfinished (its messages unreachable), round after round until the time runs out; gone on
    two and empty on the third is no empty round either (the answers disagree), nor gone on one
    beside replicas that hold no copy."""
    cases: list[tuple[dict[str, list[str]], dict[str, set[str]]]] = [
        ({"n1": [], "n2": [], "n3": []}, {"gone": {"n1", "n2"}, "down": {"n3"}}),
        ({"n1": [], "n2": [], "n3": []}, {"gone": {"n1", "n2"}}),
        ({"n1": [], "n2": []}, {"gone": {"n1"}, "replicas": {"n2"}}),
    ]
    for held, kinds in cases:
        path = tmp_path / f"{len(held)}-{'-'.join(sorted(kinds))}.jsonl"
        rec = Recorder(path)
        reader = StreamReader(rec, "d1", "q", held, **kinds)
        with pytest.raises(DrainUnfinished) as info:
            asyncio.run(run_drain(reader, rec, "d1", "q", list(held), timeout=0.3, pause=0.01))
        rec.close()
        op = drain_op(path)
        assert op["type"] == "info"
        assert "n1: the cluster says the queue does not exist (no such queue)" in info.value.args[0]
        value = json.loads(op["value"])
        assert value["gone"] == {n: "no such queue" for n in sorted(kinds["gone"])}
        assert len(value["rounds"]) > 1 and all(r["gone"] == sorted(kinds["gone"]) for r in value["rounds"])
    assert "n3: connect: refused" in drain_op(tmp_path / "3-down-gone.jsonl")["error"]


class ReaderDriver(MemoryDriver):
    """``MemoryDriver`` offering its protocol's read of one node instead of a whole drain."""

    def drain_reader(self, process: str, queue: str) -> StreamReader:
        held = {"n1": list(self.queues[queue]), "n2": [], "n3": []}
        self.queues[queue].clear()
        self.events.append(f"drain {queue}")
        return StreamReader(self.recorder, process, queue, held, replicas={"n3"})


def test_the_workload_runs_the_rounds_over_a_drivers_reader(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "h.jsonl")
    w = WorkloadSection(producers=2, consumers=0, queues=1, duration=0.2, rate=100, confirm_timeout=1)
    stats = asyncio.run(run_workload(ReaderDriver(rec, rate=50), w, ["n1", "n2", "n3"], 7, rec))
    rec.close()
    records = list(read_jsonl(tmp_path / "h.jsonl"))
    published = {r["value"] for r in records if r["f"] == "publish" and r["type"] == "ok"}
    acked = {r["value"] for r in records if r["f"] == "ack" and r["type"] == "ok"}
    assert published and acked == published
    assert stats.drained == {"chaos-1": len(published)}
    op = drain_op(tmp_path / "h.jsonl")
    assert op["process"] == "d1" and op["type"] == "ok"
    assert json.loads(op["value"])["no_copy"] == {
        "n3": "READONLY You can't write against a read only replica"
    }


@dataclass
class _View:
    consumed: int = 0
    empty_at_ns: int | None = None
    error: str | None = None


class _Acks:
    acked = 0


def test_a_timeout_inside_a_visit_is_that_nodes_error_not_the_drains_time_running_out() -> None:
    """A client library's own timeout raised while reading (nats-py's is a ``TimeoutError``) is
    what the node said; only the drain's time running out is named ``drain_timeout``."""

    async def visit(read: Callable[[], Any], left: float) -> str | None:
        drain = NodeDrain(["n1"], _View)
        view = drain.node_views["n1"]

        async def noop(_c: object) -> None:
            return None

        got = await drain.visit_with(
            view,
            lambda: left,
            connect=lambda: noop(None),
            session=lambda _c: _Acks(),
            read=lambda _c, _s: read(),
            close=noop,
            errors=(OSError, TimeoutError),
            drain_timeout=9,
        )
        assert got is False
        return view.error

    async def library_timeout() -> bool:
        raise TimeoutError("nats: timeout")

    async def forever() -> bool:
        await asyncio.Event().wait()
        return True

    assert asyncio.run(visit(library_timeout, 30)) == "TimeoutError: nats: timeout"
    assert asyncio.run(visit(forever, 0.05)) == "drain_timeout (9s) ran out on this node"
