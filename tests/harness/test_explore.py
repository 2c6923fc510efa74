"""The explore search without Docker: mutations, the corpus, the loop, and the coverage cells.

The search is run against a pure oracle (a function of the schedule), as ``harness.shrink``'s
search is tested: a schedule "fails" when a power loss starts while a slow fsync is held, the
overlap the seeded random nemesis never draws.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.errors import BrokerChaosError
from harness.explore import (
    FRESH_WEIGHT,
    Corpus,
    Mutator,
    Outcome,
    Search,
    normalise,
    pairs_in,
    pool_of,
    relations_in,
    valid,
    values_in,
)
from harness.explore_cells import (
    fault_shapes,
    heal_lateness,
    run_cells,
    run_shapes,
    targets,
    window_events,
    workload_features,
)
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
    """Cells: each action's kind and what it started under; LOST for a power loss under a slow fsync.
    Shapes: each kind, and each (held, started under it) pair on the same node."""
    cells = set()
    shapes = set()
    for p in s.steps:
        under = sorted(
            {q.kind for q in s.steps if q is not p and q.at <= p.at < q.at + (q.hold or s.duration)}
        )
        cells.add(f"backlog | {p.kind}[]" + (f" under={'+'.join(under)}" if under else "") + " | applied")
        shapes |= {f"{p.kind}[]@one/clients", *(f"{p.kind} under={u}:same" for u in under)}
    lost = held_under(s, "slow-fsync", "power-loss")
    return Outcome("LOST" if lost else "durable", cells, f"run-{iteration}", 60.0, shapes=shapes)


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
    assert made >= 30


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
        assert again.iteration == 3 and again.cells == corpus.cells and again.shapes == corpus.shapes
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


def test_shapes_name_the_kind_target_and_each_relation_apart() -> None:
    shapes = fault_shapes(RESULTS, 3)
    assert shapes["f1"] == ["slow-fsync[files=*]@one/clients"]
    assert shapes["f2"] == ["power-loss[]@one/clients", "power-loss under=slow-fsync:same"]
    # f3 starts 0.6 s after f2's heal began, before its publishes came back (3 s), on a node no client used.
    assert shapes["f3"] == [
        "kill[]@one/no-clients",
        "kill under=slow-fsync:other",
        "kill recovering=power-loss",
    ]


def test_events_per_window_and_for_the_run() -> None:
    ev = window_events(RESULTS)
    assert ev["f2"] == {"applied", "publish-none", "lost"}
    assert ev["f1"] == {"applied", "publish-served", "lost"}
    assert ev["run"] == {"event=flush-timeout", "outage-publish"}
    scenario = {"workload": {"consumers": 0}, "broker": {"nodes": 3}}
    cells = run_cells(scenario, RESULTS)
    assert "backlog | power-loss@one/clients | lost" in cells and "cluster | run | verdict=LOST" in cells
    assert "backlog | run | event=flush-timeout" in cells
    assert "backlog | power-loss under=slow-fsync:same | lost" in cells
    assert "backlog | run | recovered>0" in cells and "backlog | run | duplicated>0" not in cells
    assert "backlog | run | outage-publish" in cells
    assert not any(c.endswith("verdict=LOST") and " run " not in c for c in cells)  # not one per window
    tried = run_shapes(scenario, RESULTS)
    assert pairs_in(tried) == {("slow-fsync", "power-loss"), ("slow-fsync", "kill")}
    assert relations_in(tried) == {("slow-fsync", "power-loss", "same"), ("slow-fsync", "kill", "other")}
    assert values_in(tried) == {("slow-fsync", "files=*")}
    assert not values_in(cells)  # the cells name no parameter


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


def test_runs_that_differ_in_parameters_and_how_much_was_served_reach_the_same_cells() -> None:
    """Another value of a fault's parameter (what the search's ``shape`` mutation sets, unseen values
    first), 60 % of publishes confirmed instead of all, a broker event logged a little later (in the
    next window): the cluster did the same, so the same cells. With parameters in the fault's cell,
    a threshold on the share and events per window, each made a new run."""
    other = json.loads(json.dumps(RESULTS))
    other["faults"][0]["params"]["params"]["files"] = "journal"
    other["availability"][0].update(confirmed=60, share=0.6)
    other["events"] = [{"name": "flush-timeout", "fault_ids": ["f2"]}]  # logged in another window
    scenario = {"workload": {"consumers": 0}, "broker": {"nodes": 3}}
    assert run_cells(scenario, other) == run_cells(scenario, RESULTS)
    assert run_shapes(scenario, other) != run_shapes(scenario, RESULTS)  # tried apart, for the mutations


def test_a_window_that_confirmed_nothing_is_one_cell_whether_a_publish_was_tried_or_not() -> None:
    """A short kill while every producer reconnects: whether one retry fell inside it (attempts 3,
    none confirmed) or none did (attempts 0, share None) is timing, not the cluster: one cell
    (``publish-none``). A window in which a publish was confirmed is another."""
    tried = json.loads(json.dumps(RESULTS))
    tried["availability"][1].update(attempts=3, confirmed=0, share=0.0)
    none = json.loads(json.dumps(RESULTS))
    none["availability"][1].update(attempts=0, confirmed=0, share=None)
    scenario = {"workload": {"consumers": 0}, "broker": {"nodes": 3}}
    assert run_cells(scenario, tried) == run_cells(scenario, none)
    assert "publish-none" in window_events(none)["f2"]
    served = json.loads(json.dumps(RESULTS))
    served["availability"][1].update(attempts=3, confirmed=1, share=1 / 3)
    assert "publish-served" in window_events(served)["f2"]
    assert run_cells(scenario, served) != run_cells(scenario, none)


def test_an_outage_is_the_runs_whichever_windows_it_overlapped() -> None:
    """The same outage overlapping the power cut, or the slow fsync as well: one cell, the run's
    (``run | outage-publish``); a run with no outage lacks it."""
    both = json.loads(json.dumps(RESULTS))
    both["liveness"]["windows"] = [{"kind": "publish", "fault_ids": ["f1", "f2"]}]
    scenario = {"workload": {"consumers": 0}, "broker": {"nodes": 3}}
    assert run_cells(scenario, both) == run_cells(scenario, RESULTS)
    quiet = json.loads(json.dumps(RESULTS))
    quiet["liveness"]["windows"] = []
    assert run_cells(scenario, RESULTS) - run_cells(scenario, quiet) == {
        f"{f} | run | outage-publish" for f in workload_features(scenario)
    }


def test_a_relation_with_nothing_gone_wrong_is_no_new_cell() -> None:
    """A kill of n1 inside n1's isolation, after a run that killed n2 inside it, both durable with the
    same outcomes: nothing new (each relation crossed with ``applied`` made it new). The same nesting
    that lost messages, or after which n1 served alone and dropped its copy at the heal, is new."""
    scenario = {"workload": {"consumers": 0}, "broker": {"nodes": 3}}
    other = _windows(("f1", "partition", 1, 11, "n1"), ("f2", "kill", 3, 5, "n2"))
    same = _windows(("f1", "partition", 1, 11, "n1"), ("f2", "kill", 3, 5, "n1"))
    assert run_cells(scenario, same) == run_cells(scenario, other)
    lost = {**same, "attribution": {"messages": [{"id": "p1:3", "fault_ids": ["f1", "f2"]}]}}
    assert "cluster | kill under=partition:same | lost" in run_cells(scenario, lost) - run_cells(
        scenario, other
    )
    alone = {
        **same,
        "events": [
            {"name": "paused-minority", "fault_ids": ["f1"]},
            {"name": "served-alone", "fault_ids": ["f1"]},
            {"name": "copy-dropped", "fault_ids": []},
        ],
    }
    paused = {**other, "events": [{"name": "paused-minority", "fault_ids": ["f1"]}]}
    got = run_cells(scenario, alone) - run_cells(scenario, paused)
    assert got == {
        f"{f} | {where}"
        for f in ("publish-confirm", "backlog", "cluster")
        for where in ("run | event=served-alone", "run | event=copy-dropped")
    }


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
        added = _nested_only(got[1], added)
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


# -- nesting, relations and the stop verdicts (issue: a kill held inside the isolation of its node) --


def nested(inner: PlannedFault, outer: PlannedFault) -> bool:
    return outer.at < inner.at and inner.at + (inner.hold or 0) < outer.at + (outer.hold or 0)


def test_align_stays_nested_when_other_mutations_are_stacked_with_it(faults) -> None:
    """A ``shift`` or ``hold`` of the outer action stacked after ``align`` moved the window it had
    nested in (the isolation moved off the kill): ``align`` is applied last, so what it nests runs nested."""
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    cluster = ["n1", "n2", "n3"]
    stacked = 0
    for seed in range(400):
        got = Mutator(faults, pool, random.Random(seed), set(), set(), set()).mutate(s, None, cluster)
        if got is None or "align kill on same of " not in got[1]:
            continue
        stacked += ";" in got[1]
        assert got[1].split("; ")[-1].startswith("align"), got[1]
        # The action it nested in (a widened window moved earlier may be renumbered by ``normalise``).
        assert any(
            nested(k, outer)
            for outer in got[0].steps
            for k in got[0].steps
            if k.kind == "kill" and k.params["node"] in targets(outer.params, cluster)
        ), got[1]
    assert stacked >= 3  # the case that broke: align with other mutations in one stack


def _align_draws(faults, pool, s: Schedule, seeds: int) -> Iterator[tuple[Schedule, str]]:
    """``align`` on ``s`` under seeds 0 to ``seeds - 1``: each mutant drawn, with what it did."""
    for seed in range(seeds):
        got = Mutator(faults, pool, random.Random(seed), set(), set(), set()).align(s, None)
        if got is not None:
            yield got


def test_align_heals_the_nested_action_with_most_of_the_window_to_run(faults) -> None:
    """A node killed inside its isolation must be back while the isolation still holds, with time to
    act there (a restarted node decides whether to serve after its start-up wait): the nested action
    begins in the window's first quarter and heals with more than half of it to run."""
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    drawn = 0
    for got in _align_draws(faults, pool, s, 100):
        if got[1].endswith("(clients pushed to its side)"):
            continue  # held to the window's end: ``test_align_pushes_the_clients_onto_the_windows_side``
        drawn += 1
        iso, *added = sorted(got[0].steps, key=lambda p: p.kind != "partition")
        end = iso.at + (iso.hold or 0)
        for p in _nested_only(got[1], added):
            assert iso.at < p.at <= iso.at + 0.25 * (iso.hold or 0) + 1e-6, got[1]
            assert end - (p.at + (p.hold or 0)) > 0.45 * (iso.hold or 0), got[1]
    assert drawn > 40


