"""Partition shapes as sets of directed cuts, and which proxy streams carry each cut."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from faults.network import RANDOM_SHAPES, SHAPES, LinkToxic, Partition, partition_cuts
from harness.cluster import Topology, build_topology
from harness.errors import ScenarioError
from harness.spec import FaultContext
from plugins.rabbitmq import RabbitMQ
from plugins.reference import ReferenceBroker

SIZES = [3, 5]
SEEDS = range(12)


def nodes(n: int) -> list[str]:
    return [f"n{i}" for i in range(1, n + 1)]


def hears(cuts: list[list[str]], members: list[str]) -> dict[str, frozenset[str]]:
    """Whom each node hears: itself and every node whose bytes reach it."""
    cut = {(s, d) for s, d in cuts}
    return {d: frozenset(s for s in members if (s, d) not in cut) for d in members}


def resolve(params: dict[str, Any], n: int, seed: int = 0) -> dict[str, Any]:
    return Partition.resolve(params, nodes(n), random.Random(seed))


def assert_well_formed(cuts: list[list[str]], members: list[str]) -> None:
    assert all(s != d and s in members and d in members for s, d in cuts), cuts
    assert len({(s, d) for s, d in cuts}) == len(cuts), "a cut listed twice"


def shaped(shape: str, n: int, seed: int) -> tuple[dict[str, Any], list[str], dict[str, frozenset[str]]]:
    """A shape resolved on ``n`` nodes, its cuts checked well formed; with the members and whom each hears."""
    r = resolve({"shape": shape}, n, seed)
    members = nodes(n)
    assert_well_formed(r["cuts"], members)
    return r, members, hears(r["cuts"], members)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_isolate(n: int, seed: int) -> None:
    r, members, h = shaped("isolate", n, seed)
    (victim,), rest = r["groups"]
    assert h[victim] == {victim}
    for other in rest:
        assert h[other] == set(rest)
    assert len(r["cuts"]) == 2 * (n - 1)


def test_isolate_a_named_node() -> None:
    r = resolve({"shape": "isolate", "node": "n2"}, 3)
    assert r["groups"] == [["n2"], ["n1", "n3"]]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", ["halves", "fixed-halves"])
def test_halves(n: int, seed: int, shape: str) -> None:
    r, members, h = shaped(shape, n, seed)
    a, b = r["groups"]
    assert sorted(a + b) == members and {len(a), len(b)} == {n // 2, n - n // 2}
    for group in (a, b):
        for x in group:
            assert h[x] == set(group)  # nothing cut inside a group, everything across
    if shape == "fixed-halves":
        assert r["groups"] == [members[: n // 2], members[n // 2 :]]


def test_random_halves_vary_with_the_seed() -> None:
    assert len({str(resolve({"shape": "halves"}, 5, s)["groups"]) for s in SEEDS}) > 1


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_majorities_ring(n: int, seed: int) -> None:
    r, members, h = shaped("majorities-ring", n, seed)
    for x in members:
        assert x in h[x] and len(h[x]) > n / 2, (x, h[x])
    assert len(set(h.values())) == n, "two nodes hear the same majority"
    assert {k: sorted(v) for k, v in h.items()} == r["sees"]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_bridge(n: int, seed: int) -> None:
    r, members, h = shaped("bridge", n, seed)
    bridge = r["bridge"]
    assert h[bridge] == set(members)
    assert all(bridge in h[x] for x in members)
    side_a = [x for x in r["groups"][0] if x != bridge]
    side_b = [x for x in r["groups"][1] if x != bridge]
    assert side_a and side_b and sorted(side_a + side_b + [bridge]) == members
    for x, y in itertools.product(side_a, side_b):
        assert y not in h[x] and x not in h[y]
    for side in (side_a, side_b):
        for x in side:
            assert h[x] == set(side) | {bridge}


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_one_way(n: int, seed: int) -> None:
    r, _, h = shaped("one-way", n, seed)
    assert r["cuts"] == [[r["unheard"], r["deaf"]]]
    assert r["unheard"] not in h[r["deaf"]] and r["deaf"] in h[r["unheard"]]


def test_one_way_named() -> None:
    assert resolve({"shape": "one-way", "from": "n3", "to": "n1"}, 3)["cuts"] == [["n3", "n1"]]


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"shape": "one-way", "from": "n9"}, "from 'n9' is not one of"),
        ({"shape": "one-way", "to": "n9"}, "to 'n9' is not one of"),
        ({"shape": "one-way", "from": "n1", "to": "n1"}, "from and to are both 'n1'"),
        ({"shape": "isolate", "node": "n4"}, "node 'n4' is not one of"),
        ({"shape": "custom", "cuts": [["n1", "n7"]]}, "cuts 'n7' is not one of"),
        ({"shape": "custom", "cuts": [["n1"]]}, "needs cuts: [[src, dst], ...]"),
        ({"shape": "custom"}, "needs cuts"),
        ({"shape": "clients", "nodes": ["n1", "x"]}, "nodes 'x' is not one of"),
    ],
)
def test_named_nodes_must_exist(params: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        resolve(params, 3)
    assert needle in str(e.value)


@pytest.mark.parametrize("shape", ["majorities-ring", "one-way"])
def test_refuse_mode_rejects_asymmetric_shapes(shape: str) -> None:
    with pytest.raises(ScenarioError, match="asymmetric: use mode 'drop'"):
        resolve({"shape": shape, "mode": "refuse"}, 5)
    with pytest.raises(ScenarioError, match="asymmetric"):
        resolve({"shape": "custom", "cuts": [["n1", "n2"]], "mode": "refuse"}, 3)


@pytest.mark.parametrize("shape", ["isolate", "halves", "fixed-halves", "bridge"])
def test_refuse_mode_accepts_symmetric_shapes(shape: str) -> None:
    for n in SIZES:
        r = resolve({"shape": shape, "mode": "refuse"}, n)
        assert r["mode"] == "refuse"
        directed = {tuple(c) for c in r["cuts"]}
        assert all((d, s) in directed for s, d in directed)


def test_two_nodes_and_one() -> None:
    assert resolve({"shape": "majorities-ring"}, 2)["cuts"] == []  # a majority of 2 is both
    with pytest.raises(ScenarioError, match="bridge' needs at least 3 nodes"):
        resolve({"shape": "bridge"}, 2)
    with pytest.raises(ScenarioError, match="needs at least 2 nodes"):
        partition_cuts("halves", ["n1"], random.Random(0), {})


def test_clients_shape_cuts_no_peer_links() -> None:
    r = resolve({"shape": "clients", "nodes": ["n1", "n3"]}, 3)
    assert r == {"shape": "clients", "mode": "drop", "clients_cut_from": ["n1", "n3"], "cuts": []}
    assert resolve({"shape": "clients"}, 3, 4)["clients_cut_from"][0] in nodes(3)


def test_every_shape_is_handled() -> None:
    for shape in SHAPES:
        params: dict[str, Any] = {"shape": shape}
        if shape == "custom":
            params["cuts"] = [["n1", "n2"]]
        expected = RANDOM_SHAPES if shape == "random" else (shape,)
        assert resolve(params, 5)["shape"] in expected


def test_random_shape_is_drawn_by_the_seed_and_recorded_concretely() -> None:
    drawn = {
        Partition.resolve({"shape": "random"}, ["n1", "n2", "n3"], random.Random(s))["shape"]
        for s in range(40)
    }
    assert drawn == set(RANDOM_SHAPES)
    a = Partition.resolve({"shape": "random"}, ["n1", "n2", "n3"], random.Random(7))
    assert a == Partition.resolve({"shape": "random"}, ["n1", "n2", "n3"], random.Random(7))
    refused = {
        Partition.resolve({"shape": "random", "mode": "refuse"}, ["n1", "n2", "n3"], random.Random(s))[
            "shape"
        ]
        for s in range(40)
    }
    assert not refused & {"one-way", "majorities-ring"}
    assert "bridge" not in {
        Partition.resolve({"shape": "random"}, ["n1", "n2"], random.Random(s))["shape"] for s in range(40)
    }


# -- which proxies and streams carry a cut -------------------------------------------------------


class TopologyOnly:
    """What the network faults read from a cluster before they call Toxiproxy."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology


