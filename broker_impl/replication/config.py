"""The ``[replication]`` table of a node's config (master-slave replication, RocketMQ style).

Keys::

    role = "sync_master"         # sync_master | async_master | slave
    port = 10912                 # master: where slaves connect (RocketMQ's haListenPort)
    listen = ""                  # master: address to bind; default: this node's name resolved
    node = ""                    # this node's name as its peers know it (default: [node] name)
    master = "n1"                # slave: the master's host (or "host:port"; port defaults to ``port``)
    sync_timeout_ms = 5000       # sync_master: a confirm waits this long for the slave (syncFlushTimeout)
    max_lag_bytes = 268435456    # sync_master: a slave further behind is not in sync (haMaxGapNotInSync)
    heartbeat_ms = 1000          # both ends say something at least this often (haSendHeartbeatInterval: 5 s)
    dead_after_ms = 5000         # a peer silent this long is dropped (haHousekeepingInterval: 20 s)

A node has either ``[cluster]`` (GM mirrored queues) or ``[replication]``, not both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker_impl.config import ConfigError

ROLES = ("sync_master", "async_master", "slave")
_INTS = {
    "port": (1, 65535),
    "sync_timeout_ms": (1, None),
    "max_lag_bytes": (1, None),
    "heartbeat_ms": (10, None),
    "dead_after_ms": (10, None),
}
_KNOWN = {"role", "listen", "node", "master", *_INTS}


@dataclass(slots=True, frozen=True)
class ReplicationConfig:
    role: str
    node: str
    port: int = 10912
    listen: str = ""
    master: tuple[str, int] | None = None
    sync_timeout_ms: int = 5000
    max_lag_bytes: int = 256 * 1024 * 1024
    heartbeat_ms: int = 1000
    dead_after_ms: int = 5000

    @property
    def is_master(self) -> bool:
        return self.role != "slave"

    @classmethod
    def from_table(cls, t: dict[str, Any], default_name: str) -> ReplicationConfig | None:
        """None when the table is absent (the node does not replicate this way)."""
        if not t:
            return None
        for key in t:
            if key not in _KNOWN:
                raise ConfigError(f"replication.{key}: unknown key; allowed {', '.join(sorted(_KNOWN))}")
        role = t.get("role")
        if role not in ROLES:
            raise ConfigError(f"replication.role: {role!r} not allowed; allowed {', '.join(ROLES)}")
        ints: dict[str, int] = {}
        for key, (lo, hi) in _INTS.items():
            if key not in t:
                continue
            value = t[key]
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < lo
                or (hi is not None and value > hi)
            ):
                allowed = f"{lo}..{hi}" if hi is not None else f">= {lo}"
                raise ConfigError(f"replication.{key}: expected a whole number {allowed}, got {value!r}")
            ints[key] = value
        port = ints.get("port", 10912)
        master = None
        if role == "slave":
            raw = t.get("master")
            if not isinstance(raw, str) or not raw:
                raise ConfigError('replication.master: a slave needs its master\'s host, e.g. master = "n1"')
            host, sep, p = raw.rpartition(":")
            if sep and not p.isdigit():
                raise ConfigError(f'replication.master: expected "host" or "host:port", got {raw!r}')
            master = (host, int(p)) if sep else (raw, port)
        elif "master" in t:
            raise ConfigError(f"replication.master: only a slave names a master (role is {role!r})")
        if ints.get("dead_after_ms", 5000) <= ints.get("heartbeat_ms", 1000):
            raise ConfigError("replication.dead_after_ms: must be longer than heartbeat_ms")
        node = str(t.get("node") or default_name)
        return cls(role, node, listen=str(t.get("listen") or node), master=master, **ints)
