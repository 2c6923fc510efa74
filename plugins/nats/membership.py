"""What the NATS plugin's membership changes name and send, kept pure for its tests.

JetStream's meta group is a Raft group whose peer ids are hashes of the servers' names: a server
removed from it must never join again under the same name (the nats-server maintainers, issue
7545), so a node's server is renamed at each return (``n2``, ``n2-2``, ``n2-3``). The harness
names nodes ``n<index>``; whatever a server reports by name is mapped back with ``server_node``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
