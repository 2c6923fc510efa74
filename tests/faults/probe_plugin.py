"""A broker plugin whose "broker" is a TCP probe, for checking the network faults themselves.

Each node listens on its peer port at its own address and appends every line it
receives to a file; ``hears(A, B)`` asks A to connect to B and send a token, then
asks B whether the token arrived. That is the directed reachability a partition
must change: B hears A unless the cut (A, B) is in place.
"""

from __future__ import annotations

from typing import Any

from harness import BrokerPlugin, ImageRecipe, NodeHandle, NodeInfo, NodeSpec, hookimpl
from plugins.reference import ReferenceBroker

PEER_PORT = 25999
PROBE = r"""
import socket, socketserver, sys, threading
host = socket.gethostbyname(socket.gethostname())
class H(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            with open("/tmp/heard", "ab") as f:
                f.write(line)
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
threading.Thread(target=S(("0.0.0.0", 5672), H).serve_forever, daemon=True).start()
S((host, int(sys.argv[1])), H).serve_forever()
"""
SEND = r"""
import socket, sys, time
peer, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    s = socket.create_connection((peer, port), timeout=2)
    s.sendall(token.encode() + b"\n")
    time.sleep(0.5)
    s.close()
except OSError as e:
    print("connect failed:", e)
"""


class Probe(BrokerPlugin):
    name = "probe"
    version = "1"
    capabilities = frozenset({"partition"})
    client_port = 5672
    peer_ports = (PEER_PORT,)
    data_dir = "/tmp"
    ready_timeout = 30.0

    def image(self) -> ImageRecipe:
        return ReferenceBroker().image()

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        return NodeSpec(
            command=["python3", "/opt/probe.py", str(PEER_PORT)],
            files={"/opt/probe.py": PROBE, "/opt/send.py": SEND},
        )

    def is_ready(self, node: NodeHandle) -> bool:
        rc, out = node.exec(["sh", "-c", f"ss -ltn | grep -q ':{PEER_PORT} '"], timeout=5)
        return rc == 0


def hears(cluster: Any, src: str, dst: str, token: str, attempts: int = 3) -> bool:
    """Does ``dst`` receive bytes ``src`` sends it over the inter-node link?

    A link is heard if any of a few attempts gets through (a loaded machine can delay
    one); a cut link fails them all.
    """
    import time

    for attempt in range(attempts):
        tok = f"{token}-{attempt}"
        cluster.nodes[src].exec(["python3", "/opt/send.py", dst, str(PEER_PORT), tok], timeout=10)
        for _ in range(5):
            rc, out = cluster.nodes[dst].exec(["cat", "/tmp/heard"], timeout=5)
            if tok in out:
                return True
            time.sleep(0.2)
    return False


def client_reaches(cluster: Any, node: str, token: str, wait: float = 10.0) -> bool:
    """Do bytes a client sends to ``node``'s published client port arrive at the node?

    Polled for ``wait`` seconds: a loaded machine delays the write, a cut never lets it happen.
    """
    import socket
    import time

    try:
        with socket.create_connection(cluster.client_endpoints()[node], timeout=2) as s:
            s.sendall(token.encode() + b"\n")
            time.sleep(0.5)
    except OSError:
        return False
    deadline = time.monotonic() + wait
    while True:
        rc, out = cluster.nodes[node].exec(["cat", "/tmp/heard"], timeout=5)
        if token in out:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    register.add_broker(Probe())
