"""Contract points of ``harness.spec.broker`` the conformance kit checks: peers on the client
port, and the declared answer to a corrupted data file."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from harness.conformance import FAIL, PASS, Battery, refusal_check, render
from harness.host import Host
from harness.runner import running_cluster
from harness.scenario import from_dict
from harness.spec.broker import CORRUPTION_RESPONSES
from tests.conformance.contract_plugins import ASK, ECHO_PORT
from tests.polling import until

PLUGINS = ["tests.conformance.contract_plugins"]


def attributes(plugin: str) -> Any:
    rows = Battery(Host.load(PLUGINS), plugin, only=["contract"]).run()
    return next(r for r in rows if r.name == "contract: attributes"), rows


# -- peers on the client port ----------------------------------------------------------------


def test_a_peer_port_equal_to_the_client_port_conforms() -> None:
    row, rows = attributes("peers-on-client-port")
    assert row.status == PASS, render(rows, "peers-on-client-port")
    assert f"peer ports [{ECHO_PORT}]" in row.detail


def test_the_client_proxy_port_is_no_peer_port() -> None:
    row, _ = attributes("client-proxy-peer")
    assert row.status == FAIL
    assert "peer port 45672 of node 1 is the port each node's client proxy listens on" in row.detail


# -- corruption_response -------------------------------------------------------------------------


def test_corruption_response_must_be_a_known_answer() -> None:
    row, _ = attributes("unknown-corruption-response")
    assert row.status == FAIL
    assert "corruption_response 'repair' is not one of 'recover', 'refuse'" in row.detail
    assert attributes("refuses-corruption")[0].status == PASS
    assert set(CORRUPTION_RESPONSES) == {"recover", "refuse"}


def test_the_corrupt_file_probe_follows_the_declaration() -> None:
    probe = Host.load().registry.faults["corrupt-file"].conformance
    assert probe is not None and probe.corrupts
    assert not Host.load().registry.faults["kill"].conformance.corrupts  # type: ignore[union-attr]


def op(process: str, f: str, type_: str, value: Any = None, error: str | None = None) -> dict[str, Any]:
    return {
        "process": process,
        "f": f,
        "type": type_,
        "value": None if value is None else json.dumps(value),
        "error": error,
    }


FILE = "/var/lib/redis/appendonlydir/appendonly.aof.1.incr.aof"
APPLIED = op(
    "nemesis",
    "corrupt-file",
    "ok",
    {"fault_id": "f1", "done": {"nodes": {"n1": {"nodectl": {}, "corrupted": {"file": FILE}}}}},
)
HEAL_FAILED = op("nemesis", "heal", "info", error="ClusterError: n1 not ready after 60s")
REFUSED_LOG = {"n1": "Bad file format reading the append only file appendonly.aof.1.incr.aof\n"}


def test_refusal_passes_when_the_node_stays_down_and_its_log_names_the_file(tmp_path: Path) -> None:
    ops = [op("p1", "publish", "ok", "p1:1"), APPLIED, HEAL_FAILED, op("d1", "drain", "info")]
    check = refusal_check("corrupt-file", ops, REFUSED_LOG, tmp_path)
    assert check.status == PASS, check
    assert "appendonly.aof.1.incr.aof" in check.detail


def test_refusal_fails_when_the_node_came_back(tmp_path: Path) -> None:
    healed = op("nemesis", "heal", "ok", {"fault_ids": ["f1"], "done": {"ready": True}})
    check = refusal_check("corrupt-file", [APPLIED, healed], REFUSED_LOG, tmp_path)
    assert check.status == FAIL and "declare 'recover'" in check.hint
    drained = op("d1", "drain", "ok", {"consumed": 3})
    assert (
        refusal_check("corrupt-file", [APPLIED, HEAL_FAILED, drained], REFUSED_LOG, tmp_path).status == FAIL
    )


def test_refusal_fails_when_the_log_does_not_say_why(tmp_path: Path) -> None:
    check = refusal_check("corrupt-file", [APPLIED, HEAL_FAILED], {"n1": "exited with code 1\n"}, tmp_path)
    assert check.status == FAIL
    assert "does not name the corrupted file n1: appendonly.aof.1.incr.aof" in check.detail


def test_refusal_fails_when_nothing_was_corrupted(tmp_path: Path) -> None:
    failed = op("nemesis", "corrupt-file", "info", error="FaultError: no non-empty file")
    check = refusal_check("corrupt-file", [failed], REFUSED_LOG, tmp_path)
    assert check.status == FAIL and "no non-empty file" in check.detail


# -- the proxies with a peer port equal to the client port (Docker) -----------------------------


def ask(cluster: Any, node: str, target: str) -> str | None:
    """What ``target`` answers on the echo port when ``node`` dials it by host name (None: no answer)."""
    rc, out = cluster.nodes[node].exec(["python3", "-c", ASK, target], timeout=15)
    return out.strip() if rc == 0 else None


@pytest.mark.docker
def test_peers_reach_each_other_on_the_client_port_through_their_own_proxies() -> None:
    """Node A dials peer B by host name on B's client port: A's sidecar listens there at B's
    loopback address and forwards to B; cutting that one directed link leaves B->A and the
    workload's client proxies (another port, on every address) as they were."""
    host = Host.load(PLUGINS)
    scenario = from_dict(
        {"name": "peer-client-port", "broker": {"plugin": "peers-on-client-port", "nodes": 2}}
    )
    with running_cluster(host, scenario) as cluster:
        assert ask(cluster, "n1", "n2") == "n2"
        assert ask(cluster, "n2", "n1") == "n1"
        assert ask(cluster, "n1", "127.0.0.1") == "n1"  # its own broker, not a proxy
        n1_proxy = cluster.nodes["n1"].toxiproxy
        links = n1_proxy.proxies()
        assert links[f"n1_to_n2_{ECHO_PORT}"]["listen"] == f"127.0.0.12:{ECHO_PORT}"
        n1_proxy.set_enabled(f"n1_to_n2_{ECHO_PORT}", False)
        until(lambda: ask(cluster, "n1", "n2") is None, "n1 cut off from n2's client port")
        assert ask(cluster, "n2", "n1") == "n1"  # the other direction is another proxy
        for node, (h, port) in cluster.client_endpoints().items():
            with socket.create_connection((h, port), timeout=10) as s:
                assert s.makefile().readline().strip() == node  # the workload's way in, unchanged
        n1_proxy.set_enabled(f"n1_to_n2_{ECHO_PORT}", True)
        until(lambda: ask(cluster, "n1", "n2") == "n2", "n1 reaches n2 again")


@pytest.mark.docker
def test_a_refusal_declared_by_a_broker_that_recovers_is_named(tmp_path: Path) -> None:
    """The reference broker comes back after a corrupted file: declared ``refuse``, the kit's
    corrupt-file probe runs the refusal check on the stored run and says to declare ``recover``."""
    battery = Battery(Host.load(PLUGINS), "refuses-corruption", store=tmp_path, only=["corrupt-file"])
    rows = battery.run()
    row = next(r for r in rows if r.group == "corrupt-file")
    assert row.name == "corrupt-file: the node refuses to start on the corrupted file", render(rows, "x")
    assert row.status == FAIL and "declare 'recover'" in row.hint, render(rows, "x")
