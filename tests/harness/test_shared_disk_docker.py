"""A shared volume under power loss in real containers: one lazy filesystem, mounted by its disk
container and seen through mount propagation by both nodes that mount the volume; a power cut
aimed at one node kills both and drops the writes neither had synced, the same for both."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from faults.disk import DiskError
from faults.process import PowerLoss
from harness.cluster import Cluster, build_topology, docker_client, remove_labelled
from harness.host import Host
from harness.images import ImageBuilder
from harness.spec import BrokerPlugin, FaultContext, ImageRecipe, NodeHandle, NodeInfo, NodeSpec, SharedVolume

pytestmark = pytest.mark.docker

SHARED = "/var/lib/ticker"
LOG = f"{SHARED}/log"

# Syncs its boot line (data and name), then appends "tick NODE i" lines it never syncs.
TICKER = r"""
import os, sys, time
name = sys.argv[1]
fd = os.open("/var/lib/ticker/log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.write(fd, b"boot %s\n" % name.encode())
os.fsync(fd)
d = os.open("/var/lib/ticker", os.O_RDONLY | os.O_DIRECTORY); os.fsync(d); os.close(d)
i = 0
while True:
    os.write(fd, b"tick %s %d\n" % (name.encode(), i))
    i += 1
    time.sleep(0.01)
"""


class Ticker(BrokerPlugin):
    """Two nodes appending to one file on a shared volume (the reference broker's image: python3)."""

    name = "ticker"
    client_port = 5672
    data_dir = SHARED
    ready_timeout = 60.0

    def __init__(self, image: ImageRecipe) -> None:
        self.recipe = image

    def image(self) -> ImageRecipe:
        return self.recipe

    def shared_volumes(self, settings: Mapping[str, Any]) -> tuple[SharedVolume, ...]:
        return (SharedVolume("store", SHARED),)

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        return NodeSpec(command=["python3", "-c", TICKER, node.name])

    def is_ready(self, node: NodeHandle) -> bool:
        return node.exec(["grep", "-q", f"tick {node.name} ", LOG], timeout=10)[0] == 0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    plugin = Ticker(Host.load().broker("reference").image())
    client = docker_client()
    builder = ImageBuilder(client)
    run_id = f"bc-shd{random.randrange(16**4):04x}"
    topology = build_topology(
        plugin,
        run_id=run_id,
        nodes=2,
        settings={},
        broker_image=builder.node_image(plugin.image()),
        proxy_image=builder.toxiproxy_image(),
        lazyfs=True,
        filesystem="strict",
    )
    try:
        with Cluster(client, topology, plugin, {}) as c:
            c.start()
            yield c
    finally:
        remove_labelled(client, run_id)


def read_log(cluster: Cluster, node: str) -> str:
    rc, out = cluster.nodes[node].exec(["cat", LOG])
    assert rc == 0, out
    return out


def test_a_power_cut_of_a_shared_volume_drops_the_unsynced_writes_both_nodes_saw(cluster: Cluster) -> None:
    # One mount: each node reads the other's ticks, synced or not.
    seen = {n: read_log(cluster, n) for n in ("n1", "n2")}
    assert all("tick n1 " in s and "tick n2 " in s for s in seen.values()), seen
    fault = PowerLoss(FaultContext(cluster), {"node": "n1"}, "f1")
    done = fault.apply()
    shared = done["shared"]
    assert sorted(shared["nodes"]) == ["n1", "n2"]
    cut = shared["disks"]["store"]["nodectl"]["lazyfs"]
    assert cut["dropped_bytes"] > 0 and "/log" in {d["path"] for d in cut["dropped_data"]}
    # Both nodes now read the same file: what the last sync covered (the cluster's write-back after
    # start), a prefix of what each had read; ticks of both nodes that each node read are gone.
    after = {n: read_log(cluster, n) for n in ("n1", "n2")}
    assert after["n1"] == after["n2"]
    kept = after["n1"]
    assert sorted(line for line in kept.splitlines() if line.startswith("boot")) == ["boot n1", "boot n2"]
    for n in ("n1", "n2"):
        assert seen[n].startswith(kept)
        gone = seen[n][len(kept) :]
        assert "tick n1 " in gone and "tick n2 " in gone, (n, gone[:200])
    evidence = fault.evidence(done)
    assert evidence.effect is True and set(evidence.facts["process"]) == {"n1", "n2"}
    healed = fault.heal()
    assert healed["ready"] and sorted(healed["shared_nodes"]) == ["n1", "n2"]
    # The final heal's disk-rule clearing asks the disk, not the nodes (which have no lazyfs).
    assert DiskError.heal_all(FaultContext(cluster)) is None
