"""The explore search without Docker: mutations, the corpus, the loop, and the coverage cells.

The search is run against a pure oracle (a function of the schedule), as ``harness.shrink``'s
search is tested: a schedule "fails" when a power loss starts while a slow fsync is held, the
overlap the seeded random nemesis never draws.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from harness.errors import BrokerChaosError
from harness.explore import (
    Corpus,
    Mutator,
    Outcome,
    Search,
    normalise,
    pairs_in,
    pool_of,
    valid,
    values_in,
)
from harness.explore_cells import fault_shapes, run_cells, targets, window_events, workload_features
from harness.host import Host
from harness.nemesis import PlannedFault, plan
from harness.scenario import from_dict
from harness.shrink import Schedule

SCENARIO = {
    "name": "pl-random",
    "seed": 21,
    "broker": {"plugin": "reference", "nodes": 1, "settings": {"flush": "sync"}},
    "workload": {"producers": 2, "consumers": 0, "rate": 300, "duration": 20},
    "nemesis": {
        "random": {
            "faults": ["power-loss", "slow-fsync"],
            "every": [2, 5],
            "hold": [2, 4],
            "params": {"slow-fsync": {"nodes": "all", "delay_ms": 100}},
        }
    },
}


@pytest.fixture(scope="module")
def faults():
    return Host.load([]).registry.faults


def start(faults, scenario=SCENARIO, nodes=1) -> Schedule:
    sc = from_dict(scenario)
    names = [f"n{i}" for i in range(1, nodes + 1)]
    return Schedule(tuple(plan(sc, faults, names).steps), sc.workload.duration, sc.workload.rate, nodes)


def held_under(s: Schedule, under: str, kind: str) -> bool:
    return any(
        p.kind == kind
        and any(q.kind == under and q.at <= p.at < q.at + (q.hold or s.duration) for q in s.steps)
        for p in s.steps
    )


def oracle(s: Schedule, how: str, iteration: int) -> Outcome:
    """Cells: each action's kind and what it started under; LOST for a power loss under a slow fsync."""
    cells = set()
    for p in s.steps:
        under = sorted(
            {q.kind for q in s.steps if q is not p and q.at <= p.at < q.at + (q.hold or s.duration)}
        )
        cells.add(f"backlog | {p.kind}[]" + (f" under={'+'.join(under)}" if under else "") + " | applied")
    lost = held_under(s, "slow-fsync", "power-loss")
    return Outcome("LOST" if lost else "durable", cells, f"run-{iteration}", 60.0)


