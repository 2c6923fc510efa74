"""NATS JetStream from Debian's ``nats-server`` package, as a brokerchaos plugin.

Versions (``broker.version``): ``2.9`` (bookworm's 2.9.10, the default), ``2.10`` (trixie's 2.10.27)
and ``2.15`` (sid's 2.15.1).

Every node is one ``nats-server`` with JetStream (file storage in ``data_dir``, so
the lazy filesystem and power loss reach it) and explicit routes to every peer by
host name: in the node's namespace a peer's name resolves to the sidecar's proxy
for that link, so partitions and link toxics reach the route traffic. The route
listener binds the node's own address (the proxies hold the same port on the
peers' loopback addresses); each server advertises its host name, never its
address, so neither the peers (implicit routes) nor the clients (``connect_urls``)
learn a way around the proxies.

Two accounts: ``APP`` (JetStream, the workload's user) and ``SYS``, the system
account, whose user lets the client read each server's own view of each stream
(``$SYS.REQ.SERVER.<id>.JSZ``) for the replica comparison after the drain, and lets
the plugin change membership (``$JS.API.SERVER.REMOVE``).

Membership (capability ``membership``): JetStream's meta group is a Raft group whose peer
ids are hashes of the servers' names, so a server removed from it must never come back
under its name (the nats-server maintainers, issue 7545). A node's server name is kept in a
file the start script reads: ``n2`` first, ``n2-2`` after its first removal and return, with
an empty store. Everything the servers report by name is mapped back to the node
(``server_node``).

JetStream 2.9.10 has no fsync setting: ``sync_interval``/``sync: always`` came
with 2.10 (the config parser here rejects ``sync_interval`` as an unknown field).
The file store writes through the page cache and syncs on its own timer, so a
publish ack does not mean the message is on disk. From 2.10 the ``sync_interval``
setting sets that timer (default two minutes) or, ``always``, syncs every write.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
    NotYet,
    ScenarioError,
    UnsyncedWrite,
    body_ids,
    consumers_giving_back,
    control_broker,
    hookimpl,
    membership_change,
    poll,
    run_or_fail,
)
from plugins.nats import filestore, raftlog, sysreq
from plugins.nats.client import CONSUMER, ID_HEADER, brokerchaos_register_clients
from plugins.nats.membership import (
    LEADER_JSZ,
    REMOVE_SUBJECT,
    meta_peers,
    name_peers,
    next_server_name,
    remove_request,
    server_names,
    server_node,
    unnamed_peers,
)

__version__ = "0.1.0"
__all__ = ["Nats", "brokerchaos_register_brokers", "brokerchaos_register_clients"]

START_SCRIPT = "/usr/local/bin/brokerchaos-nats"
TEMPLATE = "/etc/nats/nats.conf.in"
CONF = "/etc/nats/nats.conf"
NAME_FILE = "/etc/nats/server_name"  # the node's current server name (membership changes rename it)
ROUTE_PORT = 6222
MONITOR_PORT = 8222
SYSTEM_USER = ("sys", "sys")
SERVER_NAMES = server_names()  # what an unnamed peer of the meta group can be called

# Runs as the node's broker command (under faults.nodeinit): the route listener gets the
# node's own address, known only once the container runs in its sidecar's namespace.
START = rf"""#!/bin/sh
set -eu
ip=$(getent hosts "$(hostname)" | awk '{{print $1; exit}}')
name=$(cat {NAME_FILE})
sed -e "s/@ROUTE_IP@/$ip/" -e "s/@SERVER_NAME@/$name/" {TEMPLATE} > {CONF}
exec /usr/sbin/nats-server -c {CONF}
"""

# A monitoring endpoint read inside the container (no curl in the image; python3 is there).
FETCH = (
    "import sys, urllib.request; "
    f"print(urllib.request.urlopen('http://127.0.0.1:{MONITOR_PORT}' + sys.argv[1], timeout=5).read().decode())"
)


def monitor(node: NodeHandle, path: str, timeout: float = 15.0) -> dict[str, Any]:
    """One monitoring endpoint of ``node`` as JSON (``ClusterError`` if it does not answer)."""
    out = run_or_fail(node, ["python3", "-c", FETCH, path], timeout=timeout)
    try:
        data = json.loads(out)
    except json.JSONDecodeError:
        raise ClusterError(f"{node.name}: {path} printed no JSON: {out.strip()[-200:]}") from None
    if not isinstance(data, dict):
        raise ClusterError(f"{node.name}: {path} printed {out.strip()[-200:]}")
    return data


def stream_detail(jsz: Mapping[str, Any], stream: str) -> dict[str, Any] | None:
    """The stream's entry in a ``/jsz?accounts=true&streams=true`` answer, if this server holds it."""
    for account in jsz.get("account_details") or ():
        for s in account.get("stream_detail") or ():
            if s.get("name") == stream:
                return dict(s)
    return None


