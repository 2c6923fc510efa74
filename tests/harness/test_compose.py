"""docker-compose.yml is rendered from the same Topology the harness runs, never kept by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from harness.cluster import TOXIPROXY_API_PORT, Topology, build_topology
from harness.compose import default_compose, render
from harness.host import Host
from harness.proxies import client_proxy_port

REPO = Path(__file__).resolve().parents[2]


def test_committed_compose_file_matches_the_topology() -> None:
    committed = REPO / "docker-compose.yml"
    assert committed.exists(), "docker-compose.yml is missing: write it with `brokerchaos compose`"
    assert committed.read_text() == default_compose(), "run `brokerchaos compose` to regenerate it"


def test_default_compose_is_stable() -> None:
    assert default_compose() == default_compose()


def _reference(host: Host, **kw: Any) -> Topology:
    """Three reference nodes on their default settings, as ``brokerchaos compose`` lays them out."""
    plugin = host.broker("reference")
    return build_topology(plugin, run_id="brokerchaos", nodes=3, settings=plugin.validate_settings({}), **kw)


def test_rendered_services_mirror_the_topology(host: Host) -> None:
    topo = _reference(host, broker_image="brokerchaos/reference:abc", proxy_image="brokerchaos/toxiproxy:abc")
    doc = yaml.safe_load(render(topo, client_base=7000, api_base=9000))
    services = doc["services"]
    assert (
        set(services)
        == {c.service for c in topo.containers}
        == {"n1", "n2", "n3", "n1-broker", "n2-broker", "n3-broker"}
    )
    cport = client_proxy_port(host.broker("reference").client_port)
    for i, node in enumerate(topo.nodes):
        sidecar = services[node]
        # Upstreams name the peers' sidecar containers, so compose must give them those names.
        assert sidecar["container_name"] == topo.container(node, "proxy").name
        assert services[f"{node}-broker"]["container_name"] == topo.container(node, "broker").name
        for proxy in json.loads(sidecar["environment"]["PROXIES"])[1:]:
            assert proxy["upstream"].rsplit(":", 1)[0] in {c["container_name"] for c in services.values()}
        assert sidecar["image"] == "brokerchaos/toxiproxy:latest"
        assert sidecar["hostname"] == node
        assert sidecar["ports"] == [
            f"127.0.0.1:{7000 + i}:{cport}",
            f"127.0.0.1:{9000 + i}:{TOXIPROXY_API_PORT}",
        ]
        assert json.loads(sidecar["environment"]["PROXIES"]) == [p.as_dict() for p in topo.proxies[node]]
        assert sorted(sidecar["extra_hosts"]) == sorted(
            f"{h}:{ip}" for h, ip in topo.container(node, "proxy").extra_hosts.items()
        )
        assert "$$PROXIES" in sidecar["entrypoint"][-1]  # compose must not interpolate it
        broker = services[f"{node}-broker"]
        spec = topo.container(node, "broker")
        assert broker["network_mode"] == f"service:{node}"
        assert broker["command"] == list(spec.command)
        assert broker["volumes"] == [f"{v}:{m}" for v, m in spec.volumes.items()]
        assert broker["labels"] == dict(spec.labels)
        # Each file the harness would copy in is carried in the environment and written before exec.
        files = sorted(spec.files.items())
        for k, (path, text) in enumerate(files):
            assert broker["environment"][f"BROKERCHAOS_FILE_{k}"] == text
            assert f"> {path}" in broker["entrypoint"][2]
    assert set(doc["volumes"]) == {v for c in topo.containers for v in c.volumes}


def test_lazyfs_topology_renders_fuse_access(host: Host) -> None:
    topo = _reference(host, broker_image="b:1", proxy_image="p:1", lazyfs=True)
    broker = yaml.safe_load(render(topo))["services"]["n1-broker"]
    spec = topo.container("n1", "broker")
    assert broker["devices"] == list(spec.devices) == ["/dev/fuse:/dev/fuse:rwm"]
    assert broker["cap_add"] == list(spec.cap_add) == ["SYS_ADMIN"]
    assert broker["security_opt"] == list(spec.security_opt)  # what the harness passes to Docker
