"""The node's side of the control socket: one JSON request, one command run inside the node.

``broker_impl.server`` listens on the socket and hands each request to ``dispatch``;
``broker_impl.ctl`` is the command line that sends them. A command that cannot be done
raises ``BrokerError``, which the server answers as the CLI's one-line error.
"""

from __future__ import annotations

from typing import Any, Protocol

from broker_impl.broker import Broker
from broker_impl.cluster.config import ClusterConfig
from broker_impl.cluster.membership import MembershipError, ask_to_join, reset_node
from broker_impl.config import Config, ConfigError
from broker_impl.errors import BrokerError

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


async def dispatch(server: Node, cmd: str, args: dict[str, Any]) -> Any:
    """Run one control command inside the node; BrokerError becomes the CLI's one-line error."""
    if cmd in ("stop_app", "start_app", "reset", "join_cluster", "forget_cluster_node"):
        return await _membership(server, cmd, args)
    if not server.app_running:
        if cmd == "status":
            return {"name": server.config.name, "app_running": False}
        raise BrokerError(f"the app of node {server.config.name} is stopped; start it with start_app")
    b = server.broker
    vhost = args.get("vhost", "/")
    if cmd == "status":
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
    if cmd == "add_user":
        b.add_user(args["name"], args["password"], args.get("tags", []))
        return None
    if cmd == "delete_user":
        b.delete_user(args["name"])
        return None
    if cmd == "change_password":
        b.change_password(args["name"], args["password"])
        return None
    if cmd == "list_users":
        return [{"name": n, "tags": u["tags"]} for n, u in sorted(b.users.items())]
    if cmd == "add_vhost":
        b.add_vhost(args["name"])
        return None
    if cmd == "set_permissions":
        b.set_permissions(args["user"], vhost, args["configure"], args["write"], args["read"])
        return None
    if cmd == "set_policy":
        b.set_policy(
            vhost,
            args["name"],
            args["pattern"],
            args["definition"],
            int(args.get("priority", 0)),
            args.get("apply_to", "queues"),
        )
        return None
    if cmd == "clear_policy":
        b.clear_policy(vhost, args["name"])
        return None
    if cmd == "list_policies":
        return [p for (v, _n), p in sorted(b.policies.items()) if v == vhost]
    vh = b.vhosts.get(vhost)
    if cmd in ("list_queues", "list_exchanges", "list_bindings") and vh is None:
        raise BrokerError(f"no such vhost '{vhost}'")
    if cmd == "list_queues":
        assert vh is not None
        if b.cluster is None:
            return [q.info() for q in vh.queues.values()]
        # every node reports the master's counts (a drain may ask any node whether the queue is empty)
        return [
            {**q.info(), **b.cluster.queue_info(vhost, q.name), **await b.cluster.queue_counts(vhost, q.name)}
            for q in list(vh.queues.values())
        ]
    if cmd == "sync_queue":
        if b.cluster is None:
            raise BrokerError("this node is not clustered: there are no mirrors to synchronise")
        return b.cluster.sync_queue(vhost, args["name"])
    if cmd == "list_exchanges":
        assert vh is not None
        return [{"name": e.name, "type": e.type, "durable": e.durable} for e in vh.exchanges.values()]
    if cmd == "list_bindings":
        assert vh is not None
        return [
            {
                "source": x.source,
                "destination": x.destination,
                "routing_key": x.routing_key,
                "arguments": x.arguments,
            }
            for x in vh.bindings()
        ]
    if cmd == "list_connections":
        return [c.info() for c in b.connections]
    if cmd == "cluster_status":
        if b.cluster is None:  # alone: named as a clustered node would be ([cluster] node, else [node] name)
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
        return b.cluster.status()
    if cmd == "replication_status":
        return b.replication.status() if b.replication is not None else {"role": None}
    raise BrokerError(f"unknown command '{cmd}'")