class Clock:
    """Each look at the time is one simulated minute later: the budget counts looks, not seconds."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 60.0
        return self.t


# -- mutations -----------------------------------------------------------------------------------


def test_the_random_nemesis_never_holds_the_two_kinds_together(faults) -> None:
    for seed in range(50):
        s = start(faults, {**SCENARIO, "seed": seed})
        assert not held_under(s, "slow-fsync", "power-loss"), seed


def test_mutants_are_valid_renumbered_and_repeat_with_the_seed(faults) -> None:
    s = start(faults)
    pool = pool_of(from_dict(SCENARIO), faults)
    made = 0
    for seed in range(40):
        a = Mutator(faults, pool, random.Random(seed)).mutate(s, s, ["n1"])
        b = Mutator(faults, pool, random.Random(seed)).mutate(s, s, ["n1"])
        assert a == b
        if a is None:
            continue  # no operator applied, or the stack undid itself: ``propose`` draws again
        made += 1
        m = a[0]
        assert valid(m, faults, ["n1"])
        assert [p.fault_id for p in m.steps] == [f"f{i}" for i in range(1, len(m.steps) + 1)]
        assert [p.at for p in m.steps] == sorted(p.at for p in m.steps)
        assert all(1.0 <= p.at < m.duration for p in m.steps)
        assert m.key() != s.key()
    assert made >= 35


def test_overlap_aims_at_the_pair_of_kinds_never_held_together(faults) -> None:
    s = start(faults)
    pool = pool_of(from_dict(SCENARIO), faults)
    seen = {("power-loss", "slow-fsync"), ("slow-fsync", "slow-fsync"), ("power-loss", "power-loss")}
    for seed in range(20):
        got = Mutator(faults, pool, random.Random(seed), seen).overlap(s, None)
        assert got is not None
        m = normalise(got[0])
        if valid(m, faults, ["n1"]):
            assert held_under(m, "slow-fsync", "power-loss"), got[1]


def test_two_power_losses_of_one_node_are_never_held_together(faults) -> None:
    s = Schedule(
        (
            PlannedFault("f1", 2.0, 5.0, "power-loss", {"node": "n1"}),
            PlannedFault("f2", 3.0, 1.0, "power-loss", {"node": "n1"}),
        ),
        20.0,
        300.0,
        1,
    )
    assert not valid(s, faults, ["n1"])
    assert valid(s.with_step(1, at=8.0), faults, ["n1"])


def test_node_moves_a_target_within_the_cluster_and_needs_two_nodes(faults) -> None:
    kill = PlannedFault("f1", 2.0, 3.0, "kill", {"node": "n2"})
    three = Schedule((kill,), 20.0, 100.0, 3)
    for seed in range(10):
        got = Mutator(faults, {"kill": {}}, random.Random(seed)).node(three, None)
        assert got is not None
        assert got[0].steps[0].params["node"] in {"n1", "n3"}
    assert Mutator(faults, {"kill": {}}, random.Random(0)).node(three.replace(nodes=1), None) is None


def test_node_swaps_two_nodes_so_a_partition_stays_a_partition(faults) -> None:
    """A partition names every node: renaming n3 to n1 made groups [[n1], [n2, n1]] and a cut [n1, n1]."""
    s = start(faults, ISOLATE, nodes=3)
    for seed in range(20):
        got = Mutator(faults, {}, random.Random(seed)).node(s, None)
        assert got is not None
        params = got[0].steps[0].params
        groups = params["groups"]
        assert sorted(n for g in groups for n in g) == ["n1", "n2", "n3"], got[1]
        assert all(len(set(c)) == 2 for c in params["cuts"]), got[1]
        assert valid(got[0], faults, ["n1", "n2", "n3"])


def test_shape_changes_a_parameter_of_the_kind_and_resolves_it_again(faults) -> None:
    s = Schedule((PlannedFault("f1", 2.0, 3.0, "power-loss", {"node": "n1"}),), 20.0, 300.0, 1)
    got = Mutator(faults, {"power-loss": {}}, random.Random(1)).shape(s, None)
    assert got is not None
    params = got[0].steps[0].params
    assert params["torn"] is True and isinstance(params["torn_seed"], int) and params["node"] == "n1"


def test_shape_sets_a_value_no_run_has_shown_first(faults) -> None:
    partition = PlannedFault("f1", 2.0, 3.0, "partition", {"shape": "isolate", "mode": "drop", "node": "n1"})
    s = Schedule((partition,), 20.0, 100.0, 3)
    shown = {("partition", f"shape={v}") for v in ("isolate", "halves", "fixed-halves", "majorities-ring")}
    shown |= {("partition", f"shape={v}") for v in ("bridge", "one-way", "clients", "random")}
    made = []
    for seed in range(10):
        got = Mutator(faults, {"partition": {}}, random.Random(seed), seen_values=shown).shape(s, None)
        if got is not None:  # mode refuse, or shape custom (which needs cuts: not resolved, None)
            made.append(got[1])
    assert made and set(made) == {"shape f1 mode=refuse"}


def test_remove_keeps_one_action_and_splice_joins_two_schedules(faults) -> None:
    one = Schedule((PlannedFault("f1", 2.0, 3.0, "kill", {"node": "n1"}),), 20.0, 100.0, 1)
    assert Mutator(faults, {}, random.Random(0)).remove(one, None) is None
    a = start(faults)
    b = start(faults, {**SCENARIO, "seed": 3})
    got = Mutator(faults, {}, random.Random(2)).splice(a, b)
    assert got is not None
    cut = float(got[1].split()[-1].rstrip("s"))
    assert all(p in a.steps for p in got[0].steps if p.at < cut)
    assert all(p in b.steps for p in got[0].steps if p.at >= cut)


def test_the_pool_is_the_scenarios_kinds_with_its_parameters_and_extras(faults) -> None:
    sc = from_dict(
        {
            **SCENARIO,
            "nemesis": {"schedule": [{"at": 2, "fault": "power-loss", "hold": 2, "params": {"torn": True}}]},
        }
    )
    assert pool_of(sc, faults, ["slow-fsync"]) == {"power-loss": {"torn": True}, "slow-fsync": {}}
    with pytest.raises(Exception, match="unknown fault 'nope'"):
        pool_of(sc, faults, ["nope"])


# -- the search ----------------------------------------------------------------------------------


def test_the_search_finds_the_overlap_and_stops_at_the_failure(faults, tmp_path: Path) -> None:
    corpus = Corpus.open(tmp_path, "pl-random", 100)
    pool = pool_of(from_dict(SCENARIO), faults)
    search = Search(corpus, start(faults), faults, pool, oracle, budget_s=3600, clock=Clock())
    out = search.run()
    assert out is not None and out.verdict == "LOST" and search.finished == "failure"
    assert corpus.runs[0]["how"] == "the scenario's schedule" and corpus.runs[0]["verdict"] == "durable"
    assert corpus.failure is not None and corpus.failure["iteration"] == len(corpus.runs)
    assert held_under(Schedule.from_dict(corpus.failure["schedule"]), "slow-fsync", "power-loss")
    data = json.loads((tmp_path / "corpus.json").read_text())
    assert data["failure"]["verdict"] == "LOST"
    # Every kept schedule reached a cell first; every cell names the run that reached it first.
    firsts = {c: r for c, r in data["cells"].items()}
    for e in data["entries"]:
        assert e["new"] and all(e["new"]) and set(e["new"]) <= set(e["cells"])
    assert set(firsts.values()) <= {f"run {r['iteration']}" for r in data["runs"]}


def test_a_later_search_continues_the_corpus_and_repeats_with_the_seed(faults, tmp_path: Path) -> None:
    pool = pool_of(from_dict(SCENARIO), faults)

    def durable(s: Schedule, how: str, i: int) -> Outcome:
        return dataclasses.replace(oracle(s, how, i), verdict="durable")

    runs = []
    for d in ("a", "b"):
        corpus = Corpus.open(tmp_path / d, "pl-random", 7)
        Search(corpus, start(faults), faults, pool, durable, budget_s=3600, max_runs=3, clock=Clock()).run()
        again = Corpus.open(tmp_path / d, "pl-random", 7)
        assert again.iteration == 3 and again.cells == corpus.cells
        search = Search(again, start(faults), faults, pool, durable, budget_s=3600, max_runs=2, clock=Clock())
        search.run()
        assert search.finished == "runs"
        runs.append(json.loads((tmp_path / d / "corpus.json").read_text())["runs"])
    assert [r["iteration"] for r in runs[0]] == [1, 2, 3, 4, 5]
    assert len({json.dumps(r["schedule"], sort_keys=True) for r in runs[0]}) == 5  # nothing run twice
    assert [r["schedule"] for r in runs[0]] == [r["schedule"] for r in runs[1]]
    with pytest.raises(BrokerChaosError, match="holds the corpus of scenario 'pl-random'"):
        Corpus.open(tmp_path / "a", "other", 7)


def test_the_budget_stops_the_search_between_runs(faults, tmp_path: Path) -> None:
    corpus = Corpus.open(tmp_path, "pl-random", 1)
    pool = pool_of(from_dict(SCENARIO), faults)

    def durable(s: Schedule, how: str, i: int) -> Outcome:
        return Outcome("durable", set(), None, 60.0)

    search = Search(corpus, start(faults), faults, pool, durable, budget_s=5 * 60, clock=Clock())
    assert search.run() is None and search.finished == "budget"
    assert 1 <= corpus.iteration < 5 and corpus.entries == []


def test_runs_that_cannot_run_are_not_failures_and_three_in_a_row_stop(faults, tmp_path: Path) -> None:
    corpus = Corpus.open(tmp_path, "pl-random", 1)
    pool = pool_of(from_dict(SCENARIO), faults)

    def broken(s: Schedule, how: str, i: int) -> Outcome:
        return Outcome("error", set(), None, 1.0, "image does not build")

    search = Search(corpus, start(faults), faults, pool, broken, budget_s=3600, clock=Clock())
    with pytest.raises(
        BrokerChaosError, match="3 runs in a row could not run; the last: image does not build"
    ):
        search.run()
    assert [r["verdict"] for r in corpus.runs] == ["error"] * 3 and corpus.failure is None


def test_schedules_round_trip_through_the_corpus_file(faults) -> None:
    s = start(faults)
    assert Schedule.from_dict(json.loads(json.dumps(s.to_dict()))) == s


# -- cells -----------------------------------------------------------------------------------------

NS = 1_000_000_000


def window(fid: str, kind: str, start: float, end: float, params: dict, hold: float) -> dict:
    return {
        "fault_id": fid,
        "kind": kind,
        "node": params.get("node"),
        "start_ns": int(start * NS),
        "end_ns": int(end * NS),
        "heal_start_ns": int((end - 0.1) * NS),
        "applied": True,
        "healed": True,
        "params": {"params": params, "hold": hold, "workload_start_s": 3.0},
    }


RESULTS = {
    "verdict": "LOST",
    "counts": {"recovered": 4, "duplicated": 0, "unknown": 2},
    "faults": [
        window("f1", "slow-fsync", 2.0, 9.0, {"nodes": ["n1"], "delay_ms": 100.0, "files": "*"}, 7.0),
        window("f2", "power-loss", 5.0, 7.0, {"node": "n1"}, 2.0),
        window("f3", "kill", 7.5, 8.0, {"node": "n2"}, 0.5),
    ],
    "availability": [
        {"window": "f1", "kind": "slow-fsync", "attempts": 100, "confirmed": 100, "share": 1.0},
        {"window": "f2", "kind": "power-loss", "attempts": 10, "confirmed": 0, "share": 0.0},
    ],
    "liveness": {
        "recovery": [
            {
                "fault_id": "f2",
                "kind": "power-loss",
                "queue": "chaos-1",
                "healed": True,
                "heal_ns": int(6.9 * NS),
                "recovered": True,
                "publish_demand": True,
                "publish_ok_ns": int(3 * NS),
                "consume_demand": False,
                "consume_ok_ns": None,
                "recovery_ns": int(3 * NS),
                "nodes": [{"node": "n1"}],
            }
        ],
        "windows": [{"kind": "publish", "fault_ids": ["f2"]}],
    },
    "attribution": {"messages": [{"id": "p1:3", "fault_ids": ["f1", "f2"]}]},
    "events": [{"name": "flush-timeout", "fault_ids": ["f1"]}],
}


def test_shapes_name_the_kind_target_overlap_and_recovery() -> None:
    shapes = fault_shapes(RESULTS, 3)
    assert shapes["f1"] == "slow-fsync[files=*]@one/clients"
    assert shapes["f2"] == "power-loss[]@one/clients under=slow-fsync:same"
    # f3 starts 0.6 s after f2's heal began, before its publishes came back (3 s), on a node no client used.
    assert shapes["f3"] == "kill[]@one/no-clients under=slow-fsync:other recovering=power-loss"


def test_events_per_window_and_for_the_run() -> None:
    ev = window_events(RESULTS)
    assert ev["f2"] == {"applied", "publish-down", "outage-publish", "lost"}
    assert ev["f1"] == {"applied", "publish-ok", "lost", "event=flush-timeout"}
    cells = run_cells({"workload": {"consumers": 0}, "broker": {"nodes": 3}}, RESULTS)
    shape = "power-loss[]@one/clients under=slow-fsync:same"
    assert f"backlog | {shape} | lost" in cells and "cluster | run | verdict=LOST" in cells
    assert "backlog | run | recovered>0" in cells and "backlog | run | duplicated>0" not in cells
    assert not any(c.endswith("verdict=LOST") and " run " not in c for c in cells)  # not one per window
    assert pairs_in(cells) == {("slow-fsync", "power-loss"), ("slow-fsync", "kill")}
    assert values_in(cells) == {("slow-fsync", "files=*")}


def test_runs_that_differ_only_in_times_and_numbers_reach_the_same_cells() -> None:
    """Held longer, started later, a larger delay: the same state, so the same cells (not a new run)."""
    moved = json.loads(json.dumps(RESULTS))
    moved["faults"][0]["params"] = {"params": {"nodes": ["n1"], "delay_ms": 400.0, "files": "*"}, "hold": 3.0}
    for w in moved["faults"]:
        w["start_ns"] += NS // 2
        w["end_ns"] += NS // 2
        w["heal_start_ns"] += NS // 2
    moved["liveness"]["recovery"][0]["publish_ok_ns"] = int(7 * NS)
    scenario = {"workload": {"consumers": 0}, "broker": {"nodes": 3}}
    assert run_cells(scenario, moved) == run_cells(scenario, RESULTS)


def test_targets_are_the_node_the_nodes_or_a_partitions_smaller_side() -> None:
    cluster = ["n1", "n2", "n3"]
    assert targets({"node": "n2"}, cluster) == ["n2"]
    assert targets({"groups": [["n2", "n3"], ["n1"]], "cuts": [["n1", "n2"]]}, cluster) == ["n1"]
    assert targets({"type": "latency"}, cluster) == cluster


def test_a_run_without_faults_still_has_cells_and_features_follow_the_workload() -> None:
    cells = run_cells({"workload": {"consumers": 2}}, {"verdict": "durable", "counts": {}})
    assert cells == {"publish-confirm | no-fault | verdict=durable", "consume | no-fault | verdict=durable"}
    w = {
        "consumers": 2,
        "queues": 3,
        "consumer": {"requeue": 0.1, "crash_every": 5, "slow": 0},
        "transactions": {"publish_batch": 5, "ack_batch": 0},
        "delay": {"share": 0.3},
    }
    assert workload_features({"workload": w, "broker": {"nodes": 1}}) == [
        "publish-confirm",
        "consume",
        "requeue",
        "crash",
        "delay",
        "tx-publish",
        "queues",
    ]


ISOLATE = {
    "name": "isolate-master",
    "seed": 17,
    "broker": {"plugin": "reference", "nodes": 3, "settings": {"partition_handling": "pause_minority"}},
    "workload": {"producers": 3, "consumers": 0, "rate": 150, "duration": 22},
    "nemesis": {
        "schedule": [
            {"at": 6, "fault": "partition", "params": {"shape": "isolate", "node": "n1"}, "hold": 12}
        ]
    },
}


def test_align_holds_a_kind_inside_an_action_on_its_node_or_on_each_other_node(faults) -> None:
    """The schedule behind a node that restarts inside its own isolation and serves the clients pushed onto it:
    a kill of n1 inside n1's isolation, and n2's and n3's client links reset inside it (``reset_peer``)."""
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    cluster = ["n1", "n2", "n3"]
    ways = set()
    seen_degrade = {
        ("degrade", f"type={t}") for t in ("latency", "bandwidth", "slicer", "slow_close", "limit_data")
    }
    for seed in range(40):
        got = Mutator(faults, pool, random.Random(seed), set(), seen_degrade).align(s, None)
        if got is None:
            continue
        m = normalise(got[0])
        if " partition " in got[1]:
            continue  # a partition inside a partition cannot run: ``mutate`` drops it as any invalid mutant
        assert valid(m, faults, cluster), got[1]
        iso = next(p for p in m.steps if p.kind == "partition")
        added = [p for p in m.steps if p.kind != "partition"]
        assert all(iso.at < p.at and p.at + (p.hold or 0) <= iso.at + (iso.hold or 0) + 1e-6 for p in added)
        aimed = sorted(p.params["node"] for p in added)
        assert aimed in (["n1"], ["n2", "n3"]), got[1]
        ways.add((added[0].kind, tuple(aimed)))
        if added[0].kind == "degrade":
            assert {p.params["type"] for p in added} == {"reset_peer"}  # the one type no run has shown
            assert len({json.dumps(p.params["links"]) for p in added}) == 1  # one draw for every node
    assert ways == {
        ("kill", ("n1",)),
        ("kill", ("n2", "n3")),
        ("degrade", ("n1",)),
        ("degrade", ("n2", "n3")),
    }