STREAM = r"'(?P<account>[^']*) > (?P<stream>[^']+)'"
#: nats-server's own line prefix: ``[pid] 2006/01/02 15:04:05.000000 [INF] ...`` (UTC in the image).
_TIME = re.compile(r"^\[\d+\] (\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+)")

#: The rows of the NATS JetStream coverage map.
FEATURES: tuple[Feature, ...] = (
    Feature(
        "stream, replicated",
        "a file-backed JetStream stream with replicas (R3, or every node of a smaller cluster)",
        {"replicas": (None, 3, 5)},
        nodes=(2, None),
        wanted=("kill", "pause", "partition", "power-loss"),
    ),
    Feature(
        "stream, one replica",
        "a file-backed JetStream stream on one server",
        {"replicas": (1,)},
        wanted=("kill", "power-loss"),
    ),
    consumers_giving_back(
        "naks, and deliveries left unacked until ack_wait sends them again",
        wanted=("kill", "partition"),
    ),
    membership_change(
        "a server leaves the meta group ($JS.API.SERVER.REMOVE) and joins again under a new name, empty"
    ),
)

#: nats-server 2.9's log lines for stream leadership and replica catch-up.
LOG_EVENTS: tuple[LogEvent, ...] = (
    LogEvent("stream-leader-elected", r"JetStream cluster new stream leader for " + STREAM),
    LogEvent("consumer-leader-elected", r"JetStream cluster new consumer leader for " + STREAM),
    LogEvent("catchup-complete", r"Catchup for stream " + STREAM + " complete"),
    LogEvent("catchup-stalled", r"Catchup for stream " + STREAM + " stalled|Catching up for .* stalled"),
    LogEvent("no-quorum", r"JetStream cluster stream " + STREAM + " has NO quorum, stalled"),
)


#: The JetStream releases Debian serves; 2.9 first (the default: nothing new to build).
VERSIONS = (
    BrokerVersion("2.9", "bookworm", ("nats-server",), "2.9.10", note="no sync_interval setting"),
    BrokerVersion("2.10", "trixie", ("nats-server",), "2.10.27", note="sync_interval: default 2m, or always"),
    BrokerVersion("2.15", "sid", ("nats-server",), "2.15.1", note="sync_interval: default 2m, or always"),
)
#: ``sync_interval``: the server's default (two minutes), ``always``, or a Go duration.
SYNC = re.compile(r"^(always|\d+(ms|s|m|h))$")