def test_align_pushes_the_clients_onto_the_windows_side(faults) -> None:
    """The clients pushed onto the isolated node (issue 39): on each node outside the window, half the
    time, the kind's ``sheds_clients`` parameters (every client link reset) held to the window's end;
    a kind that cannot shed clients (``kill``) is never held that way."""
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    pushed = drawn = 0
    for got in _align_draws(faults, pool, s, 300):
        if " on others of " not in got[1]:
            continue
        added = [p for p in got[0].steps if p.kind != "partition"]
        iso = next(p for p in got[0].steps if p.kind == "partition")
        end = iso.at + (iso.hold or 0)
        if not added:
            continue  # a partition inside a partition: ``mutate`` drops it as any invalid mutant
        if not got[1].endswith("(clients pushed to its side)"):
            drawn += added[0].kind == "degrade"
            continue
        pushed += 1
        assert {p.kind for p in added} == {"degrade"}, got[1]
        assert sorted(p.params["node"] for p in added) == ["n2", "n3"]
        assert all(p.params["type"] == "reset_peer" and p.params["links"] == "clients" for p in added)
        assert all(end - 1.0 <= p.at + (p.hold or 0) < end for p in added), got[1]
    assert pushed > 10 and drawn > 10


def _nested_only(what: str, added: list[PlannedFault]) -> list[PlannedFault]:
    """The actions ``align`` nested, without the clients pushed onto the window's side after them
    (``... on same of f1 (clients pushed to its side by degrade)``: those on the other nodes; the
    window in these tests is n1's isolation)."""
    if "(clients pushed to its side by " not in what:
        return added
    return [p for p in added if p.params.get("node") == "n1"]


