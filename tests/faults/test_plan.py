"""Nemesis planning: seeded schedules, validation before anything starts, replay from a history."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.errors import FaultError, ScenarioError
from harness.history import Recorder, read_jsonl
from harness.host import Host
from harness.nemesis import (
    Fault,
    FaultContext,
    Nemesis,
    Plan,
    PlannedFault,
    check_capabilities,
    plan,
    plan_from_history,
)
from harness.scenario import Scenario
from tests.factories import reference_scenario

NODES3 = ["n1", "n2", "n3"]


@pytest.fixture(scope="module")
def faults() -> Mapping[str, type[Fault]]:
    return Host.load().registry.faults


RANDOM = {"random": {"faults": ["partition", "kill", "pause"], "every": [2, 6], "hold": [1, 4]}}


def test_same_seed_same_plan(faults: Mapping[str, type[Fault]]) -> None:
    a = plan(reference_scenario(RANDOM, seed=5), faults, NODES3)
    b = plan(reference_scenario(RANDOM, seed=5), faults, NODES3)
    assert a.to_list() == b.to_list()
    assert len(a.steps) > 10


def test_different_seed_different_plan(faults: Mapping[str, type[Fault]]) -> None:
    plans = {json.dumps(plan(reference_scenario(RANDOM, seed=s), faults, NODES3).to_list()) for s in range(5)}
    assert len(plans) == 5


def test_random_steps_stay_inside_the_workload_and_do_not_overlap(faults: Mapping[str, type[Fault]]) -> None:
    for seed in range(20):
        p = plan(reference_scenario(RANDOM, seed=seed, duration=60), faults, NODES3)
        assert p.steps and all(0 < s.at < 60 for s in p.steps)
        for prev, nxt in zip(p.steps, p.steps[1:], strict=False):
            assert prev.hold is not None and 1 <= prev.hold <= 4
            assert nxt.at - (prev.at + prev.hold) >= 2 - 1e-3  # the gap is drawn from every
        assert {s.kind for s in p.steps} <= {"partition", "kill", "pause"}
        assert [s.fault_id for s in p.steps] == [f"f{i}" for i in range(1, len(p.steps) + 1)]


def test_random_params_per_fault_reach_resolve(faults: Mapping[str, type[Fault]]) -> None:
    nem = {
        "random": {
            "faults": ["partition"],
            "every": 5,
            "hold": 1,
            "params": {"partition": {"shape": "isolate", "node": "n2"}},
        }
    }
    p = plan(reference_scenario(nem, duration=30), faults, NODES3)
    assert p.steps and all(s.params["groups"] == [["n2"], ["n1", "n3"]] for s in p.steps)


def test_explicit_steps_sorted_and_resolved(faults: Mapping[str, type[Fault]]) -> None:
    nem = {
        "schedule": [
            {"at": 30, "fault": "pause", "params": {"node": "n3"}, "hold": 5},
            {"at": 10, "fault": "kill", "hold": 2},
            {"at": 20, "fault": "partition", "params": {"shape": "fixed-halves"}},
        ]
    }
    p = plan(reference_scenario(nem), faults, NODES3)
    assert [(s.fault_id, s.at, s.kind, s.hold) for s in p.steps] == [
        ("f1", 10.0, "kill", 2.0),
        ("f2", 20.0, "partition", None),
        ("f3", 30.0, "pause", 5.0),
    ]
    assert p.steps[0].params["node"] in NODES3  # drawn from the step's own seeded RNG
    assert p.steps[1].params["groups"] == [["n1"], ["n2", "n3"]]
    assert p.steps[2].params == {"node": "n3"}
    assert plan(reference_scenario(nem), faults, NODES3).to_list() == p.to_list()


def test_explicit_and_random_steps_merge_in_time_order(faults: Mapping[str, type[Fault]]) -> None:
    nem = {"schedule": [{"at": 7.5, "fault": "kill"}], **RANDOM}
    p = plan(reference_scenario(nem, duration=30), faults, NODES3)
    ats = [s.at for s in p.steps]
    assert ats == sorted(ats) and 7.5 in ats


@pytest.mark.parametrize(
    ("nemesis", "needle"),
    [
        ({"schedule": [{"at": 1, "fault": "meteor"}]}, "nemesis: unknown fault 'meteor'; available: "),
        ({"random": {"faults": ["kill", "meteor"]}}, "nemesis: unknown fault 'meteor'"),
    ],
)
def test_unknown_fault_is_a_scenario_error(
    faults: Mapping[str, type[Fault]], nemesis: dict[str, Any], needle: str
) -> None:
    sc = reference_scenario(nemesis)
    with pytest.raises(ScenarioError, match=needle):
        plan(sc, faults, NODES3)
    with pytest.raises(ScenarioError, match=needle):
        check_capabilities(sc, faults, frozenset({"kill"}), "reference")


def test_missing_capability_is_a_scenario_error(faults: Mapping[str, type[Fault]]) -> None:
    sc = reference_scenario({"schedule": [{"at": 1, "fault": "power-loss"}, {"at": 2, "fault": "kill"}]})
    with pytest.raises(ScenarioError) as e:
        check_capabilities(sc, faults, frozenset({"kill", "partition"}), "toy")
    assert "'power-loss'" in str(e.value) and "['power-loss']" in str(e.value) and "'toy'" in str(e.value)
    check_capabilities(sc, faults, frozenset({"kill", "power-loss"}), "toy")  # declared: fine


@pytest.mark.parametrize(
    ("fault", "params", "needle"),
    [
        ("kill", {"nod": "n1"}, "fault kill: unknown parameter 'nod'; allowed: node"),
        ("kill", {"node": "n7"}, "fault kill: node 'n7' is not one of"),
        ("kill", {"node": 1}, "fault kill: node expects str, got 1"),
        (
            "partition",
            {"shape": "triangle"},
            "fault partition: shape 'triangle' is not allowed; use one of isolate",
        ),
        (
            "partition",
            {"mode": "blackhole"},
            "fault partition: mode 'blackhole' is not allowed; use one of drop, refuse",
        ),
        ("degrade", {"type": "reset_peer", "toxicity": 0.5}, "degrade: reset_peer resets every connection"),
        ("degrade", {"type": "jitter"}, "fault degrade: type 'jitter' is not allowed"),
        (
            "degrade",
            {"links": "everything"},
            "fault degrade: links 'everything' is not allowed; use one of peers",
        ),
        ("degrade", {"stream": "sideways"}, "fault degrade: stream 'sideways' is not allowed"),
        ("degrade", {"toxicity": "half"}, "fault degrade: toxicity expects float, got 'half'"),
        ("degrade", {"attributes": [1]}, "fault degrade: attributes expects dict"),
        ("degrade", {"node": "n9"}, "degrade: node 'n9' is not one of"),
        ("power-loss", {"torn": "yes"}, "fault power-loss: torn expects bool, got 'yes'"),
        (
            "power-loss",
            {"torn": True, "torn_seed": True},
            "fault power-loss: torn_seed expects int, got True",
        ),
        ("rolling-restart", {"order": ["n1", "n8"]}, "fault rolling-restart: order names ['n8']"),
    ],
)
def test_fault_parameters_are_checked_when_planning(
    faults: Mapping[str, type[Fault]], fault: str, params: dict[str, Any], needle: str
) -> None:
    sc = reference_scenario({"schedule": [{"at": 1, "fault": fault, "params": params}]})
    with pytest.raises(ScenarioError) as e:
        plan(sc, faults, NODES3)
    assert needle in str(e.value)


def test_valid_parameters_pass(faults: Mapping[str, type[Fault]]) -> None:
    sc = reference_scenario(
        {
            "schedule": [
                {
                    "at": 1,
                    "fault": "degrade",
                    "params": {"toxicity": 1, "type": "bandwidth", "attributes": {"rate": 8}},
                },
                {"at": 2, "fault": "power-loss", "params": {"torn": True, "node": "n2"}, "hold": 0.5},
                {"at": 3, "fault": "rolling-restart", "params": {"order": ["n3", "n1", "n2"]}},
            ]
        }
    )
    p = plan(sc, faults, NODES3)
    assert p.steps[0].params["toxicity"] == 1.0 and p.steps[0].params["attributes"] == {"rate": 8}
    assert isinstance(p.steps[1].params["torn_seed"], int)
    assert p.steps[2].params == {"order": ["n3", "n1", "n2"]}


# -- running a plan and replaying it from the history --------------------------------------------


class Mark(Fault):
    """A fault kind that only remembers what it was asked to do (stands in for Docker and Toxiproxy)."""

    name = "mark"
    params_schema = {"node": str, "fail": bool}
    log: list[tuple[str, str]] = []

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        return {
            "node": params.get("node") or rng.choice(list(nodes)),
            "fail": bool(params.get("fail", False)),
        }

    def apply(self) -> dict[str, Any]:
        Mark.log.append(("apply", self.params["node"]))
        if self.params["fail"]:
            raise OSError("link already cut")
        return {"marked": self.params["node"]}

    def heal(self) -> dict[str, Any]:
        Mark.log.append(("heal", self.params["node"]))
        return {"unmarked": self.params["node"]}


class NodesOnly:
    """The one thing a FaultContext reads from a cluster when faults do not touch Docker."""

    class topology:  # noqa: N801 - mirrors Cluster.topology
        nodes = tuple(NODES3)


def _run(
    p: Plan, path: Path, duration: float, final_heal: Any = lambda: {"reset": True}
) -> list[dict[str, Any]]:
    Mark.log.clear()
    rec = Recorder(path)
    ops: list[dict[str, Any]] = []
    nem = Nemesis(
        p,
        {"mark": Mark},
        FaultContext(NodesOnly()),
        rec,
        settle=0.0,
        final_heal=final_heal,
        on_fault=ops.append,
    )
    try:
        asyncio.run(nem(duration))
    finally:
        rec.close()
    return ops


def test_nemesis_applies_heals_and_records_then_replay_reproduces_it(tmp_path: Path) -> None:
    sc = reference_scenario(
        {
            "schedule": [
                {"at": 0.05, "fault": "mark", "params": {"node": "n2"}, "hold": 0.1},
                {"at": 0.2, "fault": "mark", "params": {"node": "n3", "fail": True}, "hold": 0.05},
                {"at": 0.3, "fault": "mark", "params": {"node": "n1"}},  # healed only by the final heal
            ]
        },
        duration=1,
    )
    p = plan(sc, {"mark": Mark}, NODES3)
    ops = _run(p, tmp_path / "h.jsonl", duration=0.4)
    assert Mark.log == [
        ("apply", "n2"),
        ("heal", "n2"),
        ("apply", "n3"),
        ("heal", "n3"),
        ("apply", "n1"),
        ("heal", "n1"),
    ]
    assert [(o["f"], o["type"]) for o in ops] == [
        ("mark", "ok"),
        ("heal", "ok"),
        ("mark", "info"),
        ("heal", "ok"),
        ("mark", "ok"),
        ("heal", "ok"),
        ("heal", "ok"),
    ]
    assert "link already cut" in ops[2]["error"]
    assert json.loads(ops[0]["value"])["done"] == {"marked": "n2"}
    assert json.loads(ops[-1]["value"])["final"] is True
    records = list(read_jsonl(tmp_path / "h.jsonl"))
    assert all(r["process"] == "nemesis" for r in records)
    assert [r["node"] for r in records if r["f"] == "mark" and r["type"] == "invoke"] == ["n2", "n3", "n1"]

    replay = plan_from_history(tmp_path / "h.jsonl")
    assert [(s.fault_id, s.kind, s.params) for s in replay.steps] == [
        (s.fault_id, s.kind, s.params) for s in p.steps
    ]
    # Recorded times say when things happened: never before the plan, however late a busy machine ran it.
    for want, got in zip(p.steps[:2], replay.steps[:2], strict=True):
        assert want.hold is not None and got.hold is not None
        assert want.at <= got.at and got.at + got.hold >= want.at + want.hold - 0.002, (want, got)
    assert p.steps[2].at <= replay.steps[2].at
    assert replay.steps[2].hold is None  # the final heal is not part of the schedule

    # The replayed plan runs the same faults again.
    ops2 = _run(replay, tmp_path / "h2.jsonl", duration=0.4)
    assert [(o["f"], o["type"]) for o in ops2] == [(o["f"], o["type"]) for o in ops]


def test_plan_from_a_history_without_faults(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "h.jsonl")
    rec.invoke("p1", "publish", value="p1:1").ok()
    rec.close()
    assert plan_from_history(tmp_path / "h.jsonl").steps == []


def test_failed_final_heal_is_recorded_and_raised(tmp_path: Path) -> None:
    def broken() -> dict[str, Any]:
        raise OSError("sidecar gone")

    p = Plan([PlannedFault("f1", 0.0, None, "mark", {"node": "n1", "fail": False})])
    with pytest.raises(FaultError, match="final heal failed: sidecar gone"):
        _run(p, tmp_path / "h.jsonl", duration=0.05, final_heal=broken)
    last = list(read_jsonl(tmp_path / "h.jsonl"))[-1]
    assert (last["f"], last["type"]) == ("heal", "info") and "sidecar gone" in last["error"]
    assert Mark.log == [("apply", "n1"), ("heal", "n1")]


def _two_partitions(first: dict[str, Any], second: dict[str, Any], second_at: float) -> Scenario:
    return reference_scenario(
        {
            "schedule": [
                {"at": 5, "fault": "partition", "hold": 10, "params": first},
                {"at": second_at, "fault": "partition", "hold": 10, "params": second},
            ]
        }
    )


@pytest.mark.parametrize("first", [{"shape": "halves", "mode": "refuse"}, {"shape": "clients"}])
def test_a_proxy_switching_partition_may_not_overlap_another(
    faults: Mapping[str, type[Fault]], first: dict[str, Any]
) -> None:
    with pytest.raises(
        ScenarioError, match=r"f1 \(partition at 5s\) and f2 \(partition at 8s\) are held at the same time"
    ):
        plan(_two_partitions(first, {"shape": "isolate"}, 8), faults, NODES3)


def test_overlapping_drop_partitions_and_back_to_back_switching_ones_are_planned(
    faults: Mapping[str, type[Fault]],
) -> None:
    assert (
        len(plan(_two_partitions({"shape": "isolate"}, {"shape": "one-way"}, 8), faults, NODES3).steps) == 2
    )
    refuse = {"shape": "halves", "mode": "refuse"}
    assert len(plan(_two_partitions(refuse, refuse, 15), faults, NODES3).steps) == 2


# -- combined schedules: several kinds held at once where the mechanisms allow ------------------

COMBINED = {
    "random": {
        "faults": ["partition", "kill", "pause", "power-loss"],
        "every": [1, 3],
        "hold": [3, 8],
        "overlap": 3,
    }
}


def _windows_overlap(a: PlannedFault, b: PlannedFault) -> bool:
    assert a.hold is not None and b.hold is not None
    return a.at < b.at + b.hold and b.at < a.at + a.hold


def test_combined_schedules_overlap_without_sharing_a_node_resource(
    faults: Mapping[str, type[Fault]],
) -> None:
    overlapping = 0
    for seed in range(30):
        p = plan(reference_scenario(COMBINED, seed=seed, duration=60), faults, NODES3)
        assert (
            p.to_list()
            == plan(reference_scenario(COMBINED, seed=seed, duration=60), faults, NODES3).to_list()
        )
        for i, a in enumerate(p.steps):
            held_then = [b for b in p.steps if b.hold is not None and b.at <= a.at < b.at + b.hold]
            assert len(held_then) <= 3, (seed, a, held_then)  # overlap: 3 at most at once
            for b in p.steps[i + 1 :]:
                if _windows_overlap(a, b):
                    overlapping += 1
                    holds = faults[a.kind].holds(a.params, NODES3) & faults[b.kind].holds(b.params, NODES3)
                    assert not holds, (seed, a, b)
    assert overlapping > 30  # they do overlap: a pause during a partition, a kill of n1 while n2 is paused


def test_overlap_one_keeps_the_sequential_plan(faults: Mapping[str, type[Fault]]) -> None:
    """Scenarios written before overlap existed plan exactly as before."""
    one = {"random": {**RANDOM["random"], "overlap": 1}}
    assert (
        plan(reference_scenario(one, seed=3), faults, NODES3).to_list()
        == plan(reference_scenario(RANDOM, seed=3), faults, NODES3).to_list()
    )


def test_an_explicit_overlap_of_one_nodes_process_is_refused_saying_why(
    faults: Mapping[str, type[Fault]],
) -> None:
    sc = reference_scenario(
        {
            "schedule": [
                {"at": 5, "fault": "pause", "hold": 10, "params": {"node": "n2"}},
                {"at": 8, "fault": "kill", "hold": 3, "params": {"node": "n2"}},
            ]
        }
    )
    with pytest.raises(
        ScenarioError, match=r"f1 \(pause at 5s\) and f2 \(kill at 8s\).*both hold process of n2"
    ):
        plan(sc, faults, NODES3)
    fine = reference_scenario(
        {
            "schedule": [
                {"at": 5, "fault": "pause", "hold": 10, "params": {"node": "n2"}},
                {"at": 8, "fault": "kill", "hold": 3, "params": {"node": "n3"}},
                {"at": 6, "fault": "partition", "hold": 6, "params": {"shape": "isolate", "node": "n2"}},
            ]
        }
    )
    assert len(plan(fine, faults, NODES3).steps) == 3


def test_overlap_is_validated() -> None:
    with pytest.raises(ScenarioError, match="nemesis.random.overlap"):
        reference_scenario({"random": {**COMBINED["random"], "overlap": 0}})


def test_random_draws_leave_room_for_the_scheduled_steps_after_them(
    faults: Mapping[str, type[Fault]],
) -> None:
    """A draw that would still be held when a later scheduled step starts on the same resource
    (a kill of n2 drawn before the scheduled kill of n2) is replaced, not planned into a refusal."""
    nemesis = {
        "schedule": [
            {"at": 15, "fault": "kill", "params": {"node": "n1"}, "hold": 3},
            {"at": 15, "fault": "kill", "params": {"node": "n2"}, "hold": 3},
            {"at": 20, "fault": "member-remove", "params": {"node": "n3"}, "hold": 10},
        ],
        "random": {
            "faults": ["kill", "member-remove", "partition"],
            "every": [3, 9],
            "hold": [4, 10],
            "overlap": 2,
        },
    }
    for seed in range(40):
        steps = plan(
            reference_scenario(nemesis, seed=seed, duration=60), faults, NODES3
        ).steps  # no ScenarioError
        for i, a in enumerate(steps):
            for b in steps[i + 1 :]:
                if _windows_overlap(a, b):
                    assert not faults[a.kind].holds(a.params, NODES3) & faults[b.kind].holds(b.params, NODES3)