class Nats(BrokerPlugin):
    name = "nats"
    version = __version__
    versions = VERSIONS
    protocol = "nats"
    capabilities = frozenset(
        {"kill", "pause", "stop", "power-loss", "partition", "membership", "unsynced-messages"}
    )
    client_port = 4222
    peer_ports = (ROUTE_PORT,)
    data_dir = "/var/lib/nats/jetstream"
    log_paths = ()  # nats-server logs to stderr: the container log
    features = FEATURES
    log_events = LOG_EVENTS
    username = "guest"
    password = "guest"
    vhost = "APP"  # the account the workload's user belongs to
    ready_timeout = 60.0
    settings_schema = {
        "replicas": (None, (None, 1, 3, 5)),  # None: 3, or every node of a smaller cluster
        "max_file_store": ("1G", str),
        "consumer_replicas": (None, (None, 1, 3, 5)),  # None: as many as the stream
        "ack_wait": (10, int),  # seconds before an unacked delivery goes out again
        # JetStream's fsync timer (2.10 on): None leaves the server's default (2 minutes).
        "sync_interval": (None, None),
    }

    def log_time(self, line: str) -> datetime | None:
        m = _TIME.match(line)
        if m is None:
            return None
        return datetime.strptime(m.group(1), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=UTC)

    def validate_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        out = super().validate_settings(settings)
        if out["ack_wait"] < 1:
            raise ScenarioError(f"broker.settings.ack_wait: {out['ack_wait']} is out of range; allowed >= 1")
        sync = out["sync_interval"]
        if sync is not None and (not isinstance(sync, str) or not SYNC.match(sync)):
            raise ScenarioError(
                f"broker.settings.sync_interval: {sync!r}; use 'always' or a duration such as '2m' or '10s'"
            )
        if sync is not None and self.release is VERSIONS[0]:
            raise ScenarioError(
                "broker.settings.sync_interval: nats-server 2.9 has no such setting (it came with 2.10); "
                'remove it or set broker.version: "2.10" or "2.15"'
            )
        return out

    def image(self) -> ImageRecipe:
        return self.release_recipe("brokerchaos/nats")

    def broker_version(self, node: NodeHandle) -> str | None:
        """What the running server says in ``/varz``, with the Debian package it came from."""
        package = super().broker_version(node)
        try:
            running = monitor(node, "/varz").get("version")
        except ClusterError:
            return package
        if not running or package is None:
            return package
        return f"nats-server {running} (Debian {package})"

    def config(self, node: NodeInfo) -> str:
        s = node.settings
        routes = ", ".join(f'"nats-route://{p}:{ROUTE_PORT}"' for p in node.peers)
        user, password = SYSTEM_USER
        lines = [
            "server_name: @SERVER_NAME@",
            f"listen: 0.0.0.0:{self.client_port}",
            f"http: 127.0.0.1:{MONITOR_PORT}",
            "jetstream {",
            f'  store_dir: "{self.data_dir}"',
            f"  max_file_store: {s['max_file_store']}",
            "  max_memory_store: 64M",
            *([f"  sync_interval: {s['sync_interval']}"] if s.get("sync_interval") else []),
            "}",
            "accounts {",
            f'  {self.vhost}: {{ jetstream: enabled, users: [{{user: "{self.username}", password: "{self.password}"}}] }}',
            f'  SYS: {{ users: [{{user: "{user}", password: "{password}"}}] }}',
            "}",
            "system_account: SYS",
            "",
        ]
        if node.peers:  # a single node runs JetStream standalone: a cluster needs routes
            lines[-1:-1] = [
                "cluster {",
                f'  name: "{node.cluster}"',
                f'  listen: "@ROUTE_IP@:{ROUTE_PORT}"',
                f'  advertise: "{node.name}:{ROUTE_PORT}"',
                "  no_advertise: true",
                f"  routes: [{routes}]",
                "}",
            ]
        return "\n".join(lines)

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        if len(node.peers) + 1 < int(node.settings["replicas"] or 1):
            raise ScenarioError(
                f"broker.settings.replicas: {node.settings['replicas']} replicas need at least as "
                f"many nodes; the cluster has {len(node.peers) + 1}"
            )
        return NodeSpec(
            command=["/bin/sh", START_SCRIPT],
            files={START_SCRIPT: START, TEMPLATE: self.config(node), NAME_FILE: node.name},
        )

    def is_ready(self, node: NodeHandle) -> bool:
        rc, _ = node.exec(["python3", "-c", FETCH, "/varz"], timeout=10)
        return rc == 0

    def form_cluster(
        self, nodes: Sequence[NodeHandle], settings: Mapping[str, Any], timeout: float = 90.0
    ) -> None:
        """Wait until the meta group has a leader, knows every server and each is current,
        and every server's ``/healthz`` says JetStream is ready."""
        want = {n.name for n in nodes}

        def formed() -> None | NotYet:
            try:
                meta = monitor(nodes[0], "/jsz").get("meta_cluster") or {}
                leader = next((n for n in nodes if n.name == server_node(meta.get("leader") or "")), None)
                if leader is not None and leader is not nodes[0]:  # only the leader lists the replicas
                    meta = monitor(leader, "/jsz").get("meta_cluster") or {}
                peers = {server_node(name) for name, p in meta_peers(meta).items() if p.get("current")}
                if not (len(nodes) == 1 or (meta.get("leader") and want <= peers)):
                    return NotYet(f"meta group {json.dumps(meta)[:300]}")
                unhealthy = [
                    n.name for n in nodes if n.exec(["python3", "-c", FETCH, "/healthz"], 10)[0] != 0
                ]
            except ClusterError as exc:
                return NotYet(str(exc))
            return NotYet(f"not healthy yet: {', '.join(unhealthy)}") if unhealthy else None

        poll(
            formed,
            timeout=timeout,
            failure=f"JetStream cluster did not form in {timeout:.0f}s (want {sorted(want)})",
        )

    def queue_arguments(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """What the client needs to create the streams and read each server's view of them."""
        user, password = SYSTEM_USER
        return {
            "replicas": settings.get("replicas"),
            "consumer_replicas": settings.get("consumer_replicas"),
            "ack_wait": settings.get("ack_wait", 10),
            "system_user": user,
            "system_password": password,
        }

    def queue_depth(self, node: NodeHandle, queue: str, timeout: float) -> tuple[int, int] | None:
        """``(num_pending, num_ack_pending)`` of the workload's consumer on the queue's stream, as
        this server's ``/jsz`` shows it; None if the server holds no replica of the stream or is
        not the consumer's leader (a follower's counts lag: the drain asks the JetStream API)."""
        jsz = monitor(node, f"/jsz?acc={self.vhost}&streams=true&consumers=true", timeout=timeout)
        stream = stream_detail(jsz, queue)
        if stream is None:
            return None
        for c in stream.get("consumer_detail") or ():
            if c.get("name") == CONSUMER:
                leader = (c.get("cluster") or {}).get("leader")
                if leader is not None and server_node(leader) != node.name:
                    return None  # a follower's num_pending is not kept current (seen: the whole stream)
                return int(c.get("num_pending") or 0), int(c.get("num_ack_pending") or 0)
        raise ClusterError(f"{node.name}: stream {queue!r} has no consumer {CONSUMER!r} in /jsz")

    def node_holdings(self, node: NodeHandle, queue: str) -> list[tuple[int | None, str]] | None:
        """What ``node``'s own replica of the queue's stream holds: (stream sequence, message id)
        for every record of its message blocks whose checksum holds, read from the node's files
        (``plugins.nats.filestore``, run with the container's python3), never through the
        JetStream API (which answers from the stream's leader).

        A node with no files of the stream holds nothing ([]) if its ``/jsz`` lists the stream
        (it is a replica) and None if not (not a replica here, or it dropped the stream: the
        drain's per-server views say which)."""
        source = Path(filestore.__file__).read_text()
        out = run_or_fail(node, ["python3", "-c", source, self.data_dir, queue, ID_HEADER], timeout=300)
        try:
            read = json.loads(out.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            raise ClusterError(
                f"{node.name}: reading {queue!r}'s message blocks printed {out.strip()[-200:]}"
            ) from None
        if not read["found"]:
            jsz = monitor(node, f"/jsz?acc={self.vhost}&streams=true")
            return [] if stream_detail(jsz, queue) is not None else None
        return [(int(seq), str(msg_id)) for seq, msg_id in read["entries"]]

    # -- membership ---------------------------------------------------------------------------

    def system_request(self, node: NodeHandle, subject: str, body: bytes, wait: float = 5.0) -> list[Any]:
        """One system-account request through ``node``'s own server (``plugins.nats.sysreq``, run
        in its container): the replies gathered within ``wait`` (none: nobody answered)."""
        user, password = SYSTEM_USER
        source = Path(sysreq.__file__).read_text()
        args = [str(self.client_port), user, password, subject, body.decode(), f"{wait:g}"]
        out = run_or_fail(node, ["python3", "-c", source, *args], timeout=wait + 15)
        try:
            return list(json.loads(out.strip().splitlines()[-1])["replies"])
        except (json.JSONDecodeError, IndexError, KeyError, TypeError):
            raise ClusterError(f"{node.name}: request {subject} printed {out.strip()[-200:]}") from None

    def meta_group(self, node: NodeHandle) -> dict[str, dict[str, Any]]:
        """The meta group's peers by server name, as its leader lists them, asked through ``node``
        (``ClusterError`` if no leader answers: none, or ``node`` cut off from it)."""
        subject, body = LEADER_JSZ
        for reply in self.system_request(node, subject, body):
            meta = ((reply or {}).get("data") or {}).get("meta_cluster") if isinstance(reply, dict) else None
            if meta and meta.get("leader") == ((reply.get("server") or {}).get("name")):
                return name_peers(meta_peers(meta), SERVER_NAMES)
        raise ClusterError(f"{node.name}: no meta leader answered")

    def server_name(self, node: NodeHandle) -> str:
        """The name ``node``'s server runs (or will run) under."""
        return run_or_fail(node, ["cat", NAME_FILE]).strip() or node.name

    def unsynced_messages(
        self, writes: Sequence[UnsyncedWrite], settings: Mapping[str, Any], nodes: int
    ) -> list[str]:
        """The blocks that hold a stream's messages as the store of record (``raftlog``): a
        replicated stream's Raft log (the stream's own blocks are derived from it and rebuilt
        from it), an R1 stream's own blocks (a standalone server's streams are R1). Both hold
        the payload verbatim, except a Raft log's S2-compressed append (over 8 KiB on 2.15, 4 KiB
        on 2.9.10): its id cannot be read, so a dropped write holding one is an error (the cut's
        exposure unmeasured, not undercounted)."""
        replicated = nodes > 1 and int(settings.get("replicas") or min(3, nodes)) > 1
        held = [w for w in writes if raftlog.message_blocks(w["path"], replicated)]
        hidden = sum(raftlog.compressed_appends(w["data"]) for w in held) if replicated else 0
        if hidden:
            raise ValueError(f"{hidden} dropped Raft log append(s) S2-compressed: their ids cannot be read")
        return sorted({i for w in held for i in body_ids(w["data"])})

    def confirms_after_sync(self, settings: Mapping[str, Any]) -> bool | None:
        """Only under ``sync_interval: always`` (2.10 and later): the file store then syncs each
        write before the ack. By default it syncs on a timer (two minutes), and 2.9.10 has no
        setting for it, so there a cut's exposure is measured, not judged."""
        return settings.get("sync_interval") == "always"

    def members(self, node: NodeHandle, timeout: float = 15.0) -> set[str]:
        """The nodes whose servers are peers of the meta group (running or not), by the meta
        leader that ``node`` reaches. A leader lists a peer it has not heard from since it
        took over (one cut off) as "Server name unknown at this time (peerID: ...)":
        ``meta_group`` names it back by its peer id; one it cannot name is asked about again
        until ``timeout``, then ``ClusterError``: an unnamed peer is no node."""

        def named() -> set[str] | NotYet:
            peers = self.meta_group(node)
            unnamed = unnamed_peers(peers)
            return NotYet(str(unnamed)) if unnamed else {server_node(name) for name in peers}

        return poll(named, timeout=timeout, failure=f"{node.name}: the meta leader does not name every peer")

    def remove_node(
        self,
        node: NodeHandle,
        remaining: Sequence[NodeHandle],
        settings: Mapping[str, Any],
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Stop the node's server, then ask the meta leader to remove its peer, as ``nats server
        raft peer-remove`` does, until the leader no longer lists it; the leader then reassigns
        the streams it held. Without a meta leader (no quorum of the meta group reachable) the
        removal cannot commit: ``ClusterError`` after ``timeout``, the server left stopped, and
        ``add_node`` removes the old peer before the node joins again."""
        name = self.server_name(node)
        stopped = control_broker(node, "stop")
        asked = self.remove_peer(name, remaining, timeout)
        return {"server": name, "on_node": {"stop": stopped}, "remove": asked}

    def remove_peer(self, name: str, via: Sequence[NodeHandle], timeout: float) -> list[dict[str, Any]]:
        """``$JS.API.SERVER.REMOVE`` for server ``name`` through each node of ``via`` in turn (one
        may be cut off from the leader) until the meta leader no longer lists it; what was asked
        (nothing if it was no peer)."""
        asked: list[dict[str, Any]] = []

        def removed() -> list[dict[str, Any]] | NotYet:
            last = ""
            for member in via:
                try:
                    if name not in self.meta_group(member):
                        return asked
                    replies = self.system_request(member, REMOVE_SUBJECT, remove_request(name))
                    asked.append({"via": member.name, "replies": replies})
                    last = f"{member.name}: {replies}"
                except ClusterError as exc:
                    last = str(exc)
                    continue
                if replies:
                    break  # the leader answered: see it applied before asking again
            return NotYet(last)

        return poll(
            removed, timeout=timeout, failure=f"{name} still a peer of the meta group after {timeout:.0f}s"
        )

    def add_node(
        self,
        node: NodeHandle,
        members: Sequence[NodeHandle],
        settings: Mapping[str, Any],
        timeout: float = 120.0,
    ) -> dict[str, Any]:
        """Start the node's server again under a name the meta group never had and with an empty
        store, then wait until the meta leader lists it as a current peer (it joins by its
        routes; the leader adds it and places it in streams short of replicas). A removal that
        could not commit (``remove_node`` without a meta leader) is made first: a peer that
        never comes back would count in every quorum of the meta group."""
        stopped = control_broker(node, "stop")
        old = self.server_name(node)
        new = next_server_name(old, node.name)
        removed = self.remove_peer(old, members, timeout)
        run_or_fail(
            node,
            [
                "sh",
                "-c",
                f'find {self.data_dir} -mindepth 1 -delete && printf %s "$1" > {NAME_FILE}',
                "-",
                new,
            ],
        )
        started = control_broker(node, "start")

        def joined() -> dict[str, Any] | NotYet:
            last = ""
            for member in members:
                try:
                    peer = self.meta_group(member).get(new)
                except ClusterError as exc:
                    last = str(exc)
                    continue
                if peer and peer.get("current") and not peer.get("offline"):
                    return {
                        "server": new,
                        "was": old,
                        "removed_first": removed,
                        "on_node": {"stop": stopped, "wiped": self.data_dir, "start": started},
                    }
                last = f"{member.name}: {new} is {peer or 'not a peer'}"
            return NotYet(last)

        return poll(
            joined, timeout=timeout, failure=f"{new} ({node.name}) not a current peer after {timeout:.0f}s"
        )


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    register.add_broker(Nats())
