"""Partition evidence for real, without Docker: the project's Toxiproxy server on loopback, two
stand-in peers that hang up on a probe's garbage (as the reference broker's cluster port does),
probes run as the nodes run them (``python3 -m faults.node.probe``). A cut that forgets one
direction, or a cut applied to proxies that no longer carry the link, is caught by the evidence."""

from __future__ import annotations

import asyncio
import random
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from faults.network import Partition
from harness.evidence import read_fault_evidence
from harness.history import Recorder
from harness.nemesis import Nemesis, Plan, PlannedFault
from harness.proxies import ProxySpec, ToxiproxyServer
from harness.spec import Fault, FaultContext
from harness.spec.results import FaultEvidence
from tests.faults.test_nodeinit import ENV
from tests.ports import free_port
from tests.tools.test_toxiproxy_server import Server, binary, start_server, stop_server

__all__ = ["binary"]  # the fixture, imported to be used here

NODES = ["n1", "n2"]


class HangUp(socketserver.ThreadingTCPServer):
    """A peer's port: reads what comes and hangs up, like a broker refusing a bad frame."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self) -> None:
        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.recv(64)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return f"{host!s}:{port}"


class LoopbackNode:
    """A node as faults see it: ``exec`` in its network namespace (here: this machine's), its sidecar."""

    def __init__(self, name: str, toxiproxy: ToxiproxyServer) -> None:
        self.name = name
        self.toxiproxy = toxiproxy

    def exec(self, cmd: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
        cmd = [sys.executable if c == "python3" else c for c in cmd]
        r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout + r.stderr


@pytest.fixture
def toxi(binary: Path) -> Iterator[Server]:
    running = start_server(binary, "--seed", "7")
    yield running
    stop_server(running)


def cluster(server: Server, peers: dict[str, HangUp], *, bypass: bool = False) -> SimpleNamespace:
    """Two nodes, each with a proxy to the other in its sidecar (one Toxiproxy server serves both).
    ``bypass``: the proxies the topology names are not the ones on the path the probes (and a
    broker) take: those are other proxies, with no toxics, listening where the topology says."""
    api = ToxiproxyServer("sidecars", "127.0.0.1", server.port)
    specs = {}
    made = []
    for src, dst in (("n1", "n2"), ("n2", "n1")):
        listen = f"127.0.0.1:{free_port()}"
        name = f"{src}_to_{dst}"
        specs[src] = [ProxySpec(name, listen, peers[dst].address, src, dst, 0)]
        if bypass:
            made.append(ProxySpec(f"bypass_{name}", listen, peers[dst].address, src, dst, 0))
            made.append(ProxySpec(name, f"127.0.0.1:{free_port()}", peers[dst].address, src, dst, 0))
        else:
            made.append(specs[src][0])
    api.populate(made)
    return SimpleNamespace(
        nodes={n: LoopbackNode(n, api) for n in NODES},
        topology=SimpleNamespace(proxies=specs, nodes=NODES),
    )


class ForgetsOneDirection(Partition):
    """A planted harness defect: the cut adds only the toxics on streams leaving ``src``'s sidecar."""

    def apply(self) -> dict[str, Any]:
        done = []
        for src, dst in self.params["cuts"]:
            for sidecar, proxy, stream in self._links(src, dst):
                if stream == "upstream":
                    self.ctx.cluster.nodes[sidecar].toxiproxy.add_toxic(
                        proxy,
                        name=self._toxic(stream),
                        type="timeout",
                        stream=stream,
                        attributes={"timeout": 0},
                    )
                    done.append(proxy)
        return {"actions": done}


def run(tmp: Path, kind: type[Fault], c: SimpleNamespace, params: Mapping[str, Any]) -> FaultEvidence:
    recorder = Recorder(tmp / "history.jsonl")
    resolved = kind.resolve(params, NODES, random.Random(1))
    nemesis = Nemesis(
        Plan([PlannedFault("f1", 0.0, 0.2, "partition", resolved)]),
        {"partition": kind},
        FaultContext(c),
        recorder,
        settle=0,
        final_heal=lambda: {},
    )
    asyncio.run(nemesis(0.5))
    recorder.close()
    return read_fault_evidence(tmp / "history.jsonl")


@pytest.fixture
def peers() -> Iterator[dict[str, HangUp]]:
    servers = {n: HangUp() for n in NODES}
    yield servers
    for s in servers.values():
        s.shutdown()
        s.server_close()


def test_a_partition_is_proved_by_probes_while_held_and_after_the_heal(
    tmp_path: Path, toxi: Server, peers: dict[str, HangUp]
) -> None:
    ev = run(tmp_path, Partition, cluster(toxi, peers), {"shape": "isolate", "node": "n1"})
    [action] = ev["actions"]
    assert action["effect"] is True and action["restored"] is True and ev["lines"] == []
    links = action["facts"]["links"]
    assert len(links) == 4  # two cuts, each carried by two proxies' streams
    assert {lk["held"]["result"] for lk in links} == {"stalled"}
    assert {lk["after"]["result"] for lk in links} == {"passes"}
    assert all(lk["in_place"] for lk in links)


def test_refuse_mode_is_proved_by_refused_probes(
    tmp_path: Path, toxi: Server, peers: dict[str, HangUp]
) -> None:
    ev = run(tmp_path, Partition, cluster(toxi, peers), {"shape": "isolate", "node": "n1", "mode": "refuse"})
    [action] = ev["actions"]
    assert action["effect"] is True and action["restored"] is True
    assert {lk["held"]["result"] for lk in action["facts"]["links"]} == {"refused"}


def test_a_cut_that_forgets_one_direction_is_caught_by_the_evidence(
    tmp_path: Path, toxi: Server, peers: dict[str, HangUp]
) -> None:
    ev = run(
        tmp_path, ForgetsOneDirection, cluster(toxi, peers), {"shape": "one-way", "from": "n1", "to": "n2"}
    )
    [action] = ev["actions"]
    assert ev["lines"] == [
        "f1 partition: n1->n2 still carried bytes through n2's proxy n2_to_n1 while cut",
        "f1 partition: n1->n2: n2's proxy n2_to_n1 does not show the cut ({'enabled': True, 'toxics': []})",
    ]
    assert action["effect"] is True  # the other link was cut: it bit, and the line says where it did not


def test_a_partition_of_proxies_that_no_longer_carry_the_link_has_no_effect(
    tmp_path: Path, toxi: Server, peers: dict[str, HangUp]
) -> None:
    ev = run(tmp_path, Partition, cluster(toxi, peers, bypass=True), {"shape": "isolate", "node": "n1"})
    [action] = ev["actions"]
    assert action["effect"] is False and ev["no_fault_bit"]
    assert ev["lines"][0] == "f1 partition: no connection across the cut was stopped: all 4 probe(s) passed"
