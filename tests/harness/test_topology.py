"""The cluster as data: every directed link its own proxy, routed so a cut needs no broker help."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from harness.cluster import (
    LAZYFS_BACKING,
    NODE_LABEL,
    PROJECT_LABEL,
    ROLE_LABEL,
    RUN_LABEL,
    TOXIPROXY_API_PORT,
    Topology,
    build_topology,
)
from harness.host import Host
from harness.proxies import client_proxy_port, peer_address
from harness.spec.broker import BrokerPlugin

RUN = "bc-abc123"


def build(plugin: BrokerPlugin, n: int = 3, **kw: Any) -> Topology:
    return build_topology(
        plugin,
        run_id=RUN,
        nodes=n,
        settings=plugin.validate_settings({}),
        broker_image="brokerchaos/x:abc",
        proxy_image="brokerchaos/toxiproxy:abc",
        **kw,
    )


@pytest.fixture(params=["reference", "rabbitmq"])
def plugin(request: pytest.FixtureRequest, host: Host) -> BrokerPlugin:
    return host.broker(request.param)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_a_proxy_for_every_directed_pair_and_peer_port(plugin: BrokerPlugin, n: int) -> None:
    t = build(plugin, n)
    assert t.nodes == tuple(f"n{i}" for i in range(1, n + 1))
    for src in t.nodes:
        peer = sorted((p.dst, p.port) for p in t.proxies[src] if p.src != "client")
        want = sorted(
            (dst, port)
            for j, dst in enumerate(t.nodes, start=1)
            if dst != src
            for port in plugin.peer_ports_for(j)
        )
        assert peer == want
        for p in t.proxies[src]:
            if p.src != "client":
                assert p.src == src and p.name == f"{src}_to_{p.dst}_{p.port}"
    total = sum(len(ps) for ps in t.proxies.values())
    assert total == n + sum(len(plugin.peer_ports_for(j)) * (n - 1) for j in range(1, n + 1))


def test_proxies_listen_on_the_peers_loopback_addresses(plugin: BrokerPlugin) -> None:
    t = build(plugin, 5)
    for node in t.nodes:
        sidecar = t.container(node, "proxy")
        assert sidecar.hostname == node
        assert sidecar.extra_hosts == {
            peer: peer_address(t.nodes.index(peer) + 1) for peer in t.nodes if peer != node
        }
        assert len(set(sidecar.extra_hosts.values())) == len(t.nodes) - 1
        listens = [p.listen for p in t.proxies[node]]
        assert len(listens) == len(set(listens)), "two proxies bind one address in a namespace"
        for p in t.proxies[node]:
            if p.src == "client":
                continue
            host, port = p.listen.rsplit(":", 1)
            # The peer's name resolves, inside this namespace, to where its proxy listens.
            assert host == sidecar.extra_hosts[p.dst] and host.startswith("127.0.0.")
            assert int(port) == p.port


def test_upstreams_reach_the_peer_sidecars(plugin: BrokerPlugin) -> None:
    t = build(plugin, 3)
    for node in t.nodes:
        sidecar = t.container(node, "proxy")
        for p in t.proxies[node]:
            if p.src == "client":
                continue
            host, port = p.upstream.rsplit(":", 1)
            assert host == t.container(p.dst, "proxy").name == f"{RUN}-{p.dst}"
            assert int(port) == p.port
            # Not a name the sidecar's hosts file maps back onto one of its own proxies.
            assert host not in sidecar.extra_hosts


def test_client_proxies(plugin: BrokerPlugin) -> None:
    t = build(plugin, 3, host_ports={"n2": 15672}, api_host_ports={"n3": 18474})
    cport = client_proxy_port(plugin.client_port)
    assert cport != plugin.client_port
    for node in t.nodes:
        (client,) = [p for p in t.proxies[node] if p.src == "client"]
        assert (client.name, client.dst, client.port) == (f"client_to_{node}", node, plugin.client_port)
        assert client.listen == f"0.0.0.0:{cport}"
        assert client.upstream == f"127.0.0.1:{plugin.client_port}"
    assert t.container("n1", "proxy").ports == {cport: None, TOXIPROXY_API_PORT: None}
    assert t.container("n2", "proxy").ports == {cport: 15672, TOXIPROXY_API_PORT: None}
    assert t.container("n3", "proxy").ports == {cport: None, TOXIPROXY_API_PORT: 18474}


def test_labels_on_every_container(plugin: BrokerPlugin) -> None:
    t = build(plugin, 3)
    assert len(t.containers) == 6
    for c in t.containers:
        assert c.labels[PROJECT_LABEL] == "brokerchaos"
        assert c.labels[RUN_LABEL] == RUN
        assert c.role in ("proxy", "broker") and c.labels[ROLE_LABEL] == c.role
        assert c.labels[NODE_LABEL] == c.node


def test_broker_containers_join_their_sidecar(plugin: BrokerPlugin) -> None:
    t = build(plugin, 3)
    names = [c.name for c in t.containers]
    assert len(names) == len(set(names))
    for node in t.nodes:
        broker, sidecar = t.container(node, "broker"), t.container(node, "proxy")
        assert sidecar.name == f"{RUN}-{node}" and broker.name == f"{RUN}-{node}-broker"
        assert broker.network_of == sidecar.name and broker.ports == {}
        assert broker.image == "brokerchaos/x:abc" and sidecar.image == "brokerchaos/toxiproxy:abc"
        assert list(broker.command[:2]) == ["--data-dir", plugin.data_dir]
        sep = list(broker.command).index("--")
        assert list(broker.command[sep + 1 :]) == list(plugin.node_spec(_info(plugin, t, node)).command)
        assert broker.volumes == {f"{RUN}-{node}-data": plugin.data_dir}
        assert not broker.devices and not broker.cap_add
        assert broker.files, "the plugin's config files are copied in"


def _info(plugin: BrokerPlugin, t: Topology, node: str) -> Any:
    from harness.spec.broker import NodeInfo

    return NodeInfo(
        name=node,
        index=t.nodes.index(node) + 1,
        peers=tuple(x for x in t.nodes if x != node),
        cluster=RUN,
        settings=plugin.validate_settings({}),
    )


def test_lazyfs_adds_fuse_and_moves_the_volume_to_the_backing_path(plugin: BrokerPlugin) -> None:
    t = build(plugin, 3, lazyfs=True)
    assert t.lazyfs
    for node in t.nodes:
        b = t.container(node, "broker")
        assert "/dev/fuse:/dev/fuse:rwm" in b.devices
        assert "SYS_ADMIN" in b.cap_add
        assert b.volumes == {f"{RUN}-{node}-data": LAZYFS_BACKING}
        init = list(b.command[: list(b.command).index("--")])
        assert init == [
            "--data-dir", plugin.data_dir, "--lazyfs", "--backing", LAZYFS_BACKING,
            "--lazyfs-names", plugin.filesystem,
        ]  # fmt: skip
        assert t.filesystem == plugin.filesystem
        assert not t.container(node, "proxy").devices


def test_node_specs_see_their_own_index_and_peers(host: Host) -> None:
    t = build(host.broker("rabbitmq"), 3)
    for i, node in enumerate(t.nodes, start=1):
        env = t.container(node, "broker").env
        assert env["RABBITMQ_NODENAME"] == f"rabbit@{node}"
        assert env["RABBITMQ_DIST_PORT"] == str(25670 + i)
    # Distribution ports are per node, so no namespace binds one twice.
    for a, b in itertools.combinations(range(1, 4), 2):
        assert set(host.broker("rabbitmq").peer_ports_for(a)) & set(
            host.broker("rabbitmq").peer_ports_for(b)
        ) == {4369}


def test_peers_on_the_client_port_and_further_client_ports() -> None:
    """A broker whose peers use its client port (Redis replication) gets peer proxies on that port
    at the peers' loopback addresses; each further client port (Redis Sentinel) its own client
    proxy, published, apart from the client port's."""
    from plugins.redis import Redis

    t = build(Redis(), 3)
    links = {p.name: p for p in t.proxies["n1"]}
    assert links["n1_to_n2_6379"].listen == f"{peer_address(2)}:6379"
    assert links["n1_to_n3_26379"].upstream == f"{RUN}-n3:26379"
    extra = links["client_to_n1_26379"]
    assert extra.src == "client" and extra.upstream == "127.0.0.1:26379"
    assert extra.listen == "0.0.0.0:56379" != links["client_to_n1"].listen
    sidecar = t.container("n1", "proxy")
    assert {client_proxy_port(6379), 56379, TOXIPROXY_API_PORT} == set(sidecar.ports)
