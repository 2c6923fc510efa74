"""explore's moves on a partition's small side, without Docker: ``restart`` (a node taken down and
brought back inside its minority, the clients pushed onto it), ``push`` (the clients pushed onto
the side) and ``--until-event`` (a search judged on its whole budget past failures of another kind)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest

from harness.explore import NESTING, OPERATORS, Corpus, Mutator, Outcome, Search, normalise, pool_of, valid
from harness.explore_cells import broker_events, targets
from harness.host import Host
from harness.nemesis import PlannedFault
from harness.scenario import from_dict
from harness.shrink import Schedule
from tests.harness.test_explore import ISOLATE, SCENARIO, Clock, nested, oracle, start

CLUSTER = ["n1", "n2", "n3"]


@pytest.fixture(scope="module")
def faults():
    return Host.load([]).registry.faults


def _draws(faults, pool, op: str, s: Schedule, seeds: int) -> list[tuple[Schedule, str]]:
    out = []
    for seed in range(seeds):
        got = getattr(Mutator(faults, pool, random.Random(seed), set(), set(), set()), op)(s, None)
        if got is not None:
            out.append(got)
    return out


def _resets(s: Schedule) -> list[PlannedFault]:
    return [
        p
        for p in s.steps
        if p.kind == "degrade" and p.params.get("type") == "reset_peer" and p.params.get("links") == "clients"
    ]


def test_restart_brings_the_isolated_node_back_inside_its_isolation_with_the_clients_pushed_onto_it(
    faults,
) -> None:
    """The failing schedule of a node restarted inside its minority, in one move every time: a kill of
    the isolated node nested early in its (widened) isolation, and from the kill's planned heal to the
    isolation's end every other node's client links reset (``sheds_clients``), so the node back gets
    the clients. Every mutant is valid and the kill is strictly inside."""
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    got = _draws(faults, pool, "restart", s, 100)
    assert len(got) > 90
    for m, what in got:
        assert what.startswith("restart kill on same of f1") and "clients pushed" in what, what
        m = normalise(m)
        assert valid(m, faults, CLUSTER), what
        iso = next(p for p in m.steps if p.kind == "partition")
        end = iso.at + (iso.hold or 0)
        (kill,) = [p for p in m.steps if p.kind == "kill"]
        assert kill.params["node"] == "n1" and nested(kill, iso)
        assert end - (kill.at + (kill.hold or 0)) >= 0.8 * (iso.hold or 0) - 1e-6, what  # back early
        resets = _resets(m)
        assert sorted(p.params["node"] for p in resets) == ["n2", "n3"]
        for p in resets:
            assert p.at == pytest.approx(kill.at + (kill.hold or 0), abs=1e-3)
            assert end - 1.0 <= p.at + (p.hold or 0) < end


def test_restart_needs_a_partition_with_a_side_and_a_kind_that_takes_a_process(faults) -> None:
    """No split in the schedule (a kill alone), or no kind in the pool that takes a node's process:
    nothing to do. Without a kind that sheds clients the node is brought back alone."""
    iso = start(faults, ISOLATE, nodes=3)
    no_split = iso.replace(steps=(PlannedFault("f1", 6.0, 3.0, "kill", {"node": "n1"}),))
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    assert not _draws(faults, pool, "restart", no_split, 20)
    assert not _draws(faults, pool_of(from_dict(ISOLATE), faults, ["degrade"]), "restart", iso, 20)
    alone = _draws(faults, pool_of(from_dict(ISOLATE), faults, ["kill"]), "restart", iso, 20)
    assert alone and all(not _resets(m) and "clients pushed" not in what for m, what in alone)


def test_push_moves_the_clients_onto_any_partitions_small_side(faults) -> None:
    """A 5-node cluster cut 2 | 3: the other three nodes' client links reset over the cut's window,
    whatever the cut's shape; from a nested restart's heal when the side's node was taken down."""
    scenario: dict[str, Any] = {
        **ISOLATE,
        "broker": {"plugin": "reference", "nodes": 5},
        "nemesis": {
            "schedule": [
                {"at": 4, "fault": "partition", "params": {"shape": "halves"}, "hold": 12},
            ]
        },
    }
    s = start(faults, scenario, nodes=5)
    pool = pool_of(from_dict(scenario), faults, ["kill", "degrade"])
    (cut,) = s.steps
    side = targets(cut.params, [f"n{k}" for k in range(1, 6)])
    assert len(side) == 2
    got = _draws(faults, pool, "push", s, 30)
    assert len(got) == 30
    for m, what in got:
        assert what == "push clients onto f1's side by degrade"
        resets = _resets(m)
        assert sorted(p.params["node"] for p in resets) == sorted(
            set(f"n{k}" for k in range(1, 6)) - set(side)
        )
        assert all(cut.at < p.at <= cut.at + 0.2 * 12 + 1e-6 and p.at + (p.hold or 0) < 16 for p in resets)
    back = s.replace(steps=(*s.steps, PlannedFault("f2", 5.0, 2.0, "kill", {"node": side[0]})))
    for m, _ in _draws(faults, pool, "push", back, 10):
        assert all(p.at == pytest.approx(7.0) for p in _resets(m))


def test_a_nesting_move_is_applied_last_in_its_stack(faults) -> None:
    """``restart`` and ``push``, like ``align``, come after the stack's other moves: a ``shift`` of
    the isolation after them would move the window they nested in."""
    s = start(faults, ISOLATE, nodes=3)
    pool = pool_of(from_dict(ISOLATE), faults, ["kill", "degrade"])
    assert set(NESTING) <= set(OPERATORS)
    seen = {"restart": 0, "push": 0}
    for seed in range(400):
        got = Mutator(faults, pool, random.Random(seed), set(), set(), set()).mutate(s, None, CLUSTER)
        if got is None:
            continue
        moves = got[1].split("; ")
        for op in seen:
            if any(m.startswith(op + " ") for m in moves):
                seen[op] += 1
                assert moves[-1].startswith(op + " "), got[1]
    assert seen["restart"] > 20 and seen["push"] > 10


def test_until_event_goes_on_past_failures_without_the_broker_events(faults, tmp_path: Path) -> None:
    """``--until LOST --until-event served-alone``: a LOST run whose broker did not report the event
    is recorded and the search goes on to the LOST run that did."""

    def losses(s: Schedule, how: str, iteration: int) -> Outcome:
        out = oracle(s, how, iteration)
        cells = out.cells | ({"backlog | run | event=served-alone"} if iteration >= 3 else set())
        return dataclasses.replace(out, verdict="LOST", cells=cells)

    pool = pool_of(from_dict(SCENARIO), faults)
    search = Search(
        Corpus.open(tmp_path, "pl-random", 5),
        start(faults),
        faults,
        pool,
        losses,
        budget_s=3600,
        until=frozenset({"LOST"}),
        until_events=frozenset({"served-alone"}),
        clock=Clock(),
    )
    out = search.run()
    assert out is not None and search.finished == "failure"
    assert [r["verdict"] for r in search.corpus.runs] == ["LOST", "LOST", "LOST"]
    assert search.corpus.failure is not None and search.corpus.failure["iteration"] == 3


def test_broker_events_are_read_from_the_runs_cells() -> None:
    cells = {
        "backlog | run | event=served-alone",
        "cluster | run | event=copy-dropped",
        "backlog | no-fault | event=paused-minority",
        "backlog | kill@one/clients | applied",
        "backlog | run | verdict=LOST",
    }
    assert broker_events(cells) == {"served-alone", "copy-dropped", "paused-minority"}
