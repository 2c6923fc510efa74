"""member-remove: planned like every kind, and never held beside a process fault anywhere."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from faults.membership import MemberRemove, left_nodes
from faults.network import LinkToxic, Partition
from faults.packets import PacketLoss
from harness import ScenarioError
from harness.history import Recorder, read_jsonl
from harness.host import Host
from harness.nemesis import Nemesis, Plan, PlannedFault, plan
from harness.scenario import Scenario, from_dict
from harness.spec import Evidence, FaultContext
from harness.spec.rundir import HISTORY_JSONL

NODES = ["n1", "n2", "n3"]


def test_resolves_to_a_seeded_member_and_refuses_a_lone_node() -> None:
    picked = {MemberRemove.resolve({}, NODES, random.Random(s))["node"] for s in range(30)}
    assert picked == set(NODES)
    assert MemberRemove.resolve({"node": "n2"}, NODES, random.Random(1)) == {"node": "n2"}
    with pytest.raises(ScenarioError, match="2 nodes or more"):
        MemberRemove.resolve({}, ["n1"], random.Random(1))
    with pytest.raises(ScenarioError, match="'n9' is not one of"):
        MemberRemove.resolve({"node": "n9"}, NODES, random.Random(1))


def _during_a_membership_change(step: dict[str, Any]) -> Scenario:
    """n3 removed from the cluster for 10 s from second 5; ``step`` at second 8."""
    member_remove = {"at": 5, "fault": "member-remove", "params": {"node": "n3"}, "hold": 10}
    return from_dict(
        {
            "broker": {"plugin": "rabbitmq", "nodes": 3},
            "workload": {"duration": 60},
            "nemesis": {"schedule": [member_remove, {"at": 8, **step, "hold": 2}]},
        }
    )


def test_a_kill_of_another_node_during_a_membership_change_is_refused() -> None:
    faults = Host.load().registry.faults
    with pytest.raises(ScenarioError, match=r"both hold process of n1"):
        plan(_during_a_membership_change({"fault": "kill", "params": {"node": "n1"}}), faults, NODES)
    partition = _during_a_membership_change(
        {"fault": "partition", "params": {"shape": "isolate", "node": "n1"}}
    )
    assert [s.kind for s in plan(partition, faults, NODES).steps] == ["member-remove", "partition"]


def test_the_final_heal_joins_only_the_nodes_no_other_node_counts() -> None:
    everyone = {"n1", "n2", "n3"}
    # n2 paused by pause_minority, restarting or down: still a member wherever it is asked
    assert left_nodes(NODES, {"n1": everyone, "n3": everyone}) == {}
    assert left_nodes(NODES, {"n1": everyone, "n2": everyone, "n3": everyone}) == {}
    # n3 forgotten while its app was stopped: its own view still lists its old peers
    assert left_nodes(NODES, {"n1": {"n1", "n2"}, "n2": {"n1", "n2"}, "n3": everyone}) == {"n3": ["n1", "n2"]}
    # n1 reset and running alone: it joins the others, not they it
    assert left_nodes(NODES, {"n1": {"n1"}, "n2": {"n2", "n3"}, "n3": {"n2", "n3"}}) == {"n1": ["n2", "n3"]}
    # one node's answer is enough when the others cannot answer
    assert left_nodes(NODES, {"n2": {"n2", "n3"}}) == {"n1": ["n2", "n3"]}
    # nobody counts anybody else (master-slave replication): no cluster to heal
    assert left_nodes(NODES, {"n1": {"n1"}, "n2": {"n2"}, "n3": {"n3"}}) == {}
    assert left_nodes(NODES, {}) == {}


class _Plugin:
    """Each node's own view of the members; a join adds the node to the views of those it joined."""

    ready_timeout = 30.0

    def __init__(self, views: dict[str, set[str]], restarting: int = 0) -> None:
        self.views = views
        self.joined: list[str] = []
        #: How many more times a node asked says its app is not running (paused, restarting).
        self.restarting = restarting

    def members(self, node: Any) -> set[str]:
        if self.restarting:
            self.restarting -= 1
            raise RuntimeError(f"{node.name}: this command requires the 'rabbit' app to be running")
        return set(self.views[node.name])

    def add_node(self, node: Any, members: list[Any], settings: Any) -> dict[str, Any]:
        self.joined = [m.name for m in members]
        for name in [*self.joined, node.name]:
            self.views[name] |= {*self.joined, node.name}
        return {}