def test_align_on_a_windows_nodes_pushes_the_clients_onto_them_after_the_nested_heal(faults) -> None:
    """The failing schedule of a node restarted inside its minority in one draw: a kill of n1 nested in
    n1's isolation, and from the kill's planned heal to the isolation's end n2's and n3's client links
    reset (``sheds_clients``), so the restarted node gets the clients. Half of the nestings on the
    window's own nodes do this; every one of them is valid and strictly inside the window."""
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    cluster = ["n1", "n2", "n3"]
    pushed = plain = 0
    for got in _align_draws(faults, pool, s, 300):
        if not got[1].startswith("align kill on same of f1"):
            continue
        m = normalise(got[0])
        assert valid(m, faults, cluster), got[1]
        iso = next(p for p in m.steps if p.kind == "partition")
        end = iso.at + (iso.hold or 0)
        kill = next(p for p in m.steps if p.kind == "kill")
        assert kill.params["node"] == "n1" and nested(kill, iso)
        resets = [p for p in m.steps if p.kind == "degrade"]
        if not resets:
            plain += 1
            continue
        pushed += 1
        assert got[1].endswith("(clients pushed to its side by degrade)"), got[1]
        assert sorted(p.params["node"] for p in resets) == ["n2", "n3"]
        assert all(p.params["type"] == "reset_peer" and p.params["links"] == "clients" for p in resets)
        for p in resets:
            assert p.at == pytest.approx(kill.at + (kill.hold or 0), abs=1e-3)  # from the kill's heal
            assert end - 1.0 <= p.at + (p.hold or 0) < end  # to the isolation's end
    assert pushed > 10 and plain > 10


