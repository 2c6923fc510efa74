"""``member-remove`` on a real 3-node JetStream cluster (nats-server 2.9.10): the node's server is
stopped and removed from the meta group (no longer a member anywhere, and the stream's replica
count falls to the two left); at heal it joins again under a new server name with an empty
store, is a member again, and the meta leader places the stream back on it: its own files then
hold every record, caught up from the others."""

from __future__ import annotations

import functools

import pytest

from faults.membership import MemberRemove
from harness.spec import FaultContext
from tests.plugins.nats_docker import three_replicas
from tests.polling import until

pytestmark = pytest.mark.docker


def test_a_removed_node_joins_again_renamed_and_empty_then_holds_the_stream() -> None:
    with three_replicas("membership") as r:
        plugin, nodes = r.plugin, r.nodes
        want = sorted(r.publish(range(1, 21)).items())
        assert plugin.members(nodes["n2"]) == {"n1", "n2", "n3"}

        ctx = FaultContext(r.cluster)
        removed = MemberRemove(ctx, {"node": "n3"}, "f1").apply()
        assert removed["members_after"] == ["n1", "n2"], removed
        assert removed["done"]["server"] == "n3"
        assert "n3" not in plugin.meta_group(nodes["n1"])

        joined = MemberRemove(ctx, {"node": "n3"}, "f1").heal()
        assert joined["members_after"] == ["n1", "n2", "n3"], joined
        assert (joined["done"]["was"], joined["done"]["server"]) == ("n3", "n3-2")
        assert plugin.server_name(nodes["n3"]) == "n3-2"
        assert sorted(plugin.meta_group(nodes["n2"])) == ["n1", "n2", "n3-2"]

        until(functools.partial(r.holds, "n3", want), "n3 (as n3-2) holds every record again", every=0.5)
        assert MemberRemove.heal_all(ctx) is None  # every node a member: nothing to heal