def test_a_heal_joins_the_members_not_a_node_removed_meanwhile() -> None:
    # n3 left first and its join failed (its own view still lists its old peers); then n2 left,
    # leaving n1 alone: n2 joins n1 and waits for n1 only, not for n3
    plugin = _Plugin({"n1": {"n1"}, "n2": {"n1", "n2"}, "n3": {"n1", "n2", "n3"}})
    nodes = {n: SimpleNamespace(name=n) for n in NODES}
    cluster = SimpleNamespace(nodes=nodes, plugin=plugin, settings={}, wait_ready=lambda names: None)
    done = MemberRemove(FaultContext(cluster), {"node": "n2"}, "f7").heal()
    assert plugin.joined == ["n1"]
    assert done == {"added": "n2", "done": {}, "members_after": ["n1", "n2"]}


def test_a_heal_asks_again_while_every_member_restarts() -> None:
    # seed 5 of rabbitmq-membership-kills.yaml at 25c0475: n3 out, n2 isolated meanwhile, so n1 and
    # n2 each saw 1 of 2 and pause_minority stopped both apps; f1's heal asked both at once, failed,
    # and n3 stayed out of the cluster until a later fault joined it
    plugin = _Plugin({"n1": {"n1", "n2"}, "n2": {"n1", "n2"}, "n3": set(NODES)}, restarting=3)
    nodes = {n: SimpleNamespace(name=n) for n in NODES}
    cluster = SimpleNamespace(nodes=nodes, plugin=plugin, settings={}, wait_ready=lambda names: None)
    done = MemberRemove(FaultContext(cluster), {"node": "n3"}, "f1").heal()
    assert plugin.joined == ["n1", "n2"]
    assert done["added"] == "n3"


# -- a re-join never starts while another fault cuts its nodes off -----------------------------
# RabbitMQ 3.10, seed 4 of rabbitmq-membership.yaml at 92155c2: n3's re-join (f1's heal, late
# under load) began while f3 held n3 isolated; its reset waited on Mnesia past the join's 300 s and
# the final heal could not join n3 either. The real kinds' declarations, their apply and heal
# replaced by stand-ins that record whether a cut was held when the join began.


class _Held:
    cuts: ClassVar[set[str]] = set()
    events: ClassVar[list[str]] = []


class _Join(MemberRemove):
    def apply(self) -> dict[str, Any]:
        return {}

    def heal(self) -> dict[str, Any]:
        _Held.events.append("join under a cut" if _Held.cuts else "join")
        return {}

    def evidence(self, done: Any) -> Evidence:
        return Evidence.unmeasured("a stand-in")


class _Cut(Partition):
    def apply(self) -> dict[str, Any]:
        _Held.cuts.add(self.fault_id)
        return {}

    def heal(self) -> dict[str, Any]:
        time.sleep(0.05)  # a heal takes time: the join waits for its end, not its start
        _Held.cuts.discard(self.fault_id)
        _Held.events.append("cut healed")
        return {}

    def evidence(self, done: Any) -> Evidence:
        return Evidence.unmeasured("a stand-in")


def _isolate(node: str) -> dict[str, Any]:
    return Partition.resolve({"shape": "isolate", "node": node}, NODES, random.Random(1))


