"""Packet faults seen from inside a cluster: datagrams one node sends another are lost at about
the rate the fault sets, only on the links it names, the kernel's counters agree, and the heal
restores every packet. ``netem`` is exercised where the Docker host's kernel has it."""

from __future__ import annotations

import random
import time

import pytest

from faults.packets import Netem, PacketLoss, sidecar_exec
from harness import FaultError
from harness.spec import FaultContext
from tests.faults.docker_cluster import running_cluster

pytestmark = pytest.mark.docker

SENT = 3000
RECEIVE = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.settimeout(3)
seen = set()
open(sys.argv[2] + ".ready", "w").close()
try:
    while True:
        seen.add(s.recvfrom(64)[0])
except OSError:
    pass
open(sys.argv[2], "w").write(str(len(seen)))
"""
SEND = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[3])):
    s.sendto(b"%06d" % i, (sys.argv[1], int(sys.argv[2])))
    if i % 100 == 99:
        time.sleep(0.01)  # stay below the receiver's socket buffer: only the fault may lose them
"""


@pytest.fixture(scope="module")
def cluster():
    with running_cluster("probe", "pkt", 2, plugins=["tests.faults.probe_plugin"]) as c:
        for node in c.nodes.values():
            node.exec(
                [
                    "sh",
                    "-c",
                    f"cat > /opt/udp_recv.py <<'EOF'\n{RECEIVE}\nEOF\n"
                    f"cat > /opt/udp_send.py <<'EOF'\n{SEND}\nEOF",
                ]
            )
        yield c


def delivered(cluster, src: str, dst: str) -> int:
    """How many of SENT distinct datagrams from ``src`` reach ``dst`` (by its address on the run network)."""
    port = random.randrange(20000, 30000)
    out = f"/tmp/udp-{port}"
    cluster.nodes[dst].container.exec_run(["python3", "/opt/udp_recv.py", str(port), out], detach=True)
    for _ in range(100):
        if cluster.nodes[dst].exec(["test", "-f", out + ".ready"])[0] == 0:
            break
        time.sleep(0.05)
    # The sidecar's container name is dst's address on the run network; its host name would
    # resolve to a loopback address of src's own proxies.
    rc, text = cluster.nodes[src].exec(
        ["python3", "/opt/udp_send.py", cluster.nodes[dst].sidecar_name, str(port), str(SENT)], timeout=60
    )
    assert rc == 0, text
    for _ in range(200):
        rc, text = cluster.nodes[dst].exec(["cat", out])
        if rc == 0 and text.strip():
            return int(text)
        time.sleep(0.1)
    raise AssertionError(f"{dst}'s receiver did not finish")


def counters(shown: str) -> tuple[int, int]:
    """(eligible, dropped) packets from ``nft list table`` of a packet-loss table."""
    packets = [
        int(line.split("counter packets ")[1].split()[0])
        for line in shown.splitlines()
        if "counter packets" in line
    ]
    return packets[0], packets[1]


def test_packet_loss_rate_direction_counters_and_heal(cluster) -> None:
    ctx = FaultContext(cluster)
    nodes = list(cluster.topology.nodes)
    assert delivered(cluster, "n2", "n1") == SENT, "nothing is lost before the fault"
    params = PacketLoss.resolve({"node": "n1", "loss": 30, "direction": "in"}, nodes, random.Random(1))
    fault = PacketLoss(ctx, params, "f1")
    done = fault.apply()
    assert [r["sidecar"] for r in done["rules"]] == ["n1"]
    try:
        into = delivered(cluster, "n2", "n1")
        out_of = delivered(cluster, "n1", "n2")
    finally:
        healed = fault.heal()
    # 30 % of 3000: the standard deviation is 25 datagrams, so 150 is six of them.
    assert abs((SENT - into) - 0.3 * SENT) <= 150, into
    assert out_of == SENT, "direction 'in' leaves the node's own packets alone"
    eligible, dropped = counters(healed["counters_before_heal"]["n1"])
    assert eligible >= SENT and abs(dropped / eligible - 0.3) <= 0.05, (eligible, dropped)
    assert dropped >= SENT - into
    assert delivered(cluster, "n2", "n1") == SENT, "the heal restores every packet"

    # direction 'out': the node's packets are lost on arrival at each peer; a final heal clears it.
    PacketLoss(
        ctx, PacketLoss.resolve({"node": "n1", "loss": 50, "direction": "out"}, nodes, random.Random(2)), "f2"
    ).apply()
    assert abs((SENT - delivered(cluster, "n1", "n2")) - 0.5 * SENT) <= 165
    assert PacketLoss.heal_all(ctx) == {"n2": ["brokerchaos_loss_f2"]}
    assert PacketLoss.heal_all(ctx) is None
    assert delivered(cluster, "n1", "n2") == SENT


def test_netem_loss_on_the_node_egress_or_a_clear_refusal(cluster) -> None:
    ctx = FaultContext(cluster)
    rc, out = sidecar_exec(ctx, "n1", "tc qdisc add dev lo root netem delay 1ms && tc qdisc del dev lo root")
    fault = Netem(
        ctx, Netem.resolve({"node": "n1", "loss": 30}, list(cluster.topology.nodes), random.Random(3)), "f3"
    )
    assert fault.tc_args() == ["loss", "30%"]
    if "qdisc kind is unknown" in out:
        with pytest.raises(FaultError, match="no netem queueing discipline"):
            fault.apply()
        assert fault.heal()["removed"] is None  # the nemesis heals a failed apply too: harmless
        assert Netem.heal_all(ctx) is None
        pytest.skip("the Docker host's kernel has no sch_netem: the refusal is checked, the loss cannot be")
    assert rc == 0, out
    assert "netem" in fault.apply()["qdisc"]
    try:
        lost = SENT - delivered(cluster, "n1", "n2")
    finally:
        fault.heal()
    assert abs(lost - 0.3 * SENT) <= 150, lost
    assert delivered(cluster, "n1", "n2") == SENT
    assert Netem.heal_all(ctx) is None
