"""Coordinated power loss: node shares made concrete by seed, and real cuts on several node inits at once."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from faults.power import PowerLossCoordinated
from faults.process import Kill
from faults.targets import pick_nodes, share_size
from harness.errors import ScenarioError
from harness.nemesis import plan
from harness.spec import FaultContext
from tests.factories import reference_scenario
from tests.faults.local_nodes import LocalCluster, local_inits
from tests.faults.test_nodeinit import Init, wait_for

N3 = ["n1", "n2", "n3"]
N5 = ["n1", "n2", "n3", "n4", "n5"]


@pytest.mark.parametrize(
    ("share", "n", "size"),
    [
        ("all", 3, 3),
        ("majority", 3, 2),
        ("minority", 3, 1),
        ("majority", 5, 3),
        ("minority", 5, 2),
        ("majority", 4, 3),
        ("minority", 4, 1),
        ("minority", 1, 1),
        ("majority", 1, 1),
    ],
)
def test_share_sizes(share: str, n: int, size: int) -> None:
    assert share_size(share, n) == size


def test_pick_nodes_is_seeded_sorted_and_checked() -> None:
    for seed in range(30):
        a = pick_nodes("x", "random", N5, random.Random(seed))
        assert a == pick_nodes("x", "random", N5, random.Random(seed))
        assert 1 <= len(a) <= 5 and a == sorted(a) and set(a) <= set(N5)
    assert len({tuple(pick_nodes("x", "random", N5, random.Random(s))) for s in range(30)}) > 5
    assert pick_nodes("x", ["n3", "n1"], N3, random.Random(1)) == ["n1", "n3"]
    for bad in (["n4"], ["n1", "n1"], [], "most"):
        with pytest.raises(ScenarioError, match="fault x: nodes"):
            pick_nodes("x", bad, N3, random.Random(1))


def test_resolve_is_concrete_and_stable_under_replay() -> None:
    p = PowerLossCoordinated.resolve({"nodes": "majority", "torn": True}, N5, random.Random(7))
    assert len(p["nodes"]) == 3 and isinstance(p["torn_seed"], int) and p["lead"] == 2.0
    # A replay hands the stored, concrete parameters back: they must mean the same thing.
    assert PowerLossCoordinated.resolve(p, N5, random.Random(99)) == p
    assert PowerLossCoordinated.resolve({}, N3, random.Random(1))["nodes"] == N3
    with pytest.raises(ScenarioError, match="lead"):
        PowerLossCoordinated.resolve({"lead": 0}, N3, random.Random(1))
    with pytest.raises(ScenarioError, match="unknown parameter 'node'"):
        PowerLossCoordinated.resolve({"node": "n1"}, N3, random.Random(1))


def test_the_random_nemesis_draws_it_with_concrete_nodes() -> None:
    faults = {"power-loss-coordinated": PowerLossCoordinated, "kill": Kill}
    sc = reference_scenario(
        {
            "random": {
                "faults": ["power-loss-coordinated", "kill"],
                "every": [5, 10],
                "hold": [2, 4],
                "params": {"power-loss-coordinated": {"nodes": "random"}},
            }
        },
        seed=3,
        nodes=5,
    )
    steps = [s for s in plan(sc, faults, N5).steps if s.kind == "power-loss-coordinated"]
    assert steps and all(s.params["nodes"] and set(s.params["nodes"]) <= set(N5) for s in steps)
    assert len({tuple(s.params["nodes"]) for s in steps}) > 1
    assert plan(sc, faults, N5).to_list() == plan(sc, faults, N5).to_list()


# -- real node inits over lazyfs (no Docker) ----------------------------------------------------


@pytest.fixture
def three_inits() -> Iterator[dict[str, Init]]:
    with local_inits(N3) as inits:
        yield inits


def _stamp(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_cut_on_two_of_three_nodes_at_one_instant(three_inits: dict[str, Init]) -> None:
    wait_for(lambda: all(i.log().count(b"tick") >= 3 for i in three_inits.values()), "ticks")
    fault = PowerLossCoordinated(
        FaultContext(LocalCluster(three_inits)), {"nodes": ["n1", "n3"], "torn": False, "lead": 1.0}, "f1"
    )
    done: dict[str, Any] = fault.apply()
    cut = done["cut"]
    assert sorted(done["nodes"]) == ["n1", "n3"]
    for n in ("n1", "n3"):
        reply = done["nodes"][n]["nodectl"]
        # Each init waited for the shared instant, then killed, then dropped its unsynced ticks.
        assert _stamp(reply["at"]) >= cut["scheduled_at"] and reply["cue"]["late_ms"] >= 0
        assert reply["lazyfs"]["command"] == "crash" and cut["dropped_bytes"][n] > 0
        assert cut["dropped_files"][n] == ["/log"]
        assert three_inits[n].log().endswith(b"boot\n")
        assert three_inits[n].ctl("status")["state"] == "stopped"
    assert cut["spread_ms"] == pytest.approx(
        abs(_stamp(done["nodes"]["n1"]["nodectl"]["at"]) - _stamp(done["nodes"]["n3"]["nodectl"]["at"]))
        * 1000,
        abs=0.01,
    )
    assert three_inits["n2"].ctl("status")["state"] == "running"  # not in the list: untouched

    healed = fault.heal()
    assert healed["ready"] and sorted(healed["nodes"]) == ["n1", "n3"]
    for n in N3:
        assert three_inits[n].ctl("status")["state"] == "running"
    assert three_inits["n1"].log().count(b"boot") == 2


def test_a_replay_naming_nodes_the_cluster_lacks_is_refused() -> None:
    from harness.errors import BrokerChaosError
    from harness.nemesis import Plan, PlannedFault
    from harness.runner import _check_replay

    faults = {"power-loss-coordinated": PowerLossCoordinated}
    stored = Plan(
        [PlannedFault("f1", 5.0, 2.0, "power-loss-coordinated", {"nodes": ["n1", "n5"], "lead": 1.0})]
    )
    with pytest.raises(BrokerChaosError, match="targets node 'n5'"):
        _check_replay(stored, faults, frozenset({"power-loss"}), N3)
    _check_replay(stored, faults, frozenset({"power-loss"}), N5)
