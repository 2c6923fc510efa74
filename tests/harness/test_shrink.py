"""The shrink search against pure oracles: ddmin, each pass's candidates, the budget, the refusals.

The oracle here is a function of the schedule (a stand-in for "does the broker still lose
messages"): it makes the search's decisions checkable exactly, without a cluster.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.nemesis import PlannedFault
from harness.shrink import (
    MIN_RATE,
    TAIL,
    OutOfBudget,
    Schedule,
    ddmin,
    node_names,
    search,
    shrink_cluster,
    without_node,
)


@given(
    st.integers(1, 24).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1)))
)
def test_ddmin_finds_exactly_the_needed_items(case: tuple[int, set[int]]) -> None:
    n, needed = case
    asked: list[tuple[int, ...]] = []

    def fails(sub: list[int]) -> bool:
        asked.append(tuple(sub))
        return needed <= set(sub)

    assert ddmin(list(range(n)), fails) == sorted(needed)
    assert len(asked) == len(set(asked)), "a subset was asked twice"


def test_ddmin_of_one_needed_item_in_eight_takes_few_questions() -> None:
    asked: list[list[str]] = []
    items = [f"f{i}" for i in range(1, 9)]

    def fails(sub: list[str]) -> bool:
        asked.append(sub)
        return "f6" in sub

    assert ddmin(items, fails) == ["f6"]
    assert len(asked) <= 2 * 3  # halving: two questions per level at most
    assert asked[0] == ["f1", "f2", "f3", "f4"] and asked[1] == ["f5", "f6", "f7", "f8"]


def test_ddmin_keeps_an_interaction_of_two() -> None:
    # Neither half fails alone: ddmin must go finer and use complements.
    got = ddmin(list("abcdefgh"), lambda sub: "b" in sub and "g" in sub)
    assert got == ["b", "g"]


def test_without_node() -> None:
    assert without_node({"node": "n1"}, "n1") is None  # the action needs its target
    assert without_node({"order": ["n1", "n2", "n3"]}, "n2") == {"order": ["n1", "n3"]}
    cuts = {
        "shape": "x",
        "cuts": [["n1", "n3"], ["n3", "n1"], ["n1", "n2"], ["n2", "n1"]],
        "groups": [["n1"], ["n2", "n3"]],
        "sees": {"n1": ["n1", "n2"], "n3": ["n3"]},
    }
    assert without_node(cuts, "n3") == {
        "shape": "x",
        "cuts": [["n1", "n2"], ["n2", "n1"]],
        "groups": [["n1"]],
        "sees": {"n1": ["n1", "n2"]},
    }
    assert without_node({"cuts": [["n1", "n3"]]}, "n3") is None  # nothing left to cut
    assert without_node({"torn": True}, "n1") is None  # nothing to take out
    assert node_names({"a": [["n1", "x"]], "n12": 1, "b": "n2x"}) == {"n1", "n12"}


def _step(fid: str, at: float, hold: float | None, kind: str, **params: object) -> PlannedFault:
    return PlannedFault(fid, at, hold, kind, dict(params))


ORIGINAL = Schedule(
    steps=(
        _step("f1", 4.0, 6.0, "a", cuts=[["n1", "n2"], ["n2", "n1"], ["n1", "n3"], ["n3", "n1"]]),
        _step("f2", 8.0, 5.0, "b", node="n2"),
        _step("f3", 12.0, 8.0, "c", node="n1"),
        _step("f4", 22.0, 4.0, "a", cuts=[["n2", "n3"], ["n3", "n2"]]),
    ),
    duration=30.0,
    rate=300.0,
    nodes=3,
)


def oracle(s: Schedule) -> bool:
    """Fails when f3 runs on n1 for at least 1.5 s inside the workload, at 20 msg/s or more, and f1
    cuts n1 from n2 (whatever else it cuts) before it."""
    byid = {p.fault_id: p for p in s.steps}
    f1, f3 = byid.get("f1"), byid.get("f3")
    if f1 is None or f3 is None or ["n1", "n2"] not in f1.params["cuts"]:
        return False
    return (
        f1.at < f3.at
        and (f3.hold or 0) >= 1.5
        and f3.at + (f3.hold or 0) <= s.duration
        and s.rate >= 20
        and s.nodes >= 2
    )


def test_search_reaches_the_smallest_failing_schedule() -> None:
    tried: list[tuple[Schedule, str]] = []

    def test(s: Schedule, what: str) -> bool:
        tried.append((s, what))
        return oracle(s)

    improved: list[Schedule] = []
    best, complete = search(ORIGINAL, test, on_best=improved.append)
    assert complete
    assert [p.fault_id for p in best.steps] == ["f1", "f3"]
    f1, f3 = best.steps
    assert f1.params["cuts"] == [["n1", "n2"], ["n2", "n1"]]  # n3 no longer touched
    assert f3.params == {"node": "n1"}
    assert f3.hold == 2.0  # 8 -> 4 -> 2; 1 no longer fails
    assert f1.hold == 1.0
    assert best.nodes == 2
    assert best.rate == 37.5  # 300 -> 150 -> 75 -> 37.5; 18.75 no longer fails
    assert best.rate / 2 < 20 and best.rate / 2 >= MIN_RATE
    # cut to just past the last heal, and everything moved earlier while it still failed
    assert best.duration == pytest.approx(max(p.at + (p.hold or 0) for p in best.steps) + TAIL)
    assert f1.at < ORIGINAL.steps[0].at and f3.at < ORIGINAL.steps[2].at
    assert f3.at - (f1.at + (f1.hold or 0)) < 1.0  # the idle time between them closed while it failed
    assert oracle(best)
    assert all(oracle(s) for s in improved) and improved[-1] == best
    sizes = [s.size() for s in improved]
    assert sizes == sorted(sizes, reverse=True)  # each best strictly simpler than the one before
    assert len({s.key() for s, _ in tried}) == len(tried)  # never the same schedule twice
    assert any(w.startswith("faults:") for _, w in tried) and any(w.startswith("rate:") for _, w in tried)


def test_search_finds_that_no_fault_is_needed() -> None:
    best, _ = search(ORIGINAL, lambda s, w: True, passes=("faults",))
    assert best.steps == ()


def test_search_stops_at_the_budget_with_the_best_so_far() -> None:
    calls = 0

    def test(s: Schedule, what: str) -> bool:
        nonlocal calls
        calls += 1
        if calls > 8:  # the eighth question, {f1, f3, f4}, is the first that still fails
            raise OutOfBudget
        return oracle(s)

    best, complete = search(ORIGINAL, test)
    assert not complete
    assert calls == 9
    assert [p.fault_id for p in best.steps] == ["f1", "f3", "f4"] and oracle(best)


def test_cluster_keeps_the_nodes_the_settings_name() -> None:
    s = Schedule(steps=(_step("f1", 1.0, 1.0, "k", node="n1"),), duration=5.0, rate=10.0, nodes=3)
    asked: list[int] = []

    def test(c: Schedule, what: str) -> bool:
        asked.append(c.nodes)
        return True

    assert shrink_cluster(s, test, {"ha_params": ["rabbit@n1", "rabbit@n2"]}).nodes == 2
    assert shrink_cluster(s, test, {}).nodes == 1
    assert asked == [2, 1]


EXE = shutil.which("brokerchaos")


@pytest.mark.skipif(EXE is None, reason="the brokerchaos command is not installed")
@pytest.mark.parametrize("verdict", ["durable", "unknown"])
def test_shrink_refuses_a_run_that_did_not_fail(tmp_path: Path, verdict: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "scenario.json").write_text(
        json.dumps({"scenario": {"name": "x", "broker": {"plugin": "reference"}}})
    )
    (run / "history.jsonl").write_text("")
    (run / "results.json").write_text(json.dumps({"verdict": verdict, "valid": verdict == "durable"}))
    assert EXE is not None
    r = subprocess.run([EXE, "shrink", str(run)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"brokerchaos: {run} is {verdict}, not a failure: shrink takes a run whose "
        "verdict is LOST or INTEGRITY"
    ]


def test_the_shrink_report_names_the_class_of_the_missing_and_a_capped_count() -> None:
    """A run whose drain did not complete: its 1,500 missing messages are unreachable, not lost,
    and the per-fault count over the 2 listed ones is said to be a lower bound."""
    from harness.shrink_report import _results_block
    from harness.shrink_run import _summary

    message = {
        "id": "p1:1",
        "confirm_node": "n1",
        "confirm_ns": 1,
        "fault_ids": ["f1"],
        "fault_kinds": ["kill"],
    }
    results = {
        "verdict": "UNAVAILABLE",
        "reason": "n1 did not come back",
        "counts": {"confirmed": 2000, "lost": 0, "unreachable": 1500},
        "attribution": {
            "rows": [{"fault_kind": "kill", "node": "n1", "count": 1500}],  # made before rows had a class
            "messages": [message, message | {"id": "p1:2"}],
        },
    }
    summary = _summary(results)
    assert summary is not None
    assert (summary["missing_as"], summary["missing"], summary["lost_listed"]) == ("unreachable", 1500, 2)
    assert summary["attribution"] == [
        {"fault_kind": "kill", "node": "n1", "count": 1500, "status": "unreachable"}
    ]
    page = _results_block("minimal", summary, [{"fault_id": "f1", "kind": "kill"}])
    assert "2 of the 2 unreachable messages listed (of 1,500: a lower bound) were confirmed" in page
    assert "<td>unreachable</td><td>1,500</td>" in page and "lost messages" not in page