def topology(plugin: Any, n: int) -> Topology:
    settings = plugin.validate_settings({})
    return build_topology(
        plugin,
        run_id="bc-test",
        nodes=n,
        settings=settings,
        broker_image="img/broker:test",
        proxy_image="img/proxy:test",
    )


@pytest.mark.parametrize("plugin", [ReferenceBroker(), RabbitMQ()], ids=lambda p: p.name)
@pytest.mark.parametrize("n", SIZES)
def test_links_carry_src_bytes_to_dst(plugin: Any, n: int) -> None:
    topo = topology(plugin, n)
    part = Partition(FaultContext(TopologyOnly(topo)), {})
    for src, dst in itertools.permutations(topo.nodes, 2):
        links = part._links(src, dst)
        dst_index = topo.nodes.index(dst) + 1
        src_index = topo.nodes.index(src) + 1
        # Connections src opened to dst: the proxy sits in src's sidecar, src->dst is its upstream.
        up = sorted((p, s) for side, p, s in links if side == src)
        assert up == sorted(
            (f"{src}_to_{dst}_{port}", "upstream") for port in plugin.peer_ports_for(dst_index)
        )
        # Connections dst opened to src: in dst's sidecar, src's replies travel downstream.
        down = sorted((p, s) for side, p, s in links if side == dst)
        assert down == sorted(
            (f"{dst}_to_{src}_{port}", "downstream") for port in plugin.peer_ports_for(src_index)
        )
        assert len(links) == len(up) + len(down)
        names = {p.name for side in topo.proxies.values() for p in side}
        assert all(p in names for _, p, _ in links)
        assert not any(p.startswith("client_to_") for _, p, _ in links)


