"""Broker plugins that exercise contract points of ``harness.spec.broker``, for the conformance tests.

Each runs the reference broker's image. ``peers-on-client-port`` runs no broker at all but a
small TCP server per node that answers every connection with its node's name, on its client
port, which it also lists among its peer ports (as a broker that replicates over its client
port does); bound to its own host name's address and to 127.0.0.1, never the wildcard, so the
sidecar's peer proxies can listen on that port at the peers' loopback addresses.
"""

from __future__ import annotations

from typing import Any

from harness import NodeHandle, NodeInfo, NodeSpec, hookimpl
from plugins.reference import ReferenceBroker

ECHO_PORT = 5999

#: Answers each connection with the node's name, on its own address and on loopback.
ECHO_SERVER = f"""
import socket, socketserver, threading
name = socket.gethostname()
class Reply(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall(name.encode() + b"\\n")
class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
servers = [Server((addr, {ECHO_PORT}), Reply) for addr in (socket.gethostbyname(name), "127.0.0.1")]
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
print("serving", name, flush=True)
servers[0].serve_forever()
"""

#: Run on a node: connect to a host name on the echo port and print what it answers.
ASK = (
    "import socket, sys\n"
    f"with socket.create_connection((sys.argv[1], {ECHO_PORT}), timeout=3) as s:\n"
    "    print(s.makefile().readline().strip())\n"
)


class PeersOnClientPort(ReferenceBroker):
    name = "peers-on-client-port"
    client_port = ECHO_PORT
    peer_ports = (ECHO_PORT,)
    capabilities = frozenset({"partition"})

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        return NodeSpec(command=["python3", "-c", ECHO_SERVER])

    def is_ready(self, node: NodeHandle) -> bool:
        rc, out = node.exec(["python3", "-c", ASK, "127.0.0.1"], timeout=10)
        return rc == 0 and out.strip() == node.name

    def form_cluster(self, nodes: Any, settings: Any) -> None:
        pass


class ClientProxyPeer(ReferenceBroker):
    """Lists the port every sidecar's client proxy takes (40000 + 5672 % 10000) as a peer port."""

    name = "client-proxy-peer"
    peer_ports = (45672,)


class UnknownCorruptionResponse(ReferenceBroker):
    name = "unknown-corruption-response"
    corruption_response = "repair"


class RefusesCorruption(ReferenceBroker):
    name = "refuses-corruption"
    corruption_response = "refuse"


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    for cls in (PeersOnClientPort, ClientProxyPeer, UnknownCorruptionResponse, RefusesCorruption):
        register.add_broker(cls())
