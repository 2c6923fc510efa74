"""Workload scheduling: pacing, who talks to which node, the stats, and the run/stop/drain order."""

from __future__ import annotations

import asyncio
import collections
import types
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness import drain, workload
from harness.history import Recorder, read_jsonl
from harness.scenario import ConsumerSection, WorkloadSection
from harness.spec import client as client_spec
from harness.spec.broker import BrokerPlugin
from harness.spec.client import DrainReader, RateLimiter, slow_consumers
from harness.workload import WorkloadStats, assignments, queue_names, run_workload
from tests.polling import until_async


class FakeClock:
    """``time.monotonic`` and ``asyncio.sleep`` for the limiter: sleeping advances the clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(client_spec, "time", types.SimpleNamespace(monotonic=c.monotonic))
    monkeypatch.setattr(client_spec, "asyncio", types.SimpleNamespace(sleep=c.sleep))
    return c


def run_now(coro: Coroutine[Any, Any, Any]) -> None:
    """Drive a coroutine that never really suspends (the fake sleep returns at once)."""
    try:
        coro.send(None)
    except StopIteration:
        return
    raise AssertionError("the coroutine suspended")


def permits(limiter: RateLimiter, clock: FakeClock, n: int, work: float = 0.0) -> list[float]:
    times = []
    for _ in range(n):
        run_now(limiter.wait())
        times.append(round(clock.now - 1000.0, 9))
        clock.now += work
    return times


def test_permits_are_evenly_spaced(clock: FakeClock) -> None:
    times = permits(RateLimiter(100), clock, 6)
    assert times == pytest.approx([0.0, 0.01, 0.02, 0.03, 0.04, 0.05])


def test_spacing_counts_the_callers_own_work(clock: FakeClock) -> None:
    times = permits(RateLimiter(10), clock, 4, work=0.03)
    assert times == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert clock.sleeps == pytest.approx([0.07, 0.07, 0.07])


def test_no_catch_up_burst_after_a_stall(clock: FakeClock) -> None:
    lim = RateLimiter(100)
    run_now(lim.wait())
    clock.now += 2.0  # the producer was blocked (flow control, a partition) for 2 s
    times = permits(lim, clock, 3)
    assert times == pytest.approx([2.0, 2.01, 2.02])  # not 200 permits at once


def test_unlimited_rate_never_sleeps(clock: FakeClock) -> None:
    permits(RateLimiter(0), clock, 100)
    assert clock.sleeps == []


def test_real_clock_rate_is_roughly_kept() -> None:
    async def go() -> float:
        lim = RateLimiter(200)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for _ in range(21):
            await lim.wait()
        return loop.time() - t0

    elapsed = asyncio.run(go())
    assert (
        elapsed >= 0.09
    )  # 20 gaps of 5 ms at least; a busy machine only adds (exact gaps: the fake clock above)


def test_queue_names() -> None:
    assert queue_names(WorkloadSection(queues=3, queue_prefix="q")) == ["q-1", "q-2", "q-3"]


@pytest.mark.parametrize(
    ("producers", "consumers", "queues", "nodes"), [(3, 3, 1, 3), (6, 4, 2, 3), (5, 5, 5, 5), (2, 2, 1, 1)]
)
def test_assignments_spread_over_nodes_and_queues(
    producers: int, consumers: int, queues: int, nodes: int
) -> None:
    w = WorkloadSection(producers=producers, consumers=consumers, queues=queues)
    names = [f"n{i}" for i in range(1, nodes + 1)]
    a = assignments(w, names, seed=3)
    assert sorted(a) == sorted(
        [f"p{i}" for i in range(1, producers + 1)] + [f"c{i}" for i in range(1, consumers + 1)]
    )
    for role, count in (("p", producers), ("c", consumers)):
        per_node = collections.Counter(node for proc, (_q, node) in a.items() if proc.startswith(role))
        assert set(per_node) <= set(names)
        if count >= nodes:
            assert set(per_node) == set(names)
        assert max(per_node.values()) - min(per_node.values() or [0]) <= 1 or len(per_node) < nodes
        per_queue = collections.Counter(q for proc, (q, _n) in a.items() if proc.startswith(role))
        if count >= queues:
            assert set(per_queue) == set(queue_names(w))
    if nodes > 1:
        for i in range(1, min(producers, consumers) + 1):
            assert a[f"p{i}"][1] != a[f"c{i}"][1], "producer and consumer of one queue share a node"


def test_assignments_are_seeded() -> None:
    w = WorkloadSection(producers=5, consumers=5)
    nodes = ["n1", "n2", "n3", "n4", "n5"]
    assert assignments(w, nodes, 1) == assignments(w, nodes, 1)
    assert len({str(assignments(w, nodes, s)) for s in range(10)}) > 1


def test_stats_as_dict() -> None:
    s = WorkloadStats(
        started=10.0,
        stopped=12.0,
        cpu_seconds=0.5,
        published_ok=90,
        published_fail=4,
        published_info=6,
        consumed=100,
        delivered=120,
        abandoned=20,
        reconnects=2,
        drained={"chaos-1": 3},
    )
    d = s.as_dict()
    assert d == {
        "wall_seconds": 2.0,
        "driver_cpu_seconds": 0.5,
        "messages_published_ok": 90,
        "messages_published_fail": 4,
        "messages_published_info": 6,
        "messages_consumed": 100,
        "messages_delivered": 120,
        "messages_abandoned": 20,
        "reconnects": 2,
        "ops_per_second": 100.0,
        "driver_capacity_ops_per_cpu_second": 400.0,
        "driver_cpu_share": 0.25,
    }
    assert WorkloadStats().as_dict()["driver_capacity_ops_per_cpu_second"] is None


class MemoryDriver:
    """A driver over in-process queues: the scheduler's contract without a broker."""

    def __init__(self, recorder: Recorder, rate: float) -> None:
        self.recorder = recorder
        self.rate = rate
        self.queues: dict[str, collections.deque[str]] = collections.defaultdict(collections.deque)
        self.events: list[str] = []

    async def setup(self, queues: Sequence[str]) -> None:
        self.queues.update({q: collections.deque() for q in queues})  # a dead-letter queue: on first use
        self.events.append("setup")

    async def produce(self, process: str, queue: str, stop: asyncio.Event) -> None:
        lim = RateLimiter(self.rate)
        seq = 0
        while not stop.is_set():
            await lim.wait()
            seq += 1
            op = self.recorder.invoke(process, "publish", node="n1", queue=queue, value=f"{process}:{seq}")
            self.queues[queue].append(f"{process}:{seq}")
            op.ok()
        self.events.append(f"{process} stopped")

    def _take(self, process: str, queue: str) -> None:
        msg_id = self.queues[queue].popleft()
        self.recorder.invoke(process, "consume", node="n2", queue=queue).ok(msg_id)
        self.recorder.invoke(process, "ack", node="n2", queue=queue, value=msg_id).ok()

    async def consume(self, process: str, queue: str, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(0.05)
            if self.queues[queue]:
                self._take(process, queue)
        self.events.append(f"{process} stopped")

    def drain_reader(self, process: str, queue: str) -> DrainReader:
        self.events.append(f"drain {queue}")
        return MemoryReader(self, process, queue)


class MemoryReader:
    """A visit takes whatever the in-process queue holds; every node shares the one queue."""

    def __init__(self, driver: MemoryDriver, process: str, queue: str) -> None:
        self.d, self.process, self.queue = driver, process, queue
        self.consumed = 0

    async def visit(self, node: str, left: Callable[[], float]) -> bool:
        self.d.events.append(f"visit {self.queue}")
        while self.d.queues[self.queue]:
            self.d._take(self.process, self.queue)
            self.consumed += 1
        return True

    def views(self) -> dict[str, dict[str, Any]]:
        return {}

    async def extra(self) -> dict[str, Any]:
        return {}


def test_run_workload_runs_stops_heals_and_drains(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "h.jsonl")
    w = WorkloadSection(producers=2, consumers=1, queues=2, duration=0.3, rate=100, confirm_timeout=1)
    driver = MemoryDriver(rec, rate=50)
    nemesis_calls: list[str] = []

    async def nemesis(duration: float) -> None:
        nemesis_calls.append(f"start {duration}")
        await asyncio.sleep(duration + 0.1)  # the final heal and the settle outlast the producers
        nemesis_calls.append("healed")
        driver.events.append("nemesis healed")

    stats = asyncio.run(run_workload(driver, w, ["n1", "n2", "n3"], 7, rec, nemesis=nemesis))
    rec.close()
    assert nemesis_calls == ["start 0.3", "healed"]
    ev = driver.events
    assert ev[0] == "setup"
    # Producers stop, the nemesis heals, consumers stop, then every queue is drained.
    assert (
        ev.index("p1 stopped")
        < ev.index("nemesis healed")
        < ev.index("c1 stopped")
        < ev.index("drain chaos-1")
    )
    records = list(read_jsonl(tmp_path / "h.jsonl"))
    published = [r for r in records if r["f"] == "publish" and r["type"] == "ok"]
    consumed = [r for r in records if r["f"] == "ack" and r["type"] == "ok"]
    assert stats.published_ok == len(published) > 10
    assert sorted(r["value"] for r in consumed) == sorted(r["value"] for r in published)  # all drained
    # ``consumed`` counts acks that completed ok, the drain's included
    assert stats.consumed == stats.delivered == len(published)
    assert sum(stats.drained.values()) == len([r for r in consumed if r["process"].startswith("d")])
    assert set(stats.drained) == {"chaos-1", "chaos-2"}
    assert stats.stopped - stats.started >= 0.4
    assert stats.as_dict()["messages_published_ok"] == len(published)


def test_dead_letter_queues_have_a_consumer_each_and_are_drained_after_the_queues(tmp_path: Path) -> None:
    w = WorkloadSection(
        producers=1, consumers=2, queues=2, duration=0.2, rate=50, confirm_timeout=1, dead_letter=True
    )
    plan = assignments(w, ["n1", "n2", "n3"], seed=3)
    assert {p: q for p, (q, _n) in plan.items() if p.startswith("c")} == {
        "c1": "chaos-1",
        "c2": "chaos-2",
        "c3": "chaos-1.dead",
        "c4": "chaos-2.dead",
    }
    assert "c3" not in slow_consumers(ConsumerSection(slow=2), w.consumers, 3)  # only c1..cN can be slow
    rec = Recorder(tmp_path / "h.jsonl")
    driver = MemoryDriver(rec, rate=50)
    stats = asyncio.run(run_workload(driver, w, ["n1", "n2", "n3"], 3, rec))
    rec.close()
    ev = driver.events
    assert {"c3 stopped", "c4 stopped"} <= set(ev)
    visits = [e for e in ev if e.startswith("visit ")]
    assert max(visits.index(f"visit chaos-{i}") for i in (1, 2)) < min(
        visits.index(f"visit chaos-{i}.dead") for i in (1, 2)
    )
    assert set(stats.drained) == {"chaos-1", "chaos-2", "chaos-1.dead", "chaos-2.dead"}
    drains = [r for r in read_jsonl(tmp_path / "h.jsonl") if r["f"] == "drain" and r["type"] == "invoke"]
    assert [(r["process"], r["queue"]) for r in drains] == [
        ("d1", "chaos-1"),
        ("d2", "chaos-2"),
        ("d3", "chaos-1.dead"),
        ("d4", "chaos-2.dead"),
    ]


def test_a_failing_drain_is_reported_not_raised(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "h.jsonl")

    class BrokenDrain(MemoryDriver):
        def drain_reader(self, process: str, queue: str) -> DrainReader:
            raise ConnectionError("node gone")

    w = WorkloadSection(producers=1, consumers=0, duration=0.1)
    stats = asyncio.run(run_workload(BrokenDrain(rec, 100), w, ["n1"], 0, rec))
    rec.close()
    assert stats.drained == {"chaos-1": "error: node gone"}


def test_the_live_progress_counts_acked_messages_not_deliveries(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "h.jsonl")
    for i in range(1, 4):
        rec.invoke("c1", "consume", queue="q").ok(f"p1:{i}")
    rec.invoke("c1", "ack", queue="q", value="p1:1").ok()
    rec.invoke("c1", "ack", queue="q", value="p1:2").info("connection lost")
    seen: list[dict[str, int]] = []

    async def go() -> None:
        task = asyncio.create_task(workload._tick(seen.append, rec, WorkloadStats()))
        await until_async(lambda: seen, "the first tick")
        task.cancel()

    asyncio.run(go())
    rec.close()
    assert seen[0]["consumed"] == 1


def _rounds(times: dict[str, float], empty: set[str], budget: float) -> drain.DrainEnd:
    """drain_rounds over nodes whose visits take ``times`` seconds of a logical clock."""
    now = [0.0]

    async def visit(node: str) -> bool:
        now[0] += times[node]
        return node in empty

    return asyncio.run(drain.drain_rounds(list(times), visit, lambda: 0, lambda: budget - now[0], 0.0))


def test_a_drain_that_runs_out_names_the_nodes_it_never_reached() -> None:
    end = _rounds({"n1": 8.0, "n2": 1.0, "n3": 0.0}, set(), budget=8.0)
    assert end == drain.DrainEnd(False, ("n2", "n3"))
    why = end.why("chaos-1", 8, {"n1": "drain_timeout (8s) ran out on this node", "n2": None, "n3": None})
    assert why == (
        "not every node reported chaos-1 empty within 8s: n1: drain_timeout (8s) ran out on this node; "
        "n2: the time ran out before the drain reached it; n3: the time ran out before the drain reached it"
    )


def test_a_drain_ends_empty_after_a_round_that_finds_every_node_empty() -> None:
    assert _rounds({"n1": 1.0, "n2": 1.0}, {"n1", "n2"}, budget=10.0) == drain.DrainEnd(True)
    end = _rounds({"n1": 1.0, "n2": 1.0}, {"n1"}, budget=3.0)
    assert end == drain.DrainEnd(False, ("n2",))
    assert end.why("q", 3, {"n1": None, "n2": "connect: refused"}) == (
        "not every node reported q empty within 3s: n2: connect: refused"
    )


def test_a_drain_keeps_trying_a_queue_that_does_not_answer_and_counts_a_late_recovery() -> None:
    """Every node answers but the queue does not (its visits fail) for three rounds; then it comes
    back, yields its messages, and the next round finds every node empty. Each round is recorded."""
    rounds: list[dict] = []
    visits = [0]
    consumed = [0]

    async def visit(node: str) -> bool:
        visits[0] += 1
        if visits[0] <= 6:  # three rounds of two nodes: the queue is down
            return False
        if visits[0] == 7:  # it is back: this visit drains what it held
            consumed[0] += 5
        return True

    def on_round(empty: list[str]) -> None:
        errors = {
            "n1": None if "n1" in empty else "queue depth: timed out",
            "n2": None if "n2" in empty else "x",
        }
        drain.add_round(rounds, visits[0], consumed[0], empty, errors)

    end = asyncio.run(
        drain.drain_rounds(["n1", "n2"], visit, lambda: consumed[0], lambda: 1.0, 0.0, on_round=on_round)
    )
    assert end == drain.DrainEnd(True)
    assert [r["empty"] for r in rounds] == [[], [], [], ["n1", "n2"], ["n1", "n2"]]
    assert rounds[0]["errors"] == {"n1": "queue depth: timed out", "n2": "x"}
    assert [r["consumed"] for r in rounds] == [0, 0, 0, 5, 5]


def test_a_drain_records_at_most_max_rounds_keeping_the_last() -> None:
    rounds: list[dict] = []
    for i in range(drain.MAX_ROUNDS + 7):
        drain.add_round(rounds, i, 0, [], {"n1": "down"})
    assert len(rounds) == drain.MAX_ROUNDS
    assert rounds[-1]["end_ns"] == drain.MAX_ROUNDS + 6
    assert rounds[-2]["end_ns"] == drain.MAX_ROUNDS - 2


def test_a_client_task_failing_after_its_operation_gave_up_is_logged_not_printed(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """An aiormq round trip abandoned by a timed-out wait fails later when a partition closes its
    connection; asyncio would print its traceback when the task is collected, after the loop."""
    import gc
    import logging

    from harness.workload import _orphaned_task_failed

    async def orphan() -> None:
        asyncio.get_running_loop().set_exception_handler(_orphaned_task_failed)

        async def fails() -> None:
            raise ConnectionError("CONNECTION_FORCED - node paused: minority partition")

        task = asyncio.ensure_future(fails())
        while not task.done():
            await asyncio.sleep(0)
        del task

    with caplog.at_level(logging.DEBUG, logger="brokerchaos.workload"):
        asyncio.run(orphan())
        gc.collect()
    assert "Traceback" not in capsys.readouterr().err
    assert [r.levelname for r in caplog.records if r.name == "asyncio"] == []
    assert any(
        r.name == "brokerchaos.workload" and "minority partition" in r.getMessage() for r in caplog.records
    ), caplog.records


def test_a_brokers_own_dead_letter_queues_are_drained_after_the_queues_with_no_consumer(
    tmp_path: Path,
) -> None:
    w = WorkloadSection(producers=1, consumers=1, queues=1, duration=0.2, rate=50, confirm_timeout=1)
    rec = Recorder(tmp_path / "h.jsonl")
    driver = MemoryDriver(rec, rate=50)
    driver.queues["Broker.DLQ"].append("p9:1")  # something the broker dead-lettered on its own
    stats = asyncio.run(run_workload(driver, w, ["n1"], 3, rec, broker_dead_letter=("Broker.DLQ",)))
    rec.close()
    visits = [e for e in driver.events if e.startswith("visit ")]
    assert visits.index("visit chaos-1") < visits.index("visit Broker.DLQ")
    assert stats.drained["Broker.DLQ"] == 1
    assert not any(
        p.startswith("c") and q == "Broker.DLQ" for p, (q, _n) in assignments(w, ["n1"], 3).items()
    )
    drains = [r for r in read_jsonl(tmp_path / "h.jsonl") if r["f"] == "drain" and r["type"] == "invoke"]
    assert [(r["process"], r["queue"]) for r in drains] == [("d1", "chaos-1"), ("d2", "Broker.DLQ")]


def test_a_depth_answer_may_take_the_node_s_share_of_the_drain_budget() -> None:
    """Raising ``drain_timeout`` gives a loaded host's depth queries more time; none may take
    the whole budget from the nodes after it in a round."""
    assert workload.depth_timeout(120, 3) == 40
    assert workload.depth_timeout(600, 3) == 200
    assert workload.depth_timeout(120, 1) == 120
    assert workload.depth_timeout(120, 0) == 120


def test_the_depth_reader_hands_the_plugin_its_time() -> None:
    asked: list[tuple[str, str, float]] = []

    class Depths(BrokerPlugin):
        name, client_port, data_dir = "depths", 5999, "/d"

        def queue_depth(self, node: Any, queue: str, timeout: float) -> tuple[int, int]:
            asked.append((node.name, queue, timeout))
            return 0, 0

    nodes = {"n1": types.SimpleNamespace(name="n1")}
    depth = workload.queue_depth_reader(Depths(), nodes, 40.0)

    async def ask() -> object:
        return await depth("n1", "chaos-1")

    assert asyncio.run(ask()) == (0, 0)
    assert asked == [("n1", "chaos-1", 40.0)]
