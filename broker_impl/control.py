"""The node's side of the control socket: one JSON request, one command run inside the node.

``broker_impl.server`` listens on the socket and hands each request to ``dispatch``;
``broker_impl.ctl`` is the command line that sends them. A command that cannot be done
raises ``BrokerError``, which the server answers as the CLI's one-line error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from broker_impl.broker import Broker
from broker_impl.cluster.config import ClusterConfig
from broker_impl.cluster.membership import MembershipError, ask_to_join, reset_node
from broker_impl.config import Config, ConfigError
from broker_impl.errors import BrokerError
from broker_impl.vhost import VHost

#: In the data directory: the running node's name, ports and control address (``ctl`` reads it).
NODE_FILE = "node.json"
#: In the data directory: the control socket when no ``control_port`` is configured.
CONTROL_SOCKET = "ctl.sock"


class Node(Protocol):
    """What the commands act on: the running node (``broker_impl.server.Server``)."""

    config: Config
    broker: Broker
    port: int
    app_running: bool

    async def stop_app(self, reason: str = ...) -> str: ...

    async def start_app(self) -> str: ...


def _cluster_name(server: Node) -> tuple[str, list[str]]:
    """This node's cluster name and the peers its config knows (where it could dial)."""
    try:
        cfg = ClusterConfig.from_table(server.config.cluster, server.config.name)
    except ConfigError as exc:
        raise BrokerError(f"config error: {exc}") from None
    if cfg is None:
        raise BrokerError("this node has no [cluster] peers in its config: it cannot be clustered")
    return cfg.node, list(cfg.peers)


async def _membership(server: Node, cmd: str, args: dict[str, Any]) -> Any:
    if cmd == "stop_app":
        return await server.stop_app()
    if cmd == "start_app":
        return await server.start_app()
    if server.app_running and cmd in ("reset", "join_cluster"):
        raise BrokerError(f"{cmd} needs the app stopped: run stop_app first")
    if cmd == "forget_cluster_node":
        if server.broker.cluster is None:
            raise BrokerError("this node is not clustered: there is nobody to forget")
        return server.broker.cluster.forget(_node_name(args["node"]))
    me, known = _cluster_name(server)
    try:
        if cmd == "reset":
            n = reset_node(server.config.data_dir, me, (NODE_FILE, CONTROL_SOCKET))
            return f"{me} reset: {n} data entries removed; it is alone until it joins a cluster"
        ask_to_join(server.config.data_dir, me, _node_name(args["node"]), known)
    except MembershipError as exc:
        raise BrokerError(str(exc)) from None
    return f"{me} will ask {_node_name(args['node'])} to admit it at start_app"


def _node_name(raw: str) -> str:
    return str(raw).rpartition("@")[2]


Handler = Callable[[Node, dict[str, Any]], Awaitable[Any]]
"""One command of a running app: the node and the request's arguments in, the answer out."""

MEMBERSHIP = ("stop_app", "start_app", "reset", "join_cluster", "forget_cluster_node")
"""Commands that work on a stopped app too (they stop, start, reset and join it)."""


async def dispatch(server: Node, cmd: str, args: dict[str, Any]) -> Any:
    """Run one control command inside the node; BrokerError becomes the CLI's one-line error."""
    if cmd in MEMBERSHIP:
        return await _membership(server, cmd, args)
    if not server.app_running:
        if cmd == "status":
            return {"name": server.config.name, "app_running": False}
        raise BrokerError(f"the app of node {server.config.name} is stopped; start it with start_app")
    handler = COMMANDS.get(cmd)
    if handler is None:
        raise BrokerError(f"unknown command '{cmd}'")
    return await handler(server, args)


def _vhost(args: dict[str, Any]) -> str:
    return str(args.get("vhost", "/"))


def _existing_vhost(server: Node, args: dict[str, Any]) -> VHost:
    vh = server.broker.vhosts.get(_vhost(args))
    if vh is None:
        raise BrokerError(f"no such vhost '{_vhost(args)}'")
    return vh


def _run(act: Callable[[Broker, dict[str, Any]], object]) -> Handler:
    """A command done on the broker that answers nothing."""

    async def handler(server: Node, args: dict[str, Any]) -> None:
        act(server.broker, args)

    return handler


