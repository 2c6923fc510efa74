"""Redis Streams from Debian's ``redis-server`` and ``redis-sentinel`` packages, as a brokerchaos plugin;
and Valkey, the fork of Redis 7.2, from ``valkey-server`` and ``valkey-sentinel``, as its sibling.

Versions (``broker.version``): redis ``7.0`` (bookworm's 7.0.15, the default), ``8.0`` (sid's
8.0.6) and ``8.0.2`` (trixie's); valkey ``9.1`` (sid's 9.1.2, its default) and ``8.1`` (trixie's
8.1.1). Valkey is a plugin of its own (``valkey``), a subclass of
this one that differs only in its packages, binaries and version: a scenario names what it runs
as a team names it, and Valkey's versions (8, 9) are not Redis's. Both speak RESP to the same
client plugin (``redis``), with the same settings and the same coverage map.

Every node is one ``redis-server`` with its data (AOF and RDB) in ``data_dir``, so the lazy
filesystem and power loss reach it. ``n1`` starts as the primary, every other node as its
replica (``replicaof n1``). Replication runs over the client port: a replica reaches its
primary by host name, which in the node's namespace resolves to the sidecar's proxy for that
link, so partitions reach it. The server binds its own address and 127.0.0.1 (where the client
proxy forwards), leaving the peers' loopback addresses to the proxies; every replica announces
its host name (``replica-announce-ip``), so nobody learns an address that goes around them.

With ``sentinel: on`` every node also runs ``redis-sentinel`` (port 26379, quorum a majority
of the nodes) that announces host names (``announce-hostnames``): the clients ask it for the
primary (through the node's extra client proxy) and map the name it answers to that node's
client endpoint. Each server's and Sentinel's config is written at the node's first start
only: Sentinel rewrites both after a failover (``CONFIG REWRITE``), and a restarted node must
come back as what Sentinel made it, as it would on a real host.

The queue is a stream (``XADD``) read through one consumer group (``XREADGROUP``/``XACK``);
consumed entries stay in the stream, so after the drain every node's own copy can be read
back (``node_holdings``): what a demoted primary held and lost is the evidence.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

from harness import (
    BrokerPlugin,
    BrokerVersion,
    ClusterError,
    Feature,
    ImageRecipe,
    LogEvent,
    NodeHandle,
    NodeInfo,
    NodeSpec,
    ScenarioError,
    UnsyncedWrite,
    body_ids,
    consumers_giving_back,
    entry_offset,
    hookimpl,
    run_or_fail,
)
from plugins.redis.client import GROUP, MASTER_NAME, brokerchaos_register_clients

__version__ = "0.1.0"
__all__ = ["Redis", "Valkey", "brokerchaos_register_brokers", "brokerchaos_register_clients"]

PORT = 6379
SENTINEL_PORT = 26379
START_SCRIPT = "/usr/local/bin/brokerchaos-redis"
REDIS_TEMPLATE = "/etc/redis/brokerchaos.conf.in"
REDIS_CONF = "/etc/redis/brokerchaos.conf"
SENTINEL_TEMPLATE = "/etc/redis/brokerchaos-sentinel.conf.in"
SENTINEL_CONF = "/etc/redis/brokerchaos-sentinel.conf"
SENTINEL_LOG = "/var/log/redis/sentinel.log"
DATA_DIR = "/var/lib/redis"  # also Valkey's here: its package makes /var/lib/valkey, the start script this

#: redis-server's and Sentinel's line prefix: ``pid:role 27 Nov 2026 15:22:19.397 # ...`` (UTC).
_TIME = re.compile(r"^\d+:[MSCX] (\d\d? \w{3} \d{4} \d\d:\d\d:\d\d\.\d+) ")

#: The rows of the Redis Streams coverage map.
FEATURES: tuple[Feature, ...] = (
    Feature(
        "stream, primary and replicas",
        "a stream on the primary, copied to replicas over asynchronous replication",
        {"sentinel": (False,)},
        nodes=(2, None),
        wanted=("kill", "pause", "partition", "power-loss"),
    ),
    Feature(
        "Sentinel failover",
        "Sentinel on every node promotes a replica when the primary is down to a quorum",
        {"sentinel": (True,)},
        nodes=(3, None),
        wanted=("kill", "partition"),
    ),
    Feature(
        "WAIT for replicas",
        "a publish confirmed only once WAIT reports the replicas asked for",
        {"wait_replicas": (1, 2, 3, 4)},
        nodes=(2, None),
        wanted=("partition",),
    ),
    Feature(
        "fsync on every write",
        "appendfsync always: the AOF is fsynced before the primary replies",
        {"appendfsync": ("always",)},
        wanted=("power-loss",),
    ),
    consumers_giving_back(
        "pending entries left by a consumer, claimed by another with XAUTOCLAIM",
        workload=("crash", "close", "requeue"),
        wanted=("kill",),
    ),
)

#: Redis 7.0's log lines for a failover, a replica's (re)sync and a primary's demotion.
LOG_EVENTS: tuple[LogEvent, ...] = (
    LogEvent("sentinel-odown", r"# \+odown master "),
    LogEvent("sentinel-switch-master", r"# \+switch-master "),
    LogEvent("sentinel-convert-to-replica", r"\+convert-to-slave "),
    LogEvent("full-resync", r"Full resync from master|Full resync requested by replica"),
    LogEvent("replica-sync-done", r"MASTER <-> REPLICA sync: Finished with success"),
    LogEvent("cached-master-discarded", r"Discarding previously cached master state"),
)


# The node's own address is known only once the container runs in its sidecar's namespace. The
# configs are written once: after a failover they hold what Sentinel rewrote into them.
def start_script(server: str = "redis-server", sentinel: str = "redis-sentinel") -> str:
    """The node's broker command, for a server and a Sentinel binary of that name."""
    return rf"""#!/bin/sh
set -eu
ip=$(getent hosts "$(hostname)" | awk '{{print $1; exit}}')
mkdir -p {DATA_DIR}
[ -f {REDIS_CONF} ] || sed "s/@IP@/$ip/" {REDIS_TEMPLATE} > {REDIS_CONF}
if [ -f {SENTINEL_TEMPLATE} ]; then
  [ -f {SENTINEL_CONF} ] || sed "s/@IP@/$ip/" {SENTINEL_TEMPLATE} > {SENTINEL_CONF}
  mkdir -p /var/log/redis
  /usr/bin/{sentinel} {SENTINEL_CONF} &
fi
exec /usr/bin/{server} {REDIS_CONF}
"""