def test_align_pushes_no_clients_when_no_pool_kind_sheds_them(faults) -> None:
    """Without a kind that ``sheds_clients`` in the pool (kill only), nesting on the window's nodes
    adds the nested action alone."""
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill"])
    drawn = 0
    for got in _align_draws(faults, pool, s, 100):
        if not got[1].startswith("align kill on same of"):
            continue
        drawn += 1
        assert "clients pushed" not in got[1]
        assert [p.kind for p in got[0].steps].count("kill") == 1 and len(got[0].steps) == 2
    assert drawn > 10


def test_align_heals_the_nested_action_with_the_reserve_of_workload_left(faults) -> None:
    """With ``reserve`` seconds (how late earlier runs' heals ended), a nested action heals that long
    before the workload's end at the latest, the window widened when it begins too late for that;
    with none, the same draws heal later."""
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    latest = {}
    for reserve in (0.0, 12.0):
        heals = []
        for seed in range(150):
            got = Mutator(faults, pool, random.Random(seed), set(), set(), set(), reserve).align(s, None)
            if got is None or got[1].endswith("(clients pushed to its side)"):
                continue
            added = [p for p in got[0].steps if p.kind != "partition"]
            heals += [p.at + (p.hold or 0) for p in _nested_only(got[1], added)]
        assert len(heals) > 40
        latest[reserve] = max(heals)
    assert latest[12.0] <= s.duration - 1.0 - 12.0 + 1e-6
    assert latest[0.0] > s.duration - 1.0 - 12.0


