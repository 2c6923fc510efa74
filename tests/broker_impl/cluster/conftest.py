"""Multi-node fixtures: broker nodes as subprocesses on 127.0.0.x, one cluster address per node."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker_impl.nodes import PERSISTENT, BrokerProc, amqp, declare, drain, free_port, wait_for

__all__ = [
    "HA_SYNCED",
    "PERSISTENT",
    "LinkProxy",
    "Net",
    "NodeProc",
    "amqp",
    "declare",
    "drain",
    "free_port",
    "publish",
    "queue_info",
    "wait_for",
]


class NodeProc(BrokerProc):
    """A cluster node: its ``[cluster]`` table names the peers (and any further cluster settings)."""

    def __init__(
        self, name: str, root: Path, addr: str, cport: int, peers: dict[str, str], cluster: dict[str, Any]
    ) -> None:
        super().__init__(name, root)
        self.addr = addr
        peer_lines = ", ".join(f'{n} = "{a}"' for n, a in peers.items())
        extra = "\n".join(f"{k} = {json.dumps(v)}" for k, v in cluster.items())
        self.config.write_text(
            f'[node]\nname = "{name}"\nhost = "127.0.0.1"\nport = {self.amqp_port}\n'
            f'data_dir = "{self.data_dir}"\nlog_file = "{self.dir / "broker.log"}"\nlog_level = "info"\n'
            f'[cluster]\nnode = "{name}"\nlisten = "{addr}"\nport = {cport}\npeers = {{{peer_lines}}}\n{extra}\n'
        )

    def mirror(self, queue: str, definition: dict[str, Any] | None = None, mirrors: int = 2) -> None:
        """Set the ``ha`` policy (pattern ``^ha``; default ``HA_SYNCED``) through this node; back once
        ``queue`` has ``mirrors`` mirrors, and, under automatic sync, all of them in sync."""
        definition = HA_SYNCED if definition is None else definition
        self.ctl("set_policy", name="ha", pattern="^ha", definition=definition)
        wait_for(
            lambda: len(queue_info(self, queue).get("mirrors", [])) == mirrors, what=f"{mirrors} mirror(s)"
        )
        if definition.get("ha-sync-mode") == "automatic":
            wait_for(
                lambda: len(queue_info(self, queue).get("synchronised_mirrors", [])) == mirrors,
                what=f"{mirrors} mirror(s) in sync",
            )


HA_SYNCED = {"ha-mode": "all", "ha-sync-mode": "automatic"}
"""A mirror on every other node, synchronised automatically."""


class LinkProxy:
    """One direction of one inter-node link (as a Toxiproxy proxy in the harness); ``cut`` drops it.
    ``swallow``: a connection accepted meanwhile is held open and what it is sent discarded, for good
    (a proxy that kept an old toxic on a connection it accepted while its toxics changed). ``silent``: what
    its open connections carry is discarded, nothing closed (a cable pulled: the far end hears nothing, and
    finds out only when its ticks run out)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.cut = False
        self.swallow = False
        self.silent = False
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.cut:
                client.close()
                continue
            if self.swallow:
                with self._lock:
                    self._socks.add(client)
                threading.Thread(target=self._discard, args=(client,), daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                client.close()
                continue
            # The 2 s were for connecting only: a dialled cluster link carries nothing back, and a read
            # timeout on it would close a healthy link every 2 s (a proxy with no cut is a cable).
            upstream.settimeout(None)
            with self._lock:
                self._socks.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self.cut:
                data = src.recv(65536)
                if not data or self.cut:
                    break
                if not self.silent:
                    dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def _discard(self, src: socket.socket) -> None:
        try:
            while src.recv(65536):
                pass
        except OSError:
            pass
        src.close()

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        if cut:
            with self._lock:
                socks, self._socks = self._socks, set()
            for s in socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self.set_cut(True)
        self._server.close()


class Net:
    """The proxies between every ordered pair of nodes."""

    def __init__(self) -> None:
        self.links: dict[tuple[str, str], LinkProxy] = {}

    def partition(self, *groups: list[str]) -> None:
        """Cut every link between nodes of different groups, both ways; heal the rest."""
        side = {n: i for i, g in enumerate(groups) for n in g}
        for (a, b), link in self.links.items():
            link.set_cut(side.get(a, -1) != side.get(b, -2))

    def heal(self) -> None:
        for link in self.links.values():
            link.silent = False
            link.set_cut(False)

    def close(self) -> None:
        for link in self.links.values():
            link.close()


def queue_info(node: NodeProc, queue: str) -> dict[str, Any]:
    return {q["name"]: q for q in node.ctl("list_queues")}.get(queue) or {}


def publish(node: NodeProc, queue: str, bodies: range) -> None:
    """Persistent publishes with confirms: pika raises if any is nacked."""
    c = amqp(node)
    ch = c.channel()
    ch.confirm_delivery()
    for i in bodies:
        ch.basic_publish("", queue, str(i).encode(), PERSISTENT)
    c.close()


@pytest.fixture
def net() -> Iterator[Net]:
    n = Net()
    yield n
    n.close()


@pytest.fixture
def cluster_factory(tmp_path: Path, net: Net) -> Iterator[Callable[..., list[NodeProc]]]:
    """``make(n, proxied=False, **cluster_settings)``; proxied nodes reach each other through ``net``."""
    made: list[NodeProc] = []

    def make(n: int = 3, proxied: bool = False, **cluster: Any) -> list[NodeProc]:
        cport = free_port()
        cluster.setdefault("tick", 0.2)
        names = [f"n{i + 1}" for i in range(n)]
        addrs = {name: f"127.0.0.{i + 2}" for i, name in enumerate(names)}

        def peer_addr(a: str, b: str) -> str:
            if not proxied:
                return f"{addrs[b]}:{cport}"
            link = net.links[(a, b)] = LinkProxy((addrs[b], cport))
            return f"127.0.0.1:{link.port}"

        nodes = [
            NodeProc(
                name,
                tmp_path,
                addrs[name],
                cport,
                {p: peer_addr(name, p) for p in names if p != name},
                cluster,
            )
            for name in names
        ]
        made.extend(nodes)
        for node in nodes:
            node.start()
        wait_for(
            lambda: all(len(nd.ctl("cluster_status")["running"]) == n for nd in nodes),
            what="all nodes running",
        )
        return nodes

    yield make
    for node in made:
        node.stop()
