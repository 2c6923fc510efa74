"""The node's cluster side: its config, its links, the shared metadata and forwarding.

``ClusterNode`` is the one object the broker holds when ``[cluster]`` names
peers. It owns the ``Transport`` (links and failure detection), the metadata
``Table`` (see ``metadata`` for the consistency model), the proxies of queues
mastered elsewhere (``remote.RemoteQueue``) and the service that answers
other nodes' operations on queues mastered here (``remote.MasterSide``).

Config (``[cluster]`` table)::

    node = "n1"                  # this node's cluster name (default: [node] name)
    peers = ["n2", "n3"]         # names, dialled as <name>:<port>; or a table
                                 # {n2 = "127.0.0.3:25672", ...} of name -> host:port
    port = 25672                 # cluster listen port (and the peers' default port)
    listen = ""                  # address to bind; default: this node's name resolved
    tick = 1.0                   # seconds between heartbeats
    down_after = 3               # ticks without a frame before a peer is down
    partition_handling = "ignore"  # ignore | pause_minority | autoheal
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker_impl.cluster.metadata import Entry, Table, collect, split_key
from broker_impl.cluster.remote import MasterSide, RemoteQueue
from broker_impl.cluster.transport import Transport
from broker_impl.config import ConfigError, Permission
from broker_impl.exchange import Binding, make_exchange
from broker_impl.message import Message
from broker_impl.queue import ConfirmCallback, Consumer, Queue
from broker_impl.vhost import VHost

if TYPE_CHECKING:
    from broker_impl.broker import Broker

log = logging.getLogger("broker_impl.cluster")

PARTITION_MODES = ("ignore", "pause_minority", "autoheal")
_APPLY_ORDER = {"vhost": 0, "user": 1, "perm": 2, "policy": 3, "exchange": 4, "queue": 5, "binding": 6}


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
                    raise ConfigError(f"cluster.peers.{name}: expected \"host:port\", got {addr!r}")
                peers[str(name)] = (host, int(p))
        else:
            raise ConfigError("cluster.peers: expected a list of node names or a table of name = \"host:port\"")
        peers.pop(node, None)
        tick = t.get("tick", 1.0)
        if isinstance(tick, bool) or not isinstance(tick, int | float) or tick <= 0:
            raise ConfigError(f"cluster.tick: expected seconds > 0, got {tick!r}")
        down_after = t.get("down_after", 3)
        if isinstance(down_after, bool) or not isinstance(down_after, int) or down_after < 1:
            raise ConfigError(f"cluster.down_after: expected a whole number of ticks >= 1, got {down_after!r}")
        mode = t.get("partition_handling", "ignore")
        if mode not in PARTITION_MODES:
            raise ConfigError(f"cluster.partition_handling: {mode!r} not allowed; allowed {', '.join(PARTITION_MODES)}")
        return cls(node, peers, port, str(t.get("listen") or node), float(tick), down_after, mode)


class ClusterNode:
    """This node as a cluster member; the broker calls ``local_changed`` after every topology change."""

    def __init__(self, broker: Broker, cfg: ClusterConfig) -> None:
        self.broker = broker
        self.cfg = cfg
        self.me = cfg.node
        self.table = Table(self.me)
        self.transport = Transport(
            self.me, (cfg.listen, cfg.port), cfg.peers, tick=cfg.tick, down_after=cfg.down_after,
            on_message=self._on_message, on_up=self._peer_up, on_down=self._peer_down,
        )
        self.master_side = MasterSide(self)
        self._pending_pubs: dict[int, tuple[str, ConfirmCallback]] = {}
        self._requests: dict[int, tuple[str, asyncio.Future[tuple[dict[str, Any], bytes]]]] = {}
        self._ids = itertools.count(1)
        self._proxy_consumers: dict[str, Consumer] = {}
        self._cid_of: dict[int, str] = {}
        self._inbox: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._applying = False
        self._dirty = False
        self.paused = False

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        self.local_changed()
        self.spawn(self._apply_loop())
        await self.transport.start()

    async def stop(self) -> None:
        await self.transport.stop()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """The broker's tasks: cancelled and their failures logged in one place."""
        return self.broker.spawn(coro)

    # -- metadata ----------------------------------------------------------------------------
    def _queue_fields(self) -> dict[tuple[str, str], dict[str, Any]]:
        out = {}
        for vname, vh in self.broker.vhosts.items():
            for q in vh.queues.values():
                f = getattr(q, "cluster_fields", None)
                out[(vname, q.name)] = dict(f) if f is not None else {"master": self.me}
        return out

    def local_changed(self) -> None:
        """Stamp and send whatever changed here; deferred while a remote batch is being applied."""
        if self._applying:
            self._dirty = True
            return
        changed = self.table.diff(collect(self.broker, self._queue_fields()))
        if changed:
            self._broadcast_meta(changed)

    def _broadcast_meta(self, entries: dict[str, Entry]) -> None:
        body = {"t": "meta", "entries": self.table.encode(entries)}
        for peer in self.transport.up_peers():
            self.transport.send(peer, body)

    async def _apply_loop(self) -> None:
        while True:
            peer, h = await self._inbox.get()
            changed = self.table.merge(Table.decode(h.get("entries", {})))
            if not changed:
                continue
            self._applying = True
            try:
                for k, e in sorted(changed.items(), key=lambda kv: _APPLY_ORDER.get(split_key(kv[0])[0], 9)):
                    try:
                        await self._apply(split_key(k), e.data)
                    except Exception:
                        log.exception("applying cluster metadata %s from %s failed", k, peer)
                self.broker.metadata_changed()
            finally:
                self._applying = False
            if self._dirty or True:
                self._dirty = False
                self.local_changed()

    async def _apply(self, k: list[str], data: dict[str, Any] | None) -> None:
        b = self.broker
        kind = k[0]
        if kind == "vhost":
            if data is not None and k[1] not in b.vhosts:
                b.vhosts[k[1]] = VHost(b, k[1])
            elif data is None and k[1] in b.vhosts:
                vh = b.vhosts.pop(k[1])
                for q in list(vh.queues.values()):
                    await q.delete()
        elif kind == "user":
            if data is None:
                b.users.pop(k[1], None)
            else:
                b.users[k[1]] = {"password_hash": data["password_hash"], "tags": list(data.get("tags", []))}
        elif kind == "perm":
            if data is None:
                b.permissions.pop((k[1], k[2]), None)
            else:
                b.permissions[(k[1], k[2])] = Permission(k[1], k[2], data["configure"], data["write"], data["read"])
        elif kind == "policy":
            if data is None:
                b.policies.pop((k[1], k[2]), None)
            else:
                b.policies[(k[1], k[2])] = dict(data)
            vh = b.vhosts.get(k[1])
            for q in list(vh.queues.values()) if vh else []:
                b.apply_policies(q)
        elif kind == "exchange":
            vh = self._vhost(k[1])
            old = vh.exchanges.get(k[2])
            if data is None:
                vh.exchanges.pop(k[2], None)
            else:
                ex = make_exchange(data["type"], k[2], durable=data["durable"], auto_delete=data["auto_delete"],
                                   internal=data["internal"], arguments=data.get("arguments") or {})
                if old is not None:
                    ex.bindings = old.bindings
                vh.exchanges[k[2]] = ex
        elif kind == "binding":
            vh = self._vhost(k[1])
            ex = vh.exchanges.get(k[2])
            if ex is None:
                return
            bnd = Binding(k[2], k[3], k[4], dict((data or {}).get("arguments") or {}))
            if data is None:
                import json

                bnd.arguments = json.loads(k[5])
                ex.unbind(bnd)
            elif k[3] in vh.queues:
                ex.bind(bnd)
        elif kind == "queue":
            await self._apply_queue(self._vhost(k[1]), k[2], data)

    def _vhost(self, name: str) -> VHost:
        vh = self.broker.vhosts.get(name)
        if vh is None:
            vh = self.broker.vhosts[name] = VHost(self.broker, name)
        return vh

    async def _apply_queue(self, vh: VHost, name: str, data: dict[str, Any] | None) -> None:
        local = vh.queues.get(name)
        if local is not None and local.exclusive_owner is not None:
            return
        if data is None:
            if local is not None:
                await vh.delete_queue(local)
            return
        master = data.get("master", self.me)
        if master == self.me:
            if local is None or isinstance(local, RemoteQueue):
                if local is not None:
                    await self._drop_local(vh, local)
                await vh.declare_queue(name, owner=None, durable=data["durable"], auto_delete=data["auto_delete"],
                                       arguments=data.get("arguments") or {})
            return
        if isinstance(local, RemoteQueue) and local.master == master:
            return
        if local is not None:
            log.warning("queue %r in vhost %r: master is now %s; dropping the copy here", name, vh.name, master)
            await self._drop_local(vh, local)
        rq = RemoteQueue(self, vh, name, master, durable=data["durable"], auto_delete=data["auto_delete"],
                         arguments=data.get("arguments") or {})
        vh.queues[name] = rq  # type: ignore[assignment]
        vh.exchanges[""].bind(Binding("", name, name))
        self.broker.apply_policies(rq)  # type: ignore[arg-type]

    async def _drop_local(self, vh: VHost, q: Any) -> None:
        """Replace a queue object without touching its bindings (they name the queue, not the object)."""
        if vh.queues.get(q.name) is q:
            del vh.queues[q.name]
        await q.delete()

    # -- links ----------------------------------------------------------------------------
    def _peer_up(self, peer: str) -> None:
        self.transport.send(peer, {"t": "meta", "entries": self.table.encode()})

    def _peer_down(self, peer: str) -> None:
        for pid, (p, cb) in list(self._pending_pubs.items()):
            if p == peer:
                del self._pending_pubs[pid]
                cb(False)
        for rid, (p, fut) in list(self._requests.items()):
            if p == peer:
                del self._requests[rid]
                if not fut.done():
                    fut.set_exception(ConnectionError(f"node {peer} is down"))
        for vh in self.broker.vhosts.values():
            for q in list(vh.queues.values()):
                if isinstance(q, RemoteQueue) and q.master == peer:
                    q.master_down()
        self.master_side.peer_down(peer)

    def _on_message(self, peer: str, h: dict[str, Any], blob: bytes) -> None:
        t = h.get("t")
        if t == "meta":
            self._inbox.put_nowait((peer, h))
        elif t == "pub_ok":
            entry = self._pending_pubs.pop(int(h["id"]), None)
            if entry is not None:
                entry[1](bool(h.get("ok")))
        elif t == "reply":
            req = self._requests.pop(int(h.get("re") or 0), None)
            if req is not None and not req[1].done():
                req[1].set_result((h, blob))
        elif t == "deliver":
            c = self._proxy_consumers.get(h["cid"])
            if c is None:
                return
            c.queue.delivered(c, int(h["seq"]), bool(h.get("red")), Message.from_bytes(blob))  # type: ignore[attr-defined]
        elif t == "cancelled":
            c = self._proxy_consumers.get(h["cid"])
            if c is not None:
                c.queue.cancel_consumer(c)  # type: ignore[attr-defined]
        else:
            self.master_side.handle(peer, h, blob)

    # -- forwarding (proxy side) ------------------------------------------------------------
    def forward_publish(self, master: str, h: dict[str, Any], message: Message, on_done: ConfirmCallback | None) -> None:
        if on_done is not None:
            pid = next(self._ids)
            h["id"] = pid
            if not self.transport.send(master, h, message.to_bytes()):
                on_done(False)
                return
            self._pending_pubs[pid] = (master, on_done)
        else:
            self.transport.send(master, h, message.to_bytes())

    async def request(self, peer: str, h: dict[str, Any], blob: bytes = b"") -> tuple[dict[str, Any], bytes]:
        rid = next(self._ids)
        fut: asyncio.Future[tuple[dict[str, Any], bytes]] = asyncio.get_running_loop().create_future()
        if not self.transport.send(peer, {**h, "id": rid}, blob):
            raise ConnectionError(f"node {peer} is down")
        self._requests[rid] = (peer, fut)
        try:
            return await asyncio.wait_for(fut, 10.0)
        except TimeoutError:
            raise ConnectionError(f"node {peer} did not answer") from None
        finally:
            self._requests.pop(rid, None)

    def register_proxy_consumer(self, c: Consumer) -> str:
        cid = f"{self.me}:{next(self._ids)}"
        self._proxy_consumers[cid] = c
        self._cid_of[id(c)] = cid
        return cid

    def unregister_proxy_consumer(self, c: Consumer) -> str | None:
        cid = self._cid_of.pop(id(c), None)
        if cid is not None:
            self._proxy_consumers.pop(cid, None)
        return cid

    def cid_of(self, c: Consumer | None) -> str | None:
        return self._cid_of.get(id(c)) if c is not None else None

    # -- operator view --------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        peers = self.transport.status()
        return {
            "node": self.me,
            "listen": f"{self.transport.bound[0]}:{self.transport.bound[1]}",
            "members": [self.me, *self.cfg.peers],
            "running": [self.me, *self.transport.up_peers()],
            "down": [p["name"] for p in peers if not p["running"]],
            "peers": peers,
            "partitions": [p["name"] for p in peers if p["times_down"] and not p["running"]],
            "partition_handling": self.cfg.partition_handling,
            "paused": self.paused,
        }


def is_local_master(q: Any) -> bool:
    return isinstance(q, Queue)