# Read-only scripts (EVAL_RO runs on a replica too): one node's own copy of a stream.
HOLDINGS = """
local out = {}
for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  local id = ''
  for i = 1, #e[2], 2 do if e[2][i] == 'id' then id = e[2][i + 1] end end
  out[#out + 1] = e[1] .. ' ' .. id
end
return out
"""
DEPTH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0} end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local t = {}
  for i = 1, #g, 2 do t[g[i]] = g[i + 1] end
  if t['name'] == ARGV[1] then return {t['lag'] or -1, t['pending']} end
end
return {redis.call('XLEN', KEYS[1]), -2}
"""


def cli(
    node: NodeHandle, *args: str, port: int = PORT, timeout: float = 15.0, binary: str = "redis-cli"
) -> str:
    """``redis-cli`` (or ``binary``) on ``node`` (raw output, one reply element a line); a failing
    command or an error reply is a ``ClusterError``."""
    out = run_or_fail(node, [binary, "-h", "127.0.0.1", "-p", str(port), "--raw", *args], timeout)
    first = out.lstrip().split("\n", 1)[0]
    if first.startswith(("ERR", "LOADING", "NOSCRIPT", "WRONGTYPE", "BUSY", "MASTERDOWN", "NOAUTH")):
        raise ClusterError(f"{node.name}: redis-cli {' '.join(args[:3])}: {out.strip()[:300]}")
    return out


def info_fields(text: str) -> dict[str, str]:
    """An ``INFO`` section's ``key:value`` lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if sep:
            out[key] = value
    return out


