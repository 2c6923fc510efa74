"""member-remove: planned like every kind, and never held beside a process fault anywhere."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from faults.membership import MemberRemove, left_nodes
from harness import ScenarioError
from harness.host import Host
from harness.nemesis import plan
from harness.scenario import Scenario, from_dict
from harness.spec import FaultContext

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

    def __init__(self, views: dict[str, set[str]]) -> None:
        self.views = views
        self.joined: list[str] = []

    def members(self, node: Any) -> set[str]:
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
