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

from faults.link_evidence import healed_evidence, held_evidence
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
    """A peer's port: reads what comes and hangs up, like a broker refusing a bad frame; with
    ``answer``, it writes that first (as an AMQP broker answers a bad header with its own)."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, answer: bytes = b"", *, silent: bool = False) -> None:
        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.recv(64)
                if answer:
                    self.request.sendall(answer)
                while silent and self.request.recv(64):  # a peer that answers garbage with silence
                    pass

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


class NoListener:
    """A peer's port with nothing listening on it (a peer that listens only at times, between them)."""

    def __init__(self) -> None:
        self.address = f"127.0.0.1:{free_port()}"


def cluster(
    server: Server, peers: Mapping[str, HangUp | NoListener], *, bypass: bool = False
) -> SimpleNamespace:
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


def _isolated_cleanly(tmp_path: Path, toxi: Server, peers: dict[str, HangUp]) -> dict[str, Any]:
    """n1 isolated and healed, the cut biting and undone with nothing to report: its action."""
    ev = run(tmp_path, Partition, cluster(toxi, peers), {"shape": "isolate", "node": "n1"})
    [action] = ev["actions"]
    assert action["effect"] is True and action["restored"] is True and ev["lines"] == []
    return dict(action)


def test_a_partition_is_proved_by_probes_while_held_and_after_the_heal(
    tmp_path: Path, toxi: Server, peers: dict[str, HangUp]
) -> None:
    action = _isolated_cleanly(tmp_path, toxi, peers)
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


@pytest.fixture
def answering() -> Iterator[dict[str, HangUp]]:
    servers = {n: HangUp(answer=b"AMQP\x00\x00\x09\x01") for n in NODES}
    yield servers
    for s in servers.values():
        s.shutdown()
        s.server_close()


def by_proxy(action: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(lk["proxy"], lk["stream"]): lk["bytes"] for lk in action["facts"]["links"]}


def test_a_cut_that_forgets_one_direction_is_caught_by_the_evidence(
    tmp_path: Path, toxi: Server, answering: dict[str, HangUp]
) -> None:
    ev = run(
        tmp_path,
        ForgetsOneDirection,
        cluster(toxi, answering),
        {"shape": "one-way", "from": "n1", "to": "n2"},
    )
    [action] = ev["actions"]
    assert ev["lines"] == [
        "f1 partition: n1->n2 still carried bytes through n2's proxy n2_to_n1 while cut",
        "f1 partition: n1->n2: n2's proxy n2_to_n1 does not show the cut ({'enabled': True, 'toxics': []})",
        "f1 partition: n1->n2: 8 byte(s) crossed n2's proxy n2_to_n1 (downstream) while cut",
    ]
    assert action["effect"] is True  # the other link was cut: it bit, and the lines say where it did not
    counted = by_proxy(action)
    assert counted[("n1_to_n2", "upstream")]["while_cut"] == {"read": 8, "written": 0}  # the probe, held back
    assert counted[("n2_to_n1", "downstream")]["while_cut"] == {"read": 8, "written": 8}  # the answer crossed


def test_the_byte_counters_show_a_held_cut_and_the_heal(
    tmp_path: Path, toxi: Server, answering: dict[str, HangUp]
) -> None:
    action = _isolated_cleanly(tmp_path, toxi, answering)
    counted = by_proxy(action)
    assert {k: v["while_cut"]["written"] for k, v in counted.items()} == dict.fromkeys(counted, 0)
    assert counted[("n1_to_n2", "upstream")]["while_cut"]["read"] == 8  # the probe, read and dropped
    for k, v in counted.items():  # the probes after the heal crossed: 8 bytes each way
        assert v["after_heal"]["written"] - v["before_heal"]["written"] == 8, k
    assert "while cut 0 byte(s) crossed the cut links, 16 were held back" in action["summary"]


def test_a_one_way_cut_stops_both_its_links_though_the_far_end_hangs_up(
    tmp_path: Path, toxi: Server, peers: dict[str, HangUp]
) -> None:
    """n1->n2 cut: n2's proxy to n1 carries the probe's bytes to n1 (that direction is not cut) and
    n1 hangs up; the close must not cross the cut direction back to n2's probe. It did (the
    default run's majorities-ring partition: "n1->n3 still carried bytes through n3's proxy ...
    while cut" with no byte crossed), so a one-way cut read as half leaked."""
    ev = run(tmp_path, Partition, cluster(toxi, peers), {"shape": "one-way", "from": "n1", "to": "n2"})
    [action] = ev["actions"]
    assert ev["lines"] == [], ev["lines"]
    links = {(lk["proxy"], lk["stream"]): lk for lk in action["facts"]["links"]}
    assert set(links) == {("n1_to_n2", "upstream"), ("n2_to_n1", "downstream")}
    assert {lk["held"]["result"] for lk in links.values()} == {"stalled"}
    assert {lk["after"]["result"] for lk in links.values()} == {"passes"}
    assert action["effect"] is True and action["restored"] is True


