"""Membership changes: a node leaves the running cluster (the others forget it) and joins it
again, empty, as Jepsen's membership nemesis does. The broker plugin says how (``members``,
``remove_node``, ``add_node``; RabbitMQ: ``stop_app`` + ``forget_cluster_node``, then ``reset``
+ ``join_cluster``); a plugin that cannot change membership does not declare ``membership``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from faults.targets import on_each
from harness import FaultError, ScenarioError
from harness.spec import Fault, FaultContext


class MemberRemove(Fault):
    """``node`` leaves the cluster for the hold, then joins it again as a new, empty member."""

    name = "member-remove"
    requires = frozenset({"membership"})
    touches = frozenset({"process", "membership"})
    params_schema = {"node": str}

    @classmethod
    def holds(cls, params: Mapping[str, Any], nodes: Sequence[str]) -> set[tuple[str, str]]:
        """Every node's process and membership: a member may leave or join only while every other
        node runs (RabbitMQ, seen here: a node forgotten while another was killed could not join
        again, ``inconsistent_cluster``), so kills, pauses and power cuts wait; partitions may overlap."""
        return {(r, n) for r in cls.touches for n in nodes}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        if len(nodes) < 2:
            raise ScenarioError(
                f"fault {cls.name}: needs a cluster of 2 nodes or more, this one has {len(nodes)}"
            )
        node = params.get("node") or rng.choice(list(nodes))
        if node not in nodes:
            raise ScenarioError(f"fault {cls.name}: node {node!r} is not one of {list(nodes)}")
        return {"node": node}

    def _split(self) -> tuple[Any, list[Any]]:
        nodes = self.ctx.cluster.nodes
        return nodes[self.params["node"]], [h for n, h in nodes.items() if n != self.params["node"]]

    def apply(self) -> dict[str, Any]:
        node, others = self._split()
        plugin = self.ctx.cluster.plugin
        done = plugin.remove_node(node, others, self.ctx.cluster.settings)
        asked, members = _members(plugin, others)
        if node.name in members:
            raise FaultError(
                f"{node.name} still counts as a member on {asked} after its removal: {sorted(members)}"
            )
        return {"removed": node.name, "done": done, "members_after": sorted(members)}

    def heal(self) -> dict[str, Any]:
        node, others = self._split()
        return _add(self.ctx, node, others)

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        """Every node that is not a running member joins again. The cluster is the largest set of running
        members any node reports: a node left alone (reset, its join still pending) reports only itself,
        and must join the others, not have them join it."""
        nodes = ctx.cluster.nodes
        plugin = ctx.cluster.plugin
        seen: set[str] = set()
        # Every node asked at once; a node out of the cluster may not answer (an error): the others count.
        replies, _errors = on_each(list(nodes), lambda name: plugin.members(nodes[name]))
        for name in nodes:
            members = replies.get(name)
            if members is not None and len(members) > len(seen):
                seen = members
        if len(seen) < 2:
            return (
                None  # no node counts another as a member: no cluster to heal (e.g. master-slave replication)
            )
        out = {}
        for name in sorted(set(nodes) - seen):
            out[name] = _add(ctx, nodes[name], [h for n, h in nodes.items() if n in seen])
        return out or None


def _add(ctx: FaultContext, node: Any, members: list[Any]) -> dict[str, Any]:
    plugin = ctx.cluster.plugin
    if not members:
        raise FaultError(f"{node.name} cannot join: no running member to join")
    done = plugin.add_node(node, members, ctx.cluster.settings)
    ctx.cluster.wait_ready([node.name])
    _asked, now = _members(plugin, members)
    if node.name not in now:
        raise FaultError(f"{node.name} is not a running member after joining: {sorted(now)}")
    return {"added": node.name, "done": done, "members_after": sorted(now)}


def _members(plugin: Any, nodes: Sequence[Any]) -> tuple[str, set[str]]:
    """The members as the first of ``nodes`` that can tell sees them: a node cut off by a
    partition that overlaps the change may not answer (a Raft-based broker's node without a
    leader), and another one does."""
    errors = []
    for node in nodes:
        try:
            return node.name, plugin.members(node)
        except Exception as exc:  # noqa: BLE001 - a plugin's admin call failing on one node: ask the next
            errors.append(f"{node.name}: {exc}")
    raise FaultError("no node could list the members: " + "; ".join(errors))
