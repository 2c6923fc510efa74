"""Master and slave as subprocess nodes on loopback; the slave reaches the master through a proxy
that the tests cut (as Toxiproxy does between containers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_impl.ctl import CtlError, call
from tests.broker_impl.cluster.conftest import LinkProxy, free_port

REPO = Path(__file__).resolve().parents[3]
FAST = {"heartbeat_ms": 200, "dead_after_ms": 1500, "sync_timeout_ms": 3000}


class Node:
    """One node process; ``kill()`` is SIGKILL, ``start()`` brings it back on the same data."""

    def __init__(self, root: Path, name: str, replication: dict[str, Any], segment_bytes: int) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.dir / "data"
        self.amqp_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        lines = "\n".join(f"{k} = {_toml(v)}" for k, v in {"node": name, **replication}.items())
        self.config = self.dir / "broker.toml"
        self.config.write_text(
            f'[node]\nname = "{name}"\nhost = "127.0.0.1"\nport = {self.amqp_port}\n'
            f'data_dir = "{self.data_dir}"\nlog_file = "{self.dir / "broker.log"}"\n'
            f'[store]\nflush = "async"\nsegment_bytes = {segment_bytes}\n'
            f"[replication]\n{lines}\n"
        )

    def start(self, wait: bool = True) -> Node:
        (self.data_dir / "node.json").unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker_impl", "--config", str(self.config)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(self.dir / "stderr.log", "ab"),
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        if wait:
            self.wait_serving()
        return self

    def wait_serving(self) -> None:
        deadline = time.monotonic() + 60  # generous: a busy 2-core machine
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"node {self.name} exited: {(self.dir / 'stderr.log').read_text()[-2000:]}")
            try:
                call(self.data_dir, "status", timeout=2)
                return
            except (CtlError, OSError, ValueError):
                time.sleep(0.1)
        raise RuntimeError(f"node {self.name} did not start")

    def ctl(self, cmd: str, **args: Any) -> Any:
        return call(self.data_dir, cmd, args)

    def status(self) -> dict[str, Any]:
        return self.ctl("replication_status")

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


def _toml(v: Any) -> str:
    return str(v) if isinstance(v, int) else f'"{v}"'


class Pair:
    def __init__(self, master: Node, slave: Node, link: LinkProxy) -> None:
        self.master = master
        self.slave = slave
        self.link = link  # slave -> master

    def wait_in_sync(self) -> int:
        """Until the slave reported the master's whole log; returns that offset."""
        return wait_for(lambda: (lambda s: s["slaves"] and s["slaves"][0]["acked"] == s["log_end"] and s["log_end"])(
            self.master.status()), what="the slave to report the master's log end")


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
def pair_factory(tmp_path: Path) -> Iterator[Callable[..., Pair]]:
    """``make(role="sync_master", segment_bytes=...)``: a master and a slave, the slave attached."""
    made: list[Node] = []
    links: list[LinkProxy] = []

    def make(role: str = "sync_master", segment_bytes: int = 16384) -> Pair:
        port = free_port()
        master = Node(tmp_path, "m", {"role": role, "port": port, "listen": "127.0.0.1", **FAST}, segment_bytes)
        link = LinkProxy(("127.0.0.1", port))
        slave = Node(tmp_path, "s", {"role": "slave", "master": f"127.0.0.1:{link.port}", **FAST}, segment_bytes)
        made.extend((master, slave))
        links.append(link)
        master.start()
        slave.start()
        wait_for(lambda: master.status()["slaves"], what="the slave to attach")
        return Pair(master, slave, link)

    yield make
    for n in made:
        n.stop()
    for link in links:
        link.close()
