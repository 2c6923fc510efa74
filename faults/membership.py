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
from harness import ClusterError, FaultError, ScenarioError
from harness.spec import Evidence, Fault, FaultContext
from harness.spec.broker import NotYet, poll


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
    def heal_needs_links(cls, params: Mapping[str, Any], nodes: Sequence[str]) -> set[str]:
        """Every node: the join talks to the members, and RabbitMQ's ``reset`` waits for every
        node its old schema lists (Mnesia's tables, ten 30 s tries), longer than a join is given;
        it went on after the cut healed and left the node's old schema in place (seed 4 of
        ``rabbitmq-membership.yaml`` at ``92155c2``). RabbitMQ's peer discovery assumes a joining
        node can reach its peers."""
        return set(nodes)

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
        _asked, before = _members(plugin, others)
        done = plugin.remove_node(node, others, self.ctx.cluster.settings)
        asked, members = _members(plugin, others)
        if node.name in members:
            raise FaultError(
                f"{node.name} still counts as a member on {asked} after its removal: {sorted(members)}"
            )
        return {
            "removed": node.name,
            "done": done,
            "members_before": sorted(before),
            "members_after": sorted(members),
            "asked": asked,
        }

    def heal(self) -> dict[str, Any]:
        """Join the nodes that are members now: another node removed meanwhile, whose own join is
        still to come or failed, is not one to join or to wait for (a RabbitMQ join waits for every
        node it is given to run, so a forgotten one made it wait its whole ``ready_timeout``)."""
        node, others = self._split()
        plugin = self.ctx.cluster.plugin
        _asked, members = _members(plugin, others, wait=plugin.ready_timeout)
        return _add(self.ctx, node, [h for h in others if h.name in members])

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """The membership the broker itself reports (``members``), asked of another node before and
        after the removal. No effect: the node was not a member to begin with."""
        node = self.params["node"]
        before, after = list(done.get("members_before") or []), list(done.get("members_after") or [])
        facts = {"members_before": before, "members_after": after, "asked": done.get("asked")}
        if node not in before:
            return Evidence.none(f"{node} was not a member before its removal ({', '.join(before)})", facts)
        return Evidence.bit(
            f"members {', '.join(before)} -> {', '.join(after)} (as {done.get('asked')} reports)", facts
        )

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """The membership the broker reports once the node joined again: it is a member."""
        after = list(done.get("members_after") or [])
        back = self.params["node"] in after
        facts = {**applied.facts, "members_after_heal": after}
        summary = f"{applied.summary}; after the heal {', '.join(after)}"
        return applied.with_heal(summary, facts, back)

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        """Every node the others no longer count as a member joins them again (``left_nodes``). A node
        that is merely down, paused or restarting is still a member and is left alone: joining means
        ``reset``, which would wipe what it holds."""
        nodes = ctx.cluster.nodes
        plugin = ctx.cluster.plugin
        # Every node asked at once; a node out of the cluster may not answer (an error): the others count.
        replies, _errors = on_each(list(nodes), lambda name: plugin.members(nodes[name]))
        out = {}
        for name, join in sorted(left_nodes(list(nodes), replies).items()):
            out[name] = _add(ctx, nodes[name], [nodes[n] for n in join])
        return out or None


def left_nodes(nodes: Sequence[str], views: Mapping[str, set[str]]) -> dict[str, list[str]]:
    """The nodes that left the cluster, each with the members it should join, from each node's view
    of the membership (``views``: the nodes that answered).

    A node has left when no other node that answered counts it as a member. Its own view does not
    count: a node forgotten while its app was stopped still lists its old peers, and a node reset
    alone lists only itself. It joins the largest view that another node holds. When no node counts
    another one as a member there is no cluster to heal (e.g. master-slave replication)."""
    if all(len(v) < 2 for v in views.values()):
        return {}
    out = {}
    for name in nodes:
        others = [v for n, v in views.items() if n != name]
        if others and not any(name in v for v in others):
            cluster = max(others, key=len)
            out[name] = sorted(n for n in cluster if n in nodes and n != name)
    return out


def _add(ctx: FaultContext, node: Any, members: list[Any]) -> dict[str, Any]:
    plugin = ctx.cluster.plugin
    if not members:
        raise FaultError(f"{node.name} cannot join: no running member to join")
    done = plugin.add_node(node, members, ctx.cluster.settings)
    ctx.cluster.wait_ready([node.name])
    _asked, now = _members(plugin, members)
    if node.name not in now:
        raise FaultError(f"{node.name} is not a member after joining: {sorted(now)}")
    return {"added": node.name, "done": done, "members_after": sorted(now)}


def _members(plugin: Any, nodes: Sequence[Any], wait: float = 0.0) -> tuple[str, set[str]]:
    """The members as the first of ``nodes`` that can tell sees them: a node cut off by a
    partition that overlaps the change may not answer (a Raft-based broker's node without a
    leader), and another one does. With ``wait``, asked again until one answers or ``wait``
    seconds have passed: every node may be restarting at once (RabbitMQ's ``pause_minority``
    stops the app of each node that saw too few members, and a heal came while both members left
    restarted theirs, seed 5 of ``rabbitmq-membership-kills.yaml`` at ``25c0475``)."""

    def ask() -> tuple[str, set[str]] | NotYet:
        errors = []
        for node in nodes:
            try:
                return node.name, plugin.members(node)
            except Exception as exc:  # noqa: BLE001 - a plugin's admin call failing on one node: ask the next
                errors.append(f"{node.name}: {exc}")
        return NotYet("; ".join(errors))

    try:
        return poll(ask, timeout=wait, failure="no node could list the members")
    except ClusterError as exc:
        raise FaultError(str(exc)) from None
