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
from typing import Any

from broker_impl.control import NODE_FILE


class CtlError(Exception):
    """The node cannot be reached or refused the command."""


def node_info(data_dir: Path) -> dict[str, Any]:
    path = data_dir / NODE_FILE
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
