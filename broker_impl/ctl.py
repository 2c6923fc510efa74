"""``python -m broker_impl.ctl``: the admin CLI (a small rabbitmqctl).

It talks to a running node over the control socket named in
``<data_dir>/node.json``: one JSON request line, one JSON response line. Find
the node with ``--data-dir`` or ``--config``.

Commands::

    status
    add_user NAME PASSWORD [--tags t1,t2]   delete_user NAME   change_password NAME PASSWORD   list_users
    add_vhost NAME
    set_permissions [-p VHOST] USER CONF WRITE READ
    set_policy [-p VHOST] NAME PATTERN DEFINITION-JSON [--priority N] [--apply-to queues]
    clear_policy [-p VHOST] NAME   list_policies [-p VHOST]
    list_queues [-p VHOST]   list_exchanges [-p VHOST]   list_bindings [-p VHOST]   list_connections
    cluster_status                           members, running/down peers, partitions seen
    replication_status                       master-slave role, log end, slaves and their acked offsets
    sync_queue [-p VHOST] NAME               send a mirrored queue's messages to its unsynced mirrors
    stop_app   start_app                     stop / start the broker inside the running node
    reset                                    (app stopped) drop all data and cluster membership
    join_cluster NODE                        (app stopped, reset) ask NODE to admit this node at start_app
    forget_cluster_node NODE                 remove NODE (its app stopped) from the cluster

Membership works as ``rabbitmqctl``'s: to take a node out, ``stop_app`` on it and
``forget_cluster_node`` on a member; to bring it (back) in, ``stop_app``,
``reset``, ``join_cluster`` a member, ``start_app``. Node names may be given as in
``[cluster]`` (``n1``) or as ``rabbit@n1``.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker_impl.broker import BrokerError

if TYPE_CHECKING:
    from broker_impl.server import Server


def _cluster_name(server: Server) -> tuple[str, list[str]]:
    """This node's cluster name and the peers its config knows (where it could dial)."""
    from broker_impl.cluster.config import ClusterConfig
    from broker_impl.config import ConfigError

    try:
        cfg = ClusterConfig.from_table(server.config.cluster, server.config.name)
    except ConfigError as exc:
        raise BrokerError(f"config error: {exc}") from None
    if cfg is None:
        raise BrokerError("this node has no [cluster] peers in its config: it cannot be clustered")
    return cfg.node, list(cfg.peers)


async def _membership(server: Server, cmd: str, args: dict[str, Any]) -> Any:
    from broker_impl.cluster.membership import MembershipError, ask_to_join, reset_node
    from broker_impl.server import CONTROL_SOCKET, NODE_FILE

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


async def dispatch(server: Server, cmd: str, args: dict[str, Any]) -> Any:
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


class CtlError(Exception):
    """The node cannot be reached or refused the command."""


def node_info(data_dir: Path) -> dict[str, Any]:
    path = data_dir / "node.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CtlError(
            f"no running node found: {path} does not exist (is the broker started with this data_dir?)"
        ) from None


def call(data_dir: Path, cmd: str, args: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    """Send one command to the node that owns ``data_dir``; return its result or raise CtlError."""
    info = node_info(data_dir)
    control = info["control"]
    try:
        if isinstance(control, int):
            sock = socket.create_connection(("127.0.0.1", control), timeout=timeout)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(control)
    except OSError as exc:
        raise CtlError(f"cannot reach node {info.get('name')} at {control}: {exc.strerror or exc}") from None
    with sock:
        sock.sendall(json.dumps({"cmd": cmd, "args": args or {}}).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
    resp = json.loads(buf or b'{"ok": false, "error": "node closed the control connection"}')
    if not resp.get("ok"):
        raise CtlError(resp.get("error", "unknown error"))
    return resp.get("result")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m broker_impl.ctl", description="Administer a running broker_impl node"
    )
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--data-dir", help="the node's data_dir")
    where.add_argument("--config", help="the node's TOML config (data_dir is read from it)")
    ap.add_argument("--json", action="store_true", help="print results as JSON")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("status")
    p = sub.add_parser("add_user")
    p.add_argument("name")
    p.add_argument("password")
    p.add_argument("--tags", default="")
    sub.add_parser("delete_user").add_argument("name")
    p = sub.add_parser("change_password")
    p.add_argument("name")
    p.add_argument("password")
    sub.add_parser("list_users")
    sub.add_parser("add_vhost").add_argument("name")
    p = sub.add_parser("set_permissions")
    p.add_argument("-p", "--vhost", default="/")
    for a in ("user", "configure", "write", "read"):
        p.add_argument(a)
    p = sub.add_parser("set_policy")
    p.add_argument("-p", "--vhost", default="/")
    p.add_argument("name")
    p.add_argument("pattern")
    p.add_argument("definition")
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--apply-to", default="queues")
    p = sub.add_parser("clear_policy")
    p.add_argument("-p", "--vhost", default="/")
    p.add_argument("name")
    for name in ("list_policies", "list_queues", "list_exchanges", "list_bindings"):
        sub.add_parser(name).add_argument("-p", "--vhost", default="/")
    sub.add_parser("list_connections")
    sub.add_parser("cluster_status")
    sub.add_parser("replication_status")
    p = sub.add_parser("sync_queue")
    p.add_argument("-p", "--vhost", default="/")
    p.add_argument("name")
    for name in ("stop_app", "start_app", "reset"):
        sub.add_parser(name)
    for name in ("join_cluster", "forget_cluster_node"):
        sub.add_parser(name).add_argument("node")
    return ap


def _request(ns: argparse.Namespace) -> dict[str, Any]:
    args = {k: v for k, v in vars(ns).items() if k not in ("cmd", "data_dir", "config", "json")}
    if ns.cmd == "add_user":
        args["tags"] = [t for t in ns.tags.split(",") if t]
    if ns.cmd == "set_policy":
        try:
            args["definition"] = json.loads(ns.definition)
        except json.JSONDecodeError as exc:
            raise CtlError(f"policy definition is not valid JSON: {exc}") from None
    return args


_COLUMNS = {
    "list_queues": (
        "name",
        "messages_ready",
        "messages_unacknowledged",
        "consumers",
        "durable",
        "policy",
        "state",
        "node",
        "mirrors",
        "synchronised_mirrors",
        "gm_ring",
    ),
    "list_connections": ("peer", "user", "vhost", "state", "channels"),
    "list_exchanges": ("name", "type", "durable"),
    "list_bindings": ("source", "destination", "routing_key"),
    "list_users": ("name", "tags"),
    "list_policies": ("vhost", "name", "pattern", "apply-to", "definition", "priority"),
}


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        if ns.config:
            from broker_impl.config import ConfigError, load

            try:
                data_dir = load(ns.config).data_dir
            except ConfigError as exc:
                raise CtlError(f"config error: {exc}") from None
        else:
            data_dir = Path(ns.data_dir or "./data")
        # starting the app recovers the store; stopping it flushes every queue
        result = call(data_dir, ns.cmd, _request(ns), timeout=120.0 if ns.cmd.endswith("_app") else 10.0)
    except CtlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if ns.json or ns.cmd not in _COLUMNS:
        if result is not None:
            print(json.dumps(result, indent=1))
        return 0
    cols = _COLUMNS[ns.cmd]
    print("\t".join(cols))
    for row in result:
        print(
            "\t".join(
                json.dumps(row.get(c)) if isinstance(row.get(c), dict | list) else str(row.get(c))
                for c in cols
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
