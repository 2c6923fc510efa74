"""The ``[cluster]`` table of a node's config.

Keys::

    node = "n1"                  # this node's cluster name (default: [node] name)
    peers = ["n2", "n3"]         # names, dialled as <name>:<port>; or a table
                                 # {n2 = "127.0.0.3:25672", ...} of name -> host:port
    port = 25672                 # cluster listen port (and the peers' default port)
    listen = ""                  # address to bind; default: this node's name resolved
    tick = 1.0                   # seconds between heartbeats
    down_after = 3               # ticks without a frame before a peer is down
    partition_handling = "ignore"  # ignore | pause_minority | autoheal (see ``partitions``)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from broker_impl.config import ConfigError

PARTITION_MODES = ("ignore", "pause_minority", "autoheal")

Spawn = Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]
"""How a cluster part runs a background task: the broker's ``spawn`` (failures logged, cancelled at stop)."""


@dataclass(slots=True)
class ClusterConfig:
    node: str
    peers: dict[str, tuple[str, int]] = field(default_factory=dict)
    port: int = 25672
    listen: str = ""
    tick: float = 1.0
    down_after: int = 3
    partition_handling: str = "ignore"

    @classmethod
    def from_table(cls, t: dict[str, Any], default_name: str) -> ClusterConfig | None:
        """None when the node runs alone (no ``[cluster]`` peers)."""
        raw_peers = t.get("peers")
        if not raw_peers:
            return None
        node = str(t.get("node") or default_name)
        port = t.get("port", 25672)
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"cluster.port: expected a port number, got {port!r}")
        peers: dict[str, tuple[str, int]] = {}
        if isinstance(raw_peers, list):
            for name in raw_peers:
                peers[str(name)] = (str(name), port)
        elif isinstance(raw_peers, dict):
            for name, addr in raw_peers.items():
                host, _, p = str(addr).rpartition(":")
                if not host or not p.isdigit():
                    raise ConfigError(f'cluster.peers.{name}: expected "host:port", got {addr!r}')
                peers[str(name)] = (host, int(p))
        else:
            raise ConfigError('cluster.peers: expected a list of node names or a table of name = "host:port"')
        peers.pop(node, None)
        tick = t.get("tick", 1.0)
        if isinstance(tick, bool) or not isinstance(tick, int | float) or tick <= 0:
            raise ConfigError(f"cluster.tick: expected seconds > 0, got {tick!r}")
        down_after = t.get("down_after", 3)
        if isinstance(down_after, bool) or not isinstance(down_after, int) or down_after < 1:
            raise ConfigError(
                f"cluster.down_after: expected a whole number of ticks >= 1, got {down_after!r}"
            )
        mode = t.get("partition_handling", "ignore")
        if mode not in PARTITION_MODES:
            raise ConfigError(
                f"cluster.partition_handling: {mode!r} not allowed; allowed {', '.join(PARTITION_MODES)}"
            )
        return cls(node, peers, port, str(t.get("listen") or node), float(tick), down_after, mode)