def test_a_fault_that_bit_is_another_cell_than_one_that_had_no_effect() -> None:
    """The fault's own evidence splits its cells: a power cut that dropped acknowledged messages, one
    that found nothing unsynced, and a cut whose one direction still carried bytes are not one state."""
    bit = json.loads(json.dumps(RESULTS))
    bit["fault_evidence"] = {
        "actions": [
            {"fault_id": "f2", "effect": True, "flags": [], "exposure": {"confirmed_before_cut": 12}},
            {"fault_id": "f3", "effect": True, "flags": ["n2->n1 still carried bytes"]},
        ]
    }
    quiet = json.loads(json.dumps(RESULTS))
    quiet["fault_evidence"] = {
        "actions": [
            {"fault_id": "f2", "effect": False, "flags": [], "exposure": {"confirmed_before_cut": 0}},
            {"fault_id": "f3", "effect": None, "flags": []},
        ]
    }
    assert {"bit", "exposed>0"} <= window_events(bit)["f2"]
    assert {"bit", "partial"} <= window_events(bit)["f3"]
    assert {"no-effect", "exposed=0"} <= window_events(quiet)["f2"]
    assert "unmeasured" in window_events(quiet)["f3"]
    scenario = {"workload": {"consumers": 0}, "broker": {"nodes": 3}}
    assert run_cells(scenario, bit) != run_cells(scenario, quiet)