class Redis(BrokerPlugin):
    name = "redis"
    version = __version__
    versions: ClassVar[tuple[BrokerVersion, ...]] = (
        BrokerVersion("7.0", "bookworm", ("redis-server", "redis-sentinel"), "7.0.15"),
        BrokerVersion("8.0", "sid", ("redis-server", "redis-sentinel"), "8.0.6"),
        # Debian 13's: named by its upstream version, as "8.0" names sid's newer 8.0.
        BrokerVersion("8.0.2", "trixie", ("redis-server", "redis-sentinel"), "8.0.2"),
    )
    server_binary = "redis-server"
    sentinel_binary = "redis-sentinel"
    cli_binary = "redis-cli"
    protocol = "redis"
    capabilities = frozenset({"kill", "pause", "stop", "power-loss", "partition", "unsynced-messages"})
    client_port = PORT
    # Replication runs over the client port; Sentinels talk to each other and to every server.
    peer_ports = (PORT, SENTINEL_PORT)
    extra_client_ports = (SENTINEL_PORT,)  # clients ask Sentinel for the primary
    # A corrupted AOF or RDB file stops redis-server at load ("Bad file format reading the append
    # only file", "Short read or OOM loading DB"); a flipped bit inside an entry's payload loads.
    corruption_response = "refuse"
    data_dir = DATA_DIR
    log_paths = (SENTINEL_LOG,)  # redis-server logs to stdout: the container log
    features = FEATURES
    log_events = LOG_EVENTS
    event_logs = ("broker.log", "logs/*.log")
    username = "default"
    password = ""
    vhost = ""
    ready_timeout = 60.0
    settings_schema = {
        "appendonly": (True, bool),
        "appendfsync": ("everysec", ("always", "everysec", "no")),
        "min_replicas_to_write": (0, int),  # the primary refuses writes with fewer replicas in lag
        "min_replicas_max_lag": (10, int),  # seconds
        "wait_replicas": (0, int),  # 0: a publish is confirmed by the primary's reply; n: WAIT n
        "sentinel": (False, bool),
        "down_after_ms": (5000, int),  # Sentinel's down-after-milliseconds
        "failover_timeout_ms": (20000, int),
    }

    def log_time(self, line: str) -> datetime | None:
        m = _TIME.match(line)
        if m is None:
            return None
        return datetime.strptime(m.group(1), "%d %b %Y %H:%M:%S.%f").replace(tzinfo=UTC)

    def validate_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        out = super().validate_settings(settings)
        for key, low in (
            ("min_replicas_to_write", 0),
            ("min_replicas_max_lag", 1),
            ("wait_replicas", 0),
            ("down_after_ms", 100),
            ("failover_timeout_ms", 1000),
        ):
            if out[key] < low:
                raise ScenarioError(f"broker.settings.{key}: {out[key]} is out of range; allowed >= {low}")
        return out

    def image(self) -> ImageRecipe:
        return self.release_recipe(f"brokerchaos/{self.name}")

    def unsynced_messages(
        self, writes: Sequence[UnsyncedWrite], settings: Mapping[str, Any], nodes: int
    ) -> list[str]:
        """The append-only file logs each ``XADD`` as the command itself (RESP), the body verbatim:
        the ``.aof`` files (``appendonlydir/appendonly.aof.N.incr.aof`` on 7.0 and later; a base
        rewritten without the RDB preamble, ``.base.aof``). An RDB file, the snapshot or a base in
        RDB form (``.rdb``), compresses its strings and is not mapped: a cut that dropped only those
        reports bytes and files."""
        return sorted({i for w in writes if w["path"].endswith(".aof") for i in body_ids(w["data"])})

    def confirms_after_sync(self, settings: Mapping[str, Any]) -> bool | None:
        """Under ``appendfsync always`` the primary fsyncs the AOF before it answers a write (its
        event loop syncs the buffered commands before it writes any reply): a power cut must then
        find no acknowledged entry unsynced on the node that answered. Otherwise the fsync runs
        each second or when the kernel likes, after the reply: measured, not judged."""
        return settings.get("appendfsync") == "always"

    def cli(self, node: NodeHandle, *args: str, port: int = PORT, timeout: float = 15.0) -> str:
        return cli(node, *args, port=port, timeout=timeout, binary=self.cli_binary)

    def broker_version(self, node: NodeHandle) -> str | None:
        """What the running server says in ``INFO server`` (Valkey: ``valkey_version``; it keeps
        ``redis_version`` at 7.2.4 for clients), with the Debian package it came from."""
        package = super().broker_version(node)
        try:
            info = info_fields(self.cli(node, "INFO", "server"))
        except ClusterError:
            return package
        running = info.get(f"{self.name}_version") or info.get("redis_version")
        if not running or package is None:
            return package
        return f"{self.name} {running} (Debian {package})"

    def server_config(self, node: NodeInfo) -> str:
        s = node.settings
        lines = [
            "bind @IP@ 127.0.0.1",
            f"port {PORT}",
            "protected-mode no",
            "daemonize no",
            'logfile ""',
            f"dir {self.data_dir}",
            f"appendonly {'yes' if s['appendonly'] else 'no'}",
            f"appendfsync {s['appendfsync']}",
            f"replica-announce-ip {node.name}",
            f"replica-announce-port {PORT}",
            f"min-replicas-to-write {s['min_replicas_to_write']}",
            f"min-replicas-max-lag {s['min_replicas_max_lag']}",
        ]
        if node.index > 1:
            lines.append(f"replicaof {primary_of(node)} {PORT}")
        return "\n".join(lines) + "\n"

    def sentinel_config(self, node: NodeInfo) -> str:
        s = node.settings
        quorum = (len(node.peers) + 1) // 2 + 1
        return "\n".join(
            [
                f"port {SENTINEL_PORT}",
                "bind @IP@ 127.0.0.1",
                "protected-mode no",
                "daemonize no",
                f"logfile {SENTINEL_LOG}",
                "dir /tmp",
                "sentinel resolve-hostnames yes",
                "sentinel announce-hostnames yes",
                f"sentinel announce-ip {node.name}",
                f"sentinel announce-port {SENTINEL_PORT}",
                f"sentinel monitor {MASTER_NAME} {primary_of(node)} {PORT} {quorum}",
                f"sentinel down-after-milliseconds {MASTER_NAME} {s['down_after_ms']}",
                f"sentinel failover-timeout {MASTER_NAME} {s['failover_timeout_ms']}",
                f"sentinel parallel-syncs {MASTER_NAME} 1",
                "",
            ]
        )

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        s = node.settings
        nodes = len(node.peers) + 1
        for key in ("wait_replicas", "min_replicas_to_write"):
            if s[key] > nodes - 1:
                raise ScenarioError(
                    f"broker.settings.{key}: {s[key]} replicas, but a cluster of {nodes} has {nodes - 1}"
                )
        files = {
            START_SCRIPT: start_script(self.server_binary, self.sentinel_binary),
            REDIS_TEMPLATE: self.server_config(node),
        }
        if s["sentinel"]:
            files[SENTINEL_TEMPLATE] = self.sentinel_config(node)
        return NodeSpec(command=["/bin/sh", START_SCRIPT], files=files)

    def is_ready(self, node: NodeHandle) -> bool:
        rc, out = node.exec([self.cli_binary, "-h", "127.0.0.1", "-p", str(PORT), "PING"], timeout=10)
        return rc == 0 and out.strip() == "PONG"

    def form_cluster(
        self, nodes: Sequence[NodeHandle], settings: Mapping[str, Any], timeout: float = 90.0
    ) -> None:
        """Wait until the primary lists every replica online and, with Sentinel, every Sentinel
        knows the primary, every replica and every other Sentinel."""
        want = {n.name for n in nodes[1:]}
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            try:
                info = info_fields(self.cli(nodes[0], "INFO", "replication"))
                online = {
                    dict(kv.split("=", 1) for kv in v.split(",") if "=" in kv).get("ip", "")
                    for k, v in info.items()
                    if k.startswith("slave") and k[5:].isdigit() and "state=online" in v
                }
                last = f"primary {nodes[0].name}: replicas online {sorted(online)}"
                if want <= online:
                    if not settings.get("sentinel"):
                        return
                    late = [n.name for n in nodes if not self._sentinel_sees_all(n, len(nodes))]
                    if not late:
                        return
                    last = f"Sentinel does not see every node yet on {', '.join(late)}"
            except ClusterError as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise ClusterError(f"Redis replication did not form in {timeout:.0f}s: {last}")
            time.sleep(1.0)

    def _sentinel_sees_all(self, node: NodeHandle, nodes: int) -> bool:
        lines = self.cli(node, "SENTINEL", "master", MASTER_NAME, port=SENTINEL_PORT).split("\n")
        fields = dict(zip(lines[0::2], lines[1::2], strict=False))
        return (
            int(fields.get("num-slaves", 0)) >= nodes - 1
            and int(fields.get("num-other-sentinels", 0)) >= nodes - 1
        )

    def client_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """What the client needs: where the primary is (Sentinel, or n1) and the publish rule."""
        return {
            "sentinel": bool(settings.get("sentinel")),
            "sentinel_port": SENTINEL_PORT,
            "wait_replicas": int(settings.get("wait_replicas") or 0),
        }

    def queue_depth(self, node: NodeHandle, queue: str, timeout: float) -> tuple[int, int] | None:
        """``(lag, pending)`` of the workload's consumer group in this node's own copy of the
        stream (``XINFO GROUPS``: entries not yet delivered to the group, and delivered but not
        acknowledged); a node without the stream holds nothing: (0, 0)."""
        out = self.cli(node, "EVAL_RO", DEPTH, "1", queue, GROUP, timeout=timeout).split()
        if len(out) != 2:
            raise ClusterError(f"{node.name}: XINFO GROUPS {queue}: {out}")
        lag, pending = int(out[0]), int(out[1])
        if lag == -1:
            raise ClusterError(f"{node.name}: XINFO GROUPS {queue}: the group's lag is unknown")
        if pending == -2:  # the stream is there, the group is not: nothing of it was delivered
            return lag, 0
        return lag, pending

    def node_holdings(self, node: NodeHandle, queue: str) -> list[tuple[int | None, str]] | None:
        """This node's own copy of the stream (``XRANGE``), entry ids as their sparse offsets
        (``harness.spec.entry_offset``)."""
        out = self.cli(node, "EVAL_RO", HOLDINGS, "1", queue, timeout=60)
        held: list[tuple[int | None, str]] = []
        for line in out.splitlines():
            entry, _, msg_id = line.strip().partition(" ")
            if entry:
                held.append((entry_offset(entry), msg_id))
        return held


def primary_of(node: NodeInfo) -> str:
    """The node every node starts following: the first."""
    return node.name if node.index == 1 else sorted((node.name, *node.peers), key=lambda n: int(n[1:]))[0]


class Valkey(Redis):
    """Valkey: Redis's plugin with Valkey's packages and binaries (see the module's docstring)."""

    name = "valkey"
    versions = (
        BrokerVersion("9.1", "sid", ("valkey-server", "valkey-sentinel", "valkey-tools"), "9.1.2"),
        BrokerVersion("8.1", "trixie", ("valkey-server", "valkey-sentinel", "valkey-tools"), "8.1.1"),
    )
    server_binary = "valkey-server"
    sentinel_binary = "valkey-sentinel"
    cli_binary = "valkey-cli"


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    register.add_broker(Redis())
    register.add_broker(Valkey())