def test_align_widens_the_window_it_nests_in_half_the_time(faults) -> None:
    """A 12 s isolation leaves a node killed inside it no time to act after its restart: half the
    time ``align`` first widens the window (begun earlier, held to the workload's end)."""
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    widened = kept = 0
    for got in _align_draws(faults, pool, s, 100):
        iso = next(p for p in got[0].steps if p.kind == "partition")
        if "(widened)" in got[1]:
            widened += 1
            assert 1.0 <= iso.at <= 6.0 and iso.at + (iso.hold or 0) == pytest.approx(s.duration - 1.0)
        else:
            kept += 1
            assert (iso.at, iso.hold) == (6.0, 12.0)
    assert widened > 20 and kept > 20


def test_align_brings_a_node_back_early_in_a_widened_window_of_its_own(faults) -> None:
    """A kind that takes the node's process (``touches`` it: a kill), nested on the window's own
    node, comes back with most of the window to run: the window widened to the workload's end every
    time, the action begun in its first tenth and healed by its first fifth, so a restarted node's
    start-up wait (the reference broker's: 6 s) ends inside the isolation, before the producers
    stop. Before, such a kill healed anywhere up to 55 % into a window widened half the time: a
    12 s isolation left a node back at 6.6 s into it too little time to serve there. A kind that
    does not take the process (a degrade) keeps the wider draws."""
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    kills = degrades = 0
    for got in _align_draws(faults, pool, s, 300):
        if " on same of f1" not in got[1]:
            continue
        iso = next(p for p in got[0].steps if p.kind == "partition")
        span = iso.hold or 0.0
        inner = _nested_only(got[1], [p for p in got[0].steps if p.kind != "partition"])
        if got[1].startswith("align kill"):
            kills += 1
            assert "(widened)" in got[1] and iso.at + span == pytest.approx(s.duration - 1.0), got[1]
            (kill,) = inner
            assert iso.at < kill.at <= iso.at + 0.1 * span + 1e-6, got[1]
            assert kill.at + (kill.hold or 0) <= iso.at + 0.2 * span + 1e-6, got[1]
            assert iso.at + span - (kill.at + (kill.hold or 0)) >= 6.0, got[1]  # the start-up wait's room
        elif got[1].startswith("align degrade"):
            degrades += "(widened)" not in got[1]
    assert kills > 20 and degrades > 10


def test_align_aims_at_a_relation_no_run_has_reached(faults) -> None:
    """Every relation but a kill inside the isolation of its own node seen: that one is drawn
    ``FRESH_WEIGHT`` times as often as each seen one (4 of 4 + 5 for one action, three kinds and two
    ways, against 1 in 6 drawn evenly), and the seen ones still are: what a relation does depends on
    what else the window holds, and drawn only while unseen, a relation reached once was not drawn
    again for the rest of a search."""
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    seen = {(h, k, w) for h in pool for k in pool for w in ("same", "other")} - {
        ("partition", "kill", "same")
    }
    aimed = other = 0
    for seed in range(200):
        got = Mutator(faults, pool, random.Random(seed), set(), set(), seen).align(s, None)
        if got is None:
            continue
        if got[1].startswith("align kill on same of f1"):
            aimed += 1
            kill = next(p for p in got[0].steps if p.kind == "kill")
            assert kill.params["node"] == "n1"  # the partition's smaller side
        else:
            other += 1
    assert FRESH_WEIGHT == 4.0
    assert aimed > 0.35 * (aimed + other) and other > 0.35 * (aimed + other)


def test_align_is_drawn_more_while_relations_remain_unreached(faults) -> None:
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    every = {(h, k, w) for h in pool for k in pool for w in ("same", "other")}
    boost = Mutator(faults, pool, random.Random(1), set(), set(), set())._boost(s)
    assert boost["align"] == 2
    assert Mutator(faults, pool, random.Random(1), set(), set(), every)._boost(s)["align"] == 1


