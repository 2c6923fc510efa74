"""Multi-node fixtures: broker nodes as subprocesses on 127.0.0.x, one cluster address per node."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from broker_impl.ctl import CtlError, call

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NodeProc:
    """One broker node process; ``kill()`` is SIGKILL, ``start()`` brings it back on the same data."""

    def __init__(self, name: str, root: Path, addr: str, cport: int, peers: dict[str, str], cluster: dict[str, Any]) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.dir / "data"
        self.addr = addr
        self.amqp_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        peer_lines = ", ".join(f'{n} = "{a}"' for n, a in peers.items())
        extra = "\n".join(f"{k} = {json.dumps(v)}" for k, v in cluster.items())
        self.config = self.dir / "broker.toml"
        self.config.write_text(
            f'[node]\nname = "{name}"\nhost = "127.0.0.1"\nport = {self.amqp_port}\n'
            f'data_dir = "{self.data_dir}"\nlog_file = "{self.dir / "broker.log"}"\nlog_level = "info"\n'
            f'[cluster]\nnode = "{name}"\nlisten = "{addr}"\nport = {cport}\npeers = {{{peer_lines}}}\n{extra}\n'
        )

    def start(self) -> NodeProc:
        (self.data_dir / "node.json").unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker_impl", "--config", str(self.config)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(self.dir / "stderr.log", "ab"),
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        deadline = time.monotonic() + 60  # generous: three nodes starting on a busy 2-core machine
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.name} exited: {(self.dir / 'stderr.log').read_text()[-2000:]}")
            try:
                call(self.data_dir, "status", timeout=2)
                return self
            except (CtlError, OSError, ValueError):
                time.sleep(0.1)
        raise RuntimeError(f"node {self.name} did not start")

    def ctl(self, cmd: str, **args: Any) -> Any:
        return call(self.data_dir, cmd, args)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def log(self) -> str:
        p = self.dir / "broker.log"
        return p.read_text() if p.exists() else ""


class LinkProxy:
    """One direction of one inter-node link (as a Toxiproxy proxy in the harness); ``cut`` drops it."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.cut = False
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
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                client.close()
                continue
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
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

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
            link.set_cut(False)

    def close(self) -> None:
        for link in self.links.values():
            link.close()


PERSISTENT = pika.BasicProperties(delivery_mode=2)


def amqp(node: NodeProc) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp_port, heartbeat=0,
                                                             connection_attempts=1))


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


def drain(node: NodeProc, queue: str) -> list[int]:
    """basic.get with auto-ack until empty; bodies as ints, in delivery order."""
    c = amqp(node)
    ch = c.channel()
    out = []
    while True:
        m, _p, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            break
        out.append(int(body))
    c.close()
    return out


def wait_for(cond: Callable[[], Any], timeout: float = 45.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
            if last:
                return last
        except (CtlError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


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
            NodeProc(name, tmp_path, addrs[name], cport, {p: peer_addr(name, p) for p in names if p != name}, cluster)
            for name in names
        ]
        made.extend(nodes)
        for node in nodes:
            node.start()
        wait_for(lambda: all(len(nd.ctl("cluster_status")["running"]) == n for nd in nodes), what="all nodes running")
        return nodes

    yield make
    for node in made:
        node.stop()