def test_cutting_both_directions_covers_every_peer_proxy_stream_once() -> None:
    topo = topology(ReferenceBroker(), 3)
    part = Partition(FaultContext(TopologyOnly(topo)), {})
    seen = [link for s, d in itertools.permutations(topo.nodes, 2) for link in part._links(s, d)]
    assert len(seen) == len(set(seen))
    peer_proxies = {(side, p.name) for side, ps in topo.proxies.items() for p in ps if p.src != "client"}
    assert {(side, p, s) for side, p, s in seen} == {
        (side, p, s) for side, p in peer_proxies for s in ("upstream", "downstream")
    }


@pytest.mark.parametrize(
    ("links", "want"),
    [
        ("peers", {"n2_to_n1_25672", "n2_to_n3_25672"}),
        ("clients", {"client_to_n2"}),
        ("all", {"n2_to_n1_25672", "n2_to_n3_25672", "client_to_n2"}),
    ],
)
def test_degrade_targets(links: str, want: set[str]) -> None:
    topo = topology(ReferenceBroker(), 3)
    params = LinkToxic.resolve({"node": "n2", "links": links}, topo.nodes, random.Random(0))
    fault = LinkToxic(FaultContext(TopologyOnly(topo)), params)
    assert {p for side, p in fault._targets() if side == "n2"} == want
    assert all(side == "n2" for side, _ in fault._targets())


def test_degrade_defaults_merge_with_attributes() -> None:
    r = LinkToxic.resolve({"type": "latency", "attributes": {"jitter": 0}}, nodes(3), random.Random(0))
    assert r["attributes"] == {"latency": 200, "jitter": 0}
    assert (r["links"], r["stream"], r["toxicity"]) == ("peers", "both", 1.0)
