"""Every partition shape, checked from inside a real cluster: which nodes hear which,
before, during and after the heal (reference/faults.md, "Partition shapes")."""

from __future__ import annotations

import itertools
import random

import pytest

from faults.network import Partition, heal_network
from harness.spec import FaultContext
from tests.faults.docker_cluster import running_cluster
from tests.faults.probe_plugin import client_reaches, hears

pytestmark = pytest.mark.docker

NODES = 5


@pytest.fixture(scope="module")
def cluster():
    with running_cluster("probe", "probe", NODES, plugins=["tests.faults.probe_plugin"]) as c:
        yield c


def matrix(cluster, tag: str) -> set[tuple[str, str]]:
    """The directed pairs (src, dst) where dst does NOT hear src."""
    from concurrent.futures import ThreadPoolExecutor

    pairs = list(itertools.permutations(cluster.topology.nodes, 2))
    with ThreadPoolExecutor(max_workers=8) as pool:
        heard = pool.map(
            lambda p: hears(cluster, p[0], p[1], f"{tag}-{p[0]}-{p[1]}-{random.randrange(10**9)}"), pairs
        )
        return {pair for pair, ok in zip(pairs, heard, strict=True) if not ok}


SHAPES = [
    ("isolate", "drop"),
    ("halves", "drop"),
    ("fixed-halves", "refuse"),
    ("majorities-ring", "drop"),
    ("bridge", "drop"),
    ("one-way", "drop"),
]


@pytest.mark.parametrize(("shape", "mode"), SHAPES)
def test_partition_shape_cuts_exactly_its_links_and_heals(cluster, shape: str, mode: str) -> None:
    assert matrix(cluster, "before") == set(), "every node hears every other before the fault"
    params = Partition.resolve(
        {"shape": shape, "mode": mode}, list(cluster.topology.nodes), random.Random(shape)
    )
    fault = Partition(FaultContext(cluster), params)
    fault.apply()
    try:
        during = matrix(cluster, "during")
    finally:
        fault.heal()
    assert during == {tuple(c) for c in params["cuts"]}, params
    assert matrix(cluster, "after") == set(), "the heal restores every link"


def test_clients_cut_and_final_heal_is_idempotent(cluster) -> None:
    params = Partition.resolve(
        {"shape": "clients", "node": "n2"}, list(cluster.topology.nodes), random.Random(1)
    )
    Partition(FaultContext(cluster), params).apply()
    assert not client_reaches(cluster, "n2", f"cut-{random.randrange(10**9)}")
    assert client_reaches(cluster, "n1", f"open-{random.randrange(10**9)}")
    # A cut the schedule never healed is undone by the final heal, twice without harm.
    Partition(
        FaultContext(cluster),
        Partition.resolve({"shape": "isolate", "node": "n1"}, list(cluster.topology.nodes), random.Random(2)),
    ).apply()
    heal_network(cluster)
    heal_network(cluster)
    for node in cluster.nodes.values():
        state = node.toxiproxy.proxies()
        assert all(p["enabled"] and not p["toxics"] for p in state.values()), state
    assert client_reaches(cluster, "n2", f"healed-{random.randrange(10**9)}")
    assert matrix(cluster, "healed") == set()