def _join_and_cut(
    tmp_path: Path, join_hold: float | None, cut_at: float, cut_hold: float | None, cut_node: str = "n3"
) -> list[dict[str, Any]]:
    """The nemesis run for real (0.4 s, or 0.15 s when nothing heals on schedule) over n3 removed at
    0 s and held ``join_hold``, and ``cut_node`` isolated at ``cut_at`` for ``cut_hold``; the values
    of its heal records."""
    _Held.cuts, _Held.events = set(), []
    rec = Recorder(tmp_path / HISTORY_JSONL)
    kinds = {"member-remove": _Join, "partition": _Cut}
    steps = [
        PlannedFault("f1", 0.0, join_hold, "member-remove", {"node": "n3"}),
        PlannedFault("f2", cut_at, cut_hold, "partition", _isolate(cut_node)),
    ]
    nemesis = Nemesis(
        Plan(steps), kinds, FaultContext(None), rec, settle=0.0, final_heal=lambda: None, nodes=NODES
    )
    asyncio.run(nemesis(0.15 if join_hold is None else 0.4))
    rec.close()
    ops = read_jsonl(tmp_path / HISTORY_JSONL)
    return [json.loads(r["value"]) for r in ops if r["f"] == "heal" and r["type"] == "invoke"]


def test_the_kinds_say_what_they_cut_off_and_what_a_heal_needs() -> None:
    assert MemberRemove.heal_needs_links({"node": "n3"}, NODES) == set(NODES)
    assert Partition.cuts_off(_isolate("n3"), NODES) == set(NODES)
    halves = Partition.resolve({"shape": "one-way", "from": "n1", "to": "n2"}, NODES, random.Random(1))
    assert Partition.cuts_off(halves, NODES) == {"n1", "n2"}
    clients = Partition.resolve({"shape": "clients", "node": "n1"}, NODES, random.Random(1))
    assert Partition.cuts_off(clients, NODES) == set()  # the peers still hear each other
    assert PacketLoss.cuts_off({"node": "n2", "loss": 100.0, "links": "peers"}, NODES) == {"n2"}
    assert PacketLoss.cuts_off({"node": "n2", "loss": 40.0, "links": "peers"}, NODES) == set()
    reset = LinkToxic.resolve({"type": "reset_peer", "node": "n1"}, NODES, random.Random(1))
    assert LinkToxic.cuts_off(reset, NODES) == {"n1"}
    assert LinkToxic.cuts_off({**reset, "links": "clients"}, NODES) == set()
    slow = LinkToxic.resolve({"type": "latency", "node": "n1"}, NODES, random.Random(1))
    assert LinkToxic.cuts_off(slow, NODES) == set()
    assert Partition.heal_needs_links(_isolate("n3"), NODES) == set()
    assert MemberRemove.cuts_off({"node": "n3"}, NODES) == set()


def test_a_join_due_while_a_partition_cuts_the_node_off_waits_for_its_heal(tmp_path: Path) -> None:
    heals = _join_and_cut(tmp_path, 0.1, 0.05, 0.2)  # f1's heal due at 0.1 s, inside f2's cut
    assert _Held.events == ["cut healed", "join"]
    assert [h["fault_ids"] for h in heals] == [["f2"], ["f1"], []]
    assert heals[1]["after"] == ["f2"]  # the history says why the join came late


def test_a_join_whose_cut_is_held_to_the_end_is_left_to_the_final_heal(tmp_path: Path) -> None:
    heals = _join_and_cut(tmp_path, 0.1, 0.05, None)
    assert _Held.events == ["cut healed", "join"]
    assert [(h["fault_ids"], h["scheduled"]) for h in heals[:2]] == [(["f2"], False), (["f1"], False)]


def test_the_final_heal_heals_a_cut_before_the_join_it_holds_up(tmp_path: Path) -> None:
    # both still held when the workload ends: the join applied first, the cut after it
    _join_and_cut(tmp_path, None, 0.05, None, cut_node="n1")
    assert _Held.events == ["cut healed", "join"]


def test_a_join_with_no_cut_held_is_not_held_back(tmp_path: Path) -> None:
    heals = _join_and_cut(tmp_path, 0.1, 0.15, 0.1)
    assert _Held.events == ["join", "cut healed"]
    assert "after" not in heals[0]