def test_a_partition_of_proxies_that_no_longer_carry_the_link_has_no_effect(
    tmp_path: Path, toxi: Server, peers: dict[str, HangUp]
) -> None:
    ev = run(tmp_path, Partition, cluster(toxi, peers, bypass=True), {"shape": "isolate", "node": "n1"})
    [action] = ev["actions"]
    assert action["effect"] is False and ev["no_fault_bit"]
    assert ev["lines"][0] == "f1 partition: no connection across the cut was stopped: all 4 probe(s) passed"


def test_the_counters_prove_a_cut_that_probes_cannot_tell_from_a_silent_peer(
    tmp_path: Path, toxi: Server
) -> None:
    """Probes stall while cut and after the heal alike; the counters show the probes' bytes held
    back at the cut streams while cut and crossing them after the heal."""
    silent = {n: HangUp(silent=True) for n in NODES}
    try:
        ev = run(tmp_path, Partition, cluster(toxi, silent), {"shape": "isolate", "node": "n1"})
    finally:
        for server in silent.values():
            server.shutdown()
            server.server_close()
    [action] = ev["actions"]
    assert {lk["after"]["result"] for lk in action["facts"]["links"]} == {"stalled"}
    assert action["effect"] is True, action["summary"]
    assert "2 confirmed by a probe that passes after the heal or by the counters" in action["summary"]


def test_a_cut_link_with_nothing_listening_behind_its_proxy_is_unanswered_not_a_leak(
    tmp_path: Path, toxi: Server
) -> None:
    """The proxy accepts each probe, fails to connect upstream and closes it: the probe "passes"
    though nothing crossed. The connection counts tell it from a leak; no probe can tell whether
    the cut held, and with no traffic over the hold neither can the counters."""
    ev = run(
        tmp_path,
        Partition,
        cluster(toxi, {n: NoListener() for n in NODES}),
        {"shape": "isolate", "node": "n1"},
    )
    [action] = ev["actions"]
    assert ev["lines"] == [], ev["lines"]
    assert action["effect"] is None, action["summary"]
    assert action["summary"].startswith("no probe could tell whether the cut held")
    links = action["facts"]["links"]
    assert {lk["held"]["result"] for lk in links} == {"passes"}
    assert all(lk["unanswered"] and lk["connections"]["upstream_failed"] >= 1 for lk in links)


def test_unanswered_links_are_proved_cut_by_the_counters_over_the_hold() -> None:
    """A link unanswered at the cut whose cut stream read bytes over the hold and wrote none (a
    peer that connected while cut) was cut: the unmeasured apply becomes bit at the heal."""
    link = {
        "cut": "n1->n2",
        "sidecar": "n1",
        "proxy": "n1_to_n2",
        "stream": "upstream",
        "toxic": "cut_upstream",
    }
    key = "n1/n1_to_n2"

    def counters(read: int, written: int, failed: int) -> dict[str, Any]:
        zero = {"read": 0, "written": 0}
        return {
            "upstream": {"read": read, "written": written},
            "downstream": zero,
            "connections": {"accepted": failed, "upstream_failed": failed},
        }

    held = counters(0, 0, 1)
    api = {
        key: {"enabled": True, "toxics": ["cut_upstream"], "bytes": held, "connections": held["connections"]}
    }
    applied = held_evidence(
        [link], {key: {"result": "passes", "reply": "close"}}, api, {key: counters(0, 0, 0)}
    )
    assert applied.effect is None and applied.flags == ()
    healed = healed_evidence(
        applied,
        {key: {"result": "passes", "reply": "close"}},
        {key: counters(40, 0, 1)},
        {key: counters(40, 0, 2)},
    )
    assert healed.effect is True, healed.summary
    assert healed.summary.startswith("1 of 1 cut link(s) proved cut by the counters over the hold")
    assert "1 confirmed by a probe that passes after the heal or by the counters" in healed.summary
    idle = healed_evidence(
        applied,
        {key: {"result": "passes", "reply": "close"}},
        {key: counters(0, 0, 1)},
        {key: counters(0, 0, 2)},
    )
    assert idle.effect is None  # nothing met the cut stream over the hold: still unmeasured