def _windows(*spec: tuple[str, str, float, float, str]) -> dict:
    """A run's results with fault windows (id, kind, start, end, node); a partition isolates its node."""
    faults = []
    for fid, kind, t0, t1, node in spec:
        params: dict = {"node": node}
        if kind == "partition":
            others = [n for n in ("n1", "n2", "n3") if n != node]
            params = {"shape": "isolate", "groups": [[node], others]}
        faults.append(window(fid, kind, t0, t1, params, t1 - t0))
    return {"verdict": "durable", "counts": {}, "faults": faults}


def test_relations_seen_apart_make_no_new_cell_when_combined() -> None:
    """A kill of n1 under n1's isolation, and one under a degrade of n1, each reached by an earlier run:
    a run whose kill starts under both reaches nothing new. Crossed into one shape
    (``under=degrade:same+partition:same``) every such combination was new, so every run was."""
    scenario = {"workload": {"consumers": 0}, "broker": {"nodes": 3}}
    seen = run_cells(
        scenario, _windows(("f1", "partition", 1, 11, "n1"), ("f2", "kill", 3, 5, "n1"))
    ) | run_cells(scenario, _windows(("f1", "degrade", 1, 11, "n1"), ("f2", "kill", 3, 5, "n1")))
    seen |= run_cells(scenario, _windows(("f1", "partition", 1, 11, "n1"), ("f2", "degrade", 2, 9, "n1")))
    both = _windows(
        ("f1", "partition", 1, 11, "n1"), ("f2", "degrade", 2, 9, "n1"), ("f3", "kill", 3, 5, "n1")
    )
    assert run_cells(scenario, both) <= seen


def test_until_lets_the_search_go_on_past_other_failing_verdicts(faults, tmp_path: Path) -> None:
    """``--until LOST``: a run UNAVAILABLE is recorded (and kept when new) and the search goes on to the loss."""

    def flaky(s: Schedule, how: str, iteration: int) -> Outcome:
        out = oracle(s, how, iteration)
        return Outcome("UNAVAILABLE", out.cells, out.run_dir, 60.0) if iteration <= 2 else out

    corpus = Corpus.open(tmp_path, "pl-random", 100)
    pool = pool_of(from_dict(SCENARIO), faults)
    search = Search(
        corpus, start(faults), faults, pool, flaky, budget_s=3600, until=frozenset({"LOST"}), clock=Clock()
    )
    out = search.run()
    assert out is not None and out.verdict == "LOST" and search.finished == "failure"
    assert [r["verdict"] for r in corpus.runs[:2]] == ["UNAVAILABLE", "UNAVAILABLE"]
    assert corpus.entries and corpus.entries[0].verdict == "UNAVAILABLE"
    stop_any = Search(
        Corpus.open(tmp_path / "any", "pl-random", 100),
        start(faults),
        faults,
        pool,
        flaky,
        budget_s=3600,
        clock=Clock(),
    )
    got = stop_any.run()
    assert got is not None and got.verdict == "UNAVAILABLE" and len(stop_any.corpus.runs) == 1


def test_until_takes_failing_verdicts_only() -> None:
    from harness.cli import _verdicts

    assert _verdicts("lost, integrity") == frozenset({"LOST", "INTEGRITY"})
    for bad in ("durable", "LOST,LOSS", " , "):
        with pytest.raises(BrokerChaosError, match="--until"):
            _verdicts(bad)


def test_a_relation_is_crossed_with_what_went_wrong_only() -> None:
    """The fault's own evidence and publishes served in a window go with the fault's coarse shape, a
    broker event and an outage with the run; crossed with each relation, every relation a mutation
    made was new."""
    res = json.loads(json.dumps(RESULTS))
    res["events"].append({"name": "promoted", "fault_ids": ["f2"]})
    res["fault_evidence"] = {"actions": [{"fault_id": "f2", "effect": True, "flags": []}]}
    cells = run_cells({"workload": {"consumers": 0}, "broker": {"nodes": 3}}, res)
    assert "backlog | run | event=promoted" in cells
    assert "backlog | power-loss@one/clients | bit" in cells
    assert "backlog | power-loss@one/clients | publish-none" in cells
    assert "backlog | run | outage-publish" in cells
    assert "backlog | power-loss under=slow-fsync:same | lost" in cells
    relation = {c.rsplit(" | ", 1)[1] for c in cells if " under=" in c or " recovering=" in c}
    assert relation == {"lost"}