def _answer(answer: Callable[[Broker, dict[str, Any]], Any]) -> Handler:
    """A command that reads the broker and answers what it read."""

    async def handler(server: Node, args: dict[str, Any]) -> Any:
        return answer(server.broker, args)

    return handler


async def _status(server: Node, args: dict[str, Any]) -> dict[str, Any]:
    b = server.broker
    return {
        "app_running": True,
        "name": server.config.name,
        "port": server.port,
        "connections": len(b.connections),
        "queues": len(b.all_queues()),
        "alarms": sorted(b.alarms),
        "flow_control": b.flow_enabled,
        "vhosts": sorted(b.vhosts),
    }


def _set_policy(b: Broker, args: dict[str, Any]) -> None:
    b.set_policy(
        _vhost(args),
        args["name"],
        args["pattern"],
        args["definition"],
        int(args.get("priority", 0)),
        args.get("apply_to", "queues"),
    )


async def _list_queues(server: Node, args: dict[str, Any]) -> list[dict[str, Any]]:
    vh, cluster = _existing_vhost(server, args), server.broker.cluster
    if cluster is None:
        return [q.info() for q in vh.queues.values()]
    # every node reports the master's counts (a drain may ask any node whether the queue is empty)
    vhost = _vhost(args)
    return [
        {**q.info(), **cluster.queue_info(vhost, q.name), **await cluster.queue_counts(vhost, q.name)}
        for q in list(vh.queues.values())
    ]


def _sync_queue(b: Broker, args: dict[str, Any]) -> Any:
    if b.cluster is None:
        raise BrokerError("this node is not clustered: there are no mirrors to synchronise")
    return b.cluster.sync_queue(_vhost(args), args["name"])


async def _list_exchanges(server: Node, args: dict[str, Any]) -> list[dict[str, Any]]:
    vh = _existing_vhost(server, args)
    return [{"name": e.name, "type": e.type, "durable": e.durable} for e in vh.exchanges.values()]


async def _list_bindings(server: Node, args: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "source": x.source,
            "destination": x.destination,
            "routing_key": x.routing_key,
            "arguments": x.arguments,
        }
        for x in _existing_vhost(server, args).bindings()
    ]


async def _cluster_status(server: Node, args: dict[str, Any]) -> dict[str, Any]:
    if server.broker.cluster is not None:
        return server.broker.cluster.status()
    # alone: named as a clustered node would be ([cluster] node, else [node] name)
    me = str(server.config.cluster.get("node") or server.config.name)
    return {
        "node": me,
        "members": [me],
        "running": [me],
        "down": [],
        "peers": [],
        "partitions": [],
        "partition_handling": None,
        "paused": False,
    }


COMMANDS: dict[str, Handler] = {
    "status": _status,
    "add_user": _run(lambda b, a: b.add_user(a["name"], a["password"], a.get("tags", []))),
    "delete_user": _run(lambda b, a: b.delete_user(a["name"])),
    "change_password": _run(lambda b, a: b.change_password(a["name"], a["password"])),
    "list_users": _answer(lambda b, a: [{"name": n, "tags": u["tags"]} for n, u in sorted(b.users.items())]),
    "add_vhost": _run(lambda b, a: b.add_vhost(a["name"])),
    "set_permissions": _run(
        lambda b, a: b.set_permissions(a["user"], _vhost(a), a["configure"], a["write"], a["read"])
    ),
    "set_policy": _run(_set_policy),
    "clear_policy": _run(lambda b, a: b.clear_policy(_vhost(a), a["name"])),
    "list_policies": _answer(lambda b, a: [p for (v, _n), p in sorted(b.policies.items()) if v == _vhost(a)]),
    "list_queues": _list_queues,
    "sync_queue": _answer(_sync_queue),
    "list_exchanges": _list_exchanges,
    "list_bindings": _list_bindings,
    "list_connections": _answer(lambda b, a: [c.info() for c in b.connections]),
    "cluster_status": _cluster_status,
    "replication_status": _answer(
        lambda b, a: b.replication.status() if b.replication is not None else {"role": None}
    ),
}
"""Every command of a running app, by name (the membership commands are ``_membership``'s)."""
