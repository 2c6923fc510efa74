"""What the NATS plugin's membership changes name and send, kept pure for its tests.

JetStream's meta group is a Raft group whose peer ids are hashes of the servers' names: a server
removed from it must never join again under the same name (the nats-server maintainers, issue
7545), so a node's server is renamed at each return (``n2``, ``n2-2``, ``n2-3``). The harness
names nodes ``n<index>``; whatever a server reports by name is mapped back with ``server_node``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any


def server_node(server: str) -> str:
    """The node a server name belongs to: ``n2`` for ``n2`` and for ``n2-3`` (its third
    identity, after two removals). The harness names nodes ``n<index>``."""
    head, sep, tail = server.rpartition("-")
    return head if sep and head and tail.isdigit() else server


def next_server_name(current: str, node: str) -> str:
    """The name ``node``'s server takes when it joins again after a removal: never one the
    meta group has seen (``n2`` -> ``n2-2`` -> ``n2-3``)."""
    if current == node:
        return f"{node}-2"
    head, _, tail = current.rpartition("-")
    if head != node or not tail.isdigit():
        raise ValueError(f"server name {current!r} does not belong to node {node!r}")
    return f"{node}-{int(tail) + 1}"


def meta_peers(meta: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The meta group's peers by server name, from the meta leader's ``meta_cluster`` (a JSZ
    answer): the leader (current, online) and each replica with its ``current`` and
    ``offline`` flags. Only the leader lists the replicas."""
    out = {str(r["name"]): dict(r) for r in meta.get("replicas") or () if r.get("name")}
    if meta.get("leader"):
        out[str(meta["leader"])] = {"name": meta["leader"], "current": True, "offline": False}
    return out


#: How a meta leader lists a peer whose server name it has not learned yet (a server that just
#: came back from a partition or a restart): the name is unknown, only its peer id.
UNKNOWN_NAME = "Server name unknown"


BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def peer_id(server: str) -> str:
    """The meta group's peer id of a server name, as nats-server computes it (``getHash``): the
    first 8 bytes of the name's SHA-256, each as a base-62 digit (byte mod 62)."""
    return "".join(BASE62[b % 62] for b in hashlib.sha256(server.encode()).digest()[:8])


def name_peers(peers: Mapping[str, Any], candidates: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``peers`` with each peer the leader lists unnamed given its server name back, found among
    ``candidates`` by its peer id; one no candidate matches keeps its placeholder."""
    unnamed = {str(p.get("peer")): name for name, p in peers.items() if name.startswith(UNKNOWN_NAME)}
    if not unnamed:
        return dict(peers)
    known = {peer_id(c): c for c in candidates}
    out = {}
    for name, p in peers.items():
        real = known.get(str(p.get("peer"))) if name.startswith(UNKNOWN_NAME) else None
        out[real or name] = {**p, "name": real, "unnamed": True} if real else dict(p)
    return out


def server_names(nodes: int = 64, generations: int = 32) -> list[str]:
    """Every server name the harness's nodes can have: ``n<i>`` and ``n<i>-<g>``."""
    return [f"n{i}" for i in range(1, nodes + 1)] + [
        f"n{i}-{g}" for i in range(1, nodes + 1) for g in range(2, generations + 1)
    ]


def unnamed_peers(peers: Mapping[str, Any]) -> list[str]:
    """The peers of ``meta_peers`` whose server name the leader does not know yet."""
    return sorted(name for name in peers if name.startswith(UNKNOWN_NAME))


def remove_request(server: str) -> bytes:
    """``$JS.API.SERVER.REMOVE``'s body: the server to take out of the meta group, by name (the
    meta leader looks the name up among its peers; nats-server's ``JSApiMetaServerRemoveRequest``)."""
    return json.dumps({"peer": server}).encode()


#: JSZ from the meta leader only (``leader_only``): the one view listing every peer of the meta group.
LEADER_JSZ = ("$SYS.REQ.SERVER.PING.JSZ", json.dumps({"leader_only": True}).encode())
REMOVE_SUBJECT = "$JS.API.SERVER.REMOVE"
