"""Master and slave as subprocess nodes on loopback; the slave reaches the master through a proxy
that the tests cut (as Toxiproxy does between containers)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker_impl.cluster.conftest import LinkProxy
from tests.broker_impl.nodes import BrokerProc, free_port, wait_for

__all__ = ["FAST", "Node", "Pair", "wait_for"]

FAST = {"heartbeat_ms": 200, "dead_after_ms": 1500, "sync_timeout_ms": 3000}


class Node(BrokerProc):
    """A master or a slave: its ``[replication]`` table says which, and where the master is."""

    def __init__(self, root: Path, name: str, replication: dict[str, Any], segment_bytes: int) -> None:
        super().__init__(name, root)
        lines = "\n".join(f"{k} = {_toml(v)}" for k, v in {"node": name, **replication}.items())
        self.config.write_text(
            f'[node]\nname = "{name}"\nhost = "127.0.0.1"\nport = {self.amqp_port}\n'
            f'data_dir = "{self.data_dir}"\nlog_file = "{self.dir / "broker.log"}"\n'
            f'[store]\nflush = "async"\nsegment_bytes = {segment_bytes}\n'
            f"[replication]\n{lines}\n"
        )

    def status(self) -> dict[str, Any]:
        return self.ctl("replication_status")


def _toml(v: Any) -> str:
    return str(v) if isinstance(v, int) else f'"{v}"'


class Pair:
    def __init__(self, master: Node, slave: Node, link: LinkProxy) -> None:
        self.master = master
        self.slave = slave
        self.link = link  # slave -> master

    def wait_in_sync(self) -> int:
        """Until the slave reported the master's whole log; returns that offset."""
        return wait_for(
            lambda: (lambda s: s["slaves"] and s["slaves"][0]["acked"] == s["log_end"] and s["log_end"])(
                self.master.status()
            ),
            what="the slave to report the master's log end",
        )


@pytest.fixture
def pair_factory(tmp_path: Path) -> Iterator[Callable[..., Pair]]:
    """``make(role="sync_master", segment_bytes=...)``: a master and a slave, the slave attached."""
    made: list[Node] = []
    links: list[LinkProxy] = []

    def make(role: str = "sync_master", segment_bytes: int = 16384) -> Pair:
        port = free_port()
        master = Node(
            tmp_path, "m", {"role": role, "port": port, "listen": "127.0.0.1", **FAST}, segment_bytes
        )
        link = LinkProxy(("127.0.0.1", port))
        slave = Node(
            tmp_path, "s", {"role": "slave", "master": f"127.0.0.1:{link.port}", **FAST}, segment_bytes
        )
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