@pytest.mark.parametrize("status", ["unreachable", "stuck"])
def test_a_missing_message_makes_a_cell_under_its_class(status: str) -> None:
    """A message the drain could not reach is not lost: its window's cell says ``unreachable`` and
    crosses no relation; a stuck one (held by a consumer that never acked) went wrong, and does."""
    res = json.loads(json.dumps(RESULTS))
    res["counts"] = {status: 1}
    res["attribution"]["messages"][0]["status"] = status
    ev = window_events(res)
    assert ev["f2"] == {"applied", "publish-none", status}
    cells = run_cells({"workload": {"consumers": 0}, "broker": {"nodes": 3}}, res)
    assert f"backlog | power-loss@one/clients | {status}" in cells
    assert not any(c.endswith(" | lost") for c in cells)
    relation = {c.rsplit(" | ", 1)[1] for c in cells if " under=" in c}
    assert relation == ({"stuck"} if status == "stuck" else set())


def test_a_missing_message_kept_before_its_class_was_takes_the_runs_class() -> None:
    res = json.loads(json.dumps(RESULTS))
    res["counts"] = {"unreachable": 3}
    assert window_events(res)["f2"] == {"applied", "publish-none", "unreachable"}


def test_heal_lateness_is_how_long_past_its_plan_the_latest_heal_completed() -> None:
    """The nemesis healed f1 3 s and f2 0.5 s past their planned times (the workload began at 100 s of
    the history); a window never healed, or not planned, does not count."""
    s = 1_000_000_000

    def window(fid: str, end_s: float, healed: bool = True) -> dict:
        return {
            "fault_id": fid,
            "kind": "kill",
            "start_ns": 101 * s,
            "end_ns": int(end_s * s),
            "applied": True,
            "healed": healed,
            "params": {"workload_start_s": 100.0, "hold": 2},
        }

    results = {"faults": [window("f1", 115.0), window("f2", 108.5), window("f3", 140.0, healed=False)]}
    assert heal_lateness(results, {"f1": 12.0, "f2": 8.0, "f3": 10.0}) == pytest.approx(3.0)
    assert heal_lateness(results, {"f2": 8.0}) == pytest.approx(0.5)
    assert heal_lateness(results, {"f2": 9.0}) == 0.0  # early is not late
    assert heal_lateness(results, {"f3": 10.0}) is None


def test_the_search_reserves_the_median_lateness_of_its_last_runs(faults, tmp_path: Path) -> None:
    """``Search.reserve``: none before a run; then the median of the last runs' heal lateness, capped
    at a third of the workload; what each run measured is in its record."""
    lates = iter([2.0, 30.0, 4.0, 6.0, 30.0, 30.0, 30.0])

    def late(s: Schedule, how: str, iteration: int) -> Outcome:
        return dataclasses.replace(oracle(s, how, iteration), verdict="durable", late_s=next(lates))

    s0 = start(faults)
    search = Search(
        Corpus(tmp_path, "pl-random", 3),
        s0,
        faults,
        pool_of(from_dict(SCENARIO), faults),
        late,
        budget_s=1e9,
        max_runs=3,
    )
    assert search.reserve() == 0.0
    search.run()
    assert [r["late_s"] for r in search.corpus.runs] == [2.0, 30.0, 4.0]
    assert search.reserve() == 4.0
    search.max_runs = 4
    search.run()
    assert search.reserve() == pytest.approx(s0.duration / 3, abs=1e-3)  # 30 s of 20: capped
