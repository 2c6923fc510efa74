"""The node's cluster side: its config, its links, the shared metadata and forwarding.

``ClusterNode`` is the one object the broker holds when ``[cluster]`` names
peers. It owns the ``Transport`` (links and failure detection), the metadata
``Table`` (see ``metadata`` for the consistency model), the proxies of queues
mastered elsewhere (``remote.RemoteQueue``), the service that answers
other nodes' operations on queues mastered here (``remote.MasterSide``), the
GM members and group store of the mirrored queues (``gm_link.GmHub``), and
the mirrors (``mirror``): which nodes hold one (the policy's ha-mode, checked
every tick and on every membership change), promotion of the oldest live
mirror one tick after its master is seen down (ha-promote-on-failure, or
-on-shutdown when the master said goodbye), and ``sync_queue``.

Partition handling, as RabbitMQ's modes:

* ``ignore``: both sides go on; on heal the metadata merge keeps one master
  per queue (the later record) and the other copy is dropped with its messages.
* ``pause_minority``: a node that sees at most half the cluster closes its
  client connections, refuses new ones, promotes nothing and writes no
  metadata; when a majority is back it takes the majority's records as a
  restarted node would (its own queue copies that were replaced are dropped).
* ``autoheal``: on heal each pair of sides compares client counts; the side
  with fewer clients (ties: the side without the smallest node name) closes its
  connections and takes the winner's records, dropping its conflicting copies.

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

from broker_impl.backing_queue import BackingQueue
from broker_impl.cluster.gm_link import Endpoint, GmHub, node_of
from broker_impl.cluster.metadata import Entry, Table, collect, key, split_key
from broker_impl.cluster.mirror import Mirror, MirrorMasterBQ
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
        self.gm = GmHub(self)
        self._pending_pubs: dict[int, tuple[str, ConfirmCallback]] = {}
        self._requests: dict[int, tuple[str, asyncio.Future[tuple[dict[str, Any], bytes]]]] = {}
        self._ids = itertools.count(1)
        self._proxy_consumers: dict[str, Consumer] = {}
        self._cid_of: dict[int, str] = {}
        self._inbox: asyncio.Queue[tuple[str, dict[str, Entry]]] = asyncio.Queue()
        self._pending_apply = 0
        self._applying = False
        self._dirty = False
        self.mirrors: dict[tuple[str, str], Mirror] = {}
        self._dropping: dict[tuple[str, str], asyncio.Task[Any]] = {}  # local queue copies being deleted
        self.paused = False
        # Until the first peer's records are in, a restarted node may hold stale copies of queues
        # mastered elsewhere: clients wait (or 2 x the down detection time if nobody answers).
        self.joining = True
        self._leaving: set[str] = set()
        self._was_down: set[str] = set()
        self._clients: dict[str, int] = {}  # peer -> its client connections, as it last said
        self._skip_meta: set[str] = set()
        self._await_winner: str | None = None
        self._heal_side: dict[str, list[str]] = {}

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        self.local_changed()
        self.spawn(self._apply_loop())
        self.gm.start()
        await self.transport.start()
        asyncio.get_running_loop().call_later(2 * self.cfg.tick * self.cfg.down_after, self._joined, "no peer answered")
        self.spawn(self._housekeeping())

    async def stop(self) -> None:
        """A controlled stop: peers apply ha-promote-on-shutdown instead of -on-failure."""
        for peer in self.transport.up_peers():
            self.transport.send(peer, {"t": "bye"})
        await asyncio.sleep(min(self.cfg.tick, 0.1))
        await self.transport.stop()

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.tick)
            try:
                for peer in self.transport.up_peers():
                    self.transport.send(peer, {"t": "clients", "n": len(self.broker.connections)})
                self.reconcile_mirrors()
                self.local_changed()
            except Exception:
                log.exception("cluster housekeeping failed")

    def wrap_backing(self, vhost: str, name: str, bq: BackingQueue) -> BackingQueue:
        """Every queue mastered here streams to its mirrors (none until a policy asks for some)."""
        return MirrorMasterBQ(bq, self, vhost, name)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """The broker's tasks: cancelled and their failures logged in one place."""
        return self.broker.spawn(coro)

    # -- metadata ----------------------------------------------------------------------------
    def _queue_fields(self) -> dict[tuple[str, str], dict[str, Any]]:
        out = {}
        for vname, vh in self.broker.vhosts.items():
            for q in vh.queues.values():
                if isinstance(q, RemoteQueue):
                    # only the master writes its queue's record; a proxy repeats what it was told
                    known = self.table.live().get(key("queue", vname, q.name)) or {}
                    f = {k: known[k] for k in ("master", "mirrors", "synced") if k in known}
                    f["master"] = q.master
                elif isinstance(q.bq, MirrorMasterBQ):
                    f = q.bq.cluster_fields()
                else:
                    f = {"master": self.me}
                out[(vname, q.name)] = f
        return out

    def local_changed(self) -> None:
        """Stamp and send whatever changed here; deferred while a remote batch is being applied."""
        if self._applying or self._pending_apply or self._await_winner is not None:
            # merged records not applied yet would look like local deletions
            self._dirty = True
            return
        changed = self.table.diff(collect(self.broker, self._queue_fields()))
        if changed:
            self._broadcast_meta(changed)

    def _broadcast_meta(self, entries: dict[str, Entry]) -> None:
        body = {"t": "meta", "entries": self.table.encode(entries)}
        for peer in self.transport.up_peers():
            self.transport.send(peer, body)

    @property
    def refusing_clients(self) -> bool:
        return self.paused or self.joining

    def _joined(self, why: str) -> None:
        if self.joining:
            self.joining = False
            log.info("cluster: serving clients (%s)", why)

    def _merge(self, peer: str, h: dict[str, Any]) -> None:
        """Merge at once (so a message that follows on the link sees the new records); apply in order later."""
        if self._await_winner in (peer, "*"):
            self._await_winner = None
        changed = self.table.merge(Table.decode(h.get("entries", {})))
        if changed:
            self._pending_apply += 1
            self._inbox.put_nowait((peer, changed))
            if self.joining:
                self._inbox.put_nowait((peer, {}))  # clients are served once these records are applied
        elif self.joining:
            self._joined(f"records from {peer} merged")

    async def _apply_loop(self) -> None:
        while True:
            peer, changed = await self._inbox.get()
            if not changed:
                self._joined(f"records from {peer} applied")
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
                self._pending_apply -= 1
                self._applying = self._pending_apply > 0
            if not self._applying:
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
            pvh = b.vhosts.get(k[1])
            for q in list(pvh.queues.values()) if pvh else []:
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
            src = vh.exchanges.get(k[2])
            if src is None:
                return
            bnd = Binding(k[2], k[3], k[4], dict((data or {}).get("arguments") or {}))
            if data is None:
                import json

                bnd.arguments = json.loads(k[5])
                src.unbind(bnd)
            elif k[3] in vh.queues:
                src.bind(bnd)
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
        stale = self.mirrors.get((vh.name, name))
        if stale is not None and stale.master != master and not stale.will_follow(master):
            await stale.discard()
        if master == self.me:
            if local is None or isinstance(local, RemoteQueue):
                movers = self._take_consumers(local)
                if local is not None:
                    await self._drop_local(vh, local)
                q = await vh.declare_queue(name, owner=None, durable=data["durable"], auto_delete=data["auto_delete"],
                                           arguments=data.get("arguments") or {})
                self._give_consumers(q, movers)
            return
        if isinstance(local, RemoteQueue):
            if local.master != master:
                local.master_changed(master)
            return
        if local is not None:
            log.warning("queue %r in vhost %r: master is now %s; dropping the copy here", name, vh.name, master)
            await self._demote(vh, local, master, data)
            return
        self._install_proxy(vh, name, master, data)

    def _install_proxy(self, vh: VHost, name: str, master: str, data: dict[str, Any]) -> RemoteQueue:
        rq = RemoteQueue(self, vh, name, master, durable=data["durable"], auto_delete=data["auto_delete"],
                         arguments=data.get("arguments") or {})
        vh.queues[name] = rq  # type: ignore[assignment]
        vh.exchanges[""].bind(Binding("", name, name))
        self.broker.apply_policies(rq)  # type: ignore[arg-type]
        return rq

    def _demote(self, vh: VHost, q: Queue, master: str, data: dict[str, Any]) -> asyncio.Task[Any]:
        """A copy mastered here lost its place to a master elsewhere: a proxy takes the name, the copy is discarded.

        In one step: no publish may find the name without a queue (an unroutable
        publish is confirmed, and dropped), and what the copy had not confirmed yet
        is refused, not confirmed (``Queue.discard``).
        """
        self._install_proxy(vh, q.name, master, data)
        return self._track_drop(vh.name, q.name, self.spawn(q.discard()))

    @staticmethod
    def _take_consumers(q: Any) -> list[Consumer]:
        """Consumers of a proxy that is being replaced by a master here; cancel-on-failover ones are cancelled."""
        if not isinstance(q, RemoteQueue):
            return []
        movers = []
        for c in q.release_consumers():
            if c.arguments.get("x-cancel-on-ha-failover"):
                c.channel.consumer_cancelled(c)
            else:
                movers.append(c)
        return movers

    @staticmethod
    def _give_consumers(q: Queue, consumers: list[Consumer]) -> None:
        for c in consumers:
            c.queue = q
            c.unacked = 0
            q.add_consumer(c)

    async def _drop_local(self, vh: VHost, q: Any) -> None:
        """Replace a queue object without touching its bindings (they name the queue, not the object)."""
        await self._start_drop(vh, q)

    def _start_drop(self, vh: VHost, q: Any) -> asyncio.Task[Any]:
        """Unlist ``q`` now and delete it; a mirror that opens the same store queue waits for the deletion."""
        name = q.name
        if vh.queues.get(name) is q:
            del vh.queues[name]
        return self._track_drop(vh.name, name, self.spawn(q.delete()))

    def _track_drop(self, vhost: str, name: str, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        k = (vhost, name)
        self._dropping[k] = task
        task.add_done_callback(lambda t: self._dropping.pop(k) if self._dropping.get(k) is t else None)
        return task

    # -- links ----------------------------------------------------------------------------
    def _peer_up(self, peer: str) -> None:
        self._leaving.discard(peer)
        self._check_majority()
        if peer in self._was_down:
            self._was_down.discard(peer)
            if self.cfg.partition_handling == "autoheal":
                side = self._heal_side[peer] = self._side(peer)  # the sides as they were when this link healed
                self.transport.send(peer, {"t": "heal", "side": side, "clients": self._side_clients(side)})
        self.transport.send(peer, {"t": "meta", "entries": self.table.encode()})
        self.gm.peer_up(peer)
        for vh in self.broker.vhosts.values():
            for q in list(vh.queues.values()):
                if isinstance(q, RemoteQueue) and q.master == peer:
                    q.resubscribe()
        self.reconcile_mirrors()

    def _peer_down(self, peer: str) -> None:
        self._check_majority()
        shutdown = peer in self._leaving
        self._leaving.discard(peer)
        self._was_down.add(peer)
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
        # A paused node acts as a stopped RabbitMQ node: its ring members record no deaths (the
        # majority's records, where they are the dead ones, replace them when it resumes).
        self.gm.peer_down(peer, verdict=not self.paused)
        for q in self._local_masters():
            if isinstance(q.bq, MirrorMasterBQ):
                q.bq.remove_mirror(peer, stop=False)
        for (vname, qname), m in list(self.mirrors.items()):
            if m.master == peer:
                # one tick of grace: in a partition the other peers may be about to go too (pause_minority)
                asyncio.get_running_loop().call_later(self.cfg.tick, self._maybe_promote, vname, qname, m, peer,
                                                      shutdown)
        self.reconcile_mirrors()

    def _on_message(self, peer: str, h: dict[str, Any], blob: bytes) -> None:
        t = h.get("t")
        if t == "meta":
            if peer in self._skip_meta:
                self._skip_meta.discard(peer)  # autoheal: the losing side's table is not merged
                return
            self._merge(peer, h)
        elif t == "clients":
            self._clients[peer] = int(h.get("n", 0))
        elif t == "heal":
            self._autoheal(peer, [str(n) for n in h.get("side", [peer])], int(h.get("clients", 0)))
        elif t == "pub_ok":
            entry = self._pending_pubs.pop(int(h["id"]), None)
            if entry is not None:
                entry[1](bool(h.get("ok")))
        elif t == "reply":
            req = self._requests.pop(int(h.get("re") or 0), None)
            if req is not None and not req[1].done():
                req[1].set_result((h, blob))
        elif t == "deliver":
            cid = str(h["cid"])
            c = self._proxy_consumers.get(cid)
            if c is None:
                # Its channel closed (or it moved) while this was on the way: the master takes it back and
                # stops delivering to that registration.
                back = {"vh": h.get("vh"), "q": h.get("q"), "cid": cid}
                self.transport.send(peer, {"t": "requeue", "seqs": [int(h["seq"])], **back})
                self.transport.send(peer, {"t": "cancel", **back})
                return
            c.queue.delivered(c, peer, cid, int(h["seq"]), bool(h.get("red")),  # type: ignore[attr-defined]
                              Message.from_bytes(blob))
        elif t is not None and t.startswith("gm"):
            self.gm.handle(peer, h, blob)
        elif t == "mq":
            self._mirror_op(peer, h)
        elif t == "mq_joined":
            mbq = self._master_bq(h.get("vh", ""), h.get("q", ""))
            if mbq is not None:
                mbq.mirror_joined(peer)
        elif t == "mq_ack":
            mbq = self._master_bq(h.get("vh", ""), h.get("q", ""))
            if mbq is not None:
                mbq.mirror_acked(peer, int(h["n"]), bool(h.get("synced")))
        elif t == "mq_gone":
            mbq = self._master_bq(h.get("vh", ""), h.get("q", ""))
            if mbq is not None and peer in mbq.mirrors:
                log.warning("queue %r: the mirror on %s is gone; it will be restarted", mbq.queue, peer)
                mbq.remove_mirror(peer, stop=False)
        elif t == "sync_req":
            mbq = self._master_bq(h.get("vh", ""), h.get("q", ""))
            if mbq is not None:
                mbq.sync()
        elif t == "bye":
            self._leaving.add(peer)
        elif t == "cancelled":
            c = self._proxy_consumers.get(h["cid"])
            if c is not None:
                c.queue.cancel_consumer(c)  # type: ignore[attr-defined]
        else:
            self.master_side.handle(peer, h, blob)

    # -- mirroring ---------------------------------------------------------------------------
    def _local_masters(self) -> list[Queue]:
        return [q for vh in self.broker.vhosts.values() for q in vh.queues.values()
                if isinstance(q, Queue) and isinstance(q.bq, MirrorMasterBQ) and not q.deleted]

    def _local_master(self, vhost: str, name: str) -> Queue | None:
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(name) if vh is not None else None
        return q if isinstance(q, Queue) and isinstance(q.bq, MirrorMasterBQ) and not q.deleted else None

    def _master_bq(self, vhost: str, name: str) -> MirrorMasterBQ | None:
        q = self._local_master(vhost, name)
        return q.bq if q is not None and isinstance(q.bq, MirrorMasterBQ) else None

    def _mirror_op(self, peer: str, h: dict[str, Any]) -> None:
        """The master's direct word to this node: start a mirror (it joins the queue's GM group), or stop it."""
        k = (str(h.get("vh", "")), str(h.get("q", "")))
        m = self.mirrors.get(k)
        if h.get("op") == "start":
            record = self.table.live().get(key("queue", *k))
            if record is not None and record.get("master") != peer:
                # a stale master (e.g. a node resuming after a partition): not ours to follow
                self.transport.send(peer, {"t": "mq_gone", "vh": k[0], "q": k[1]})
                return
            vh = self.broker.vhosts.get(k[0])
            local = vh.queues.get(k[1]) if vh is not None else None
            if vh is not None and isinstance(local, Queue) and record is not None:
                # The copy this node mastered before (it restarted, or a partition healed): the record applied
                # next would drop it, but the mirror must not open the same store queue until it is deleted (or
                # the deletion would hit the mirror's copy).
                log.warning("queue %r in vhost %r: master is now %s; dropping the copy here", k[1], k[0], peer)
                self._demote(vh, local, peer, record)
            self.mirrors[k] = Mirror(self, k[0], k[1], peer, bool(h.get("durable")), str(h["group"]), str(h["mm"]),
                                     predecessor=m, after=self._dropping.get(k))
        elif h.get("op") == "stop" and m is not None and m.master == peer:
            self.spawn(m.discard())

    def desired_mirrors(self, q: Queue) -> list[str]:
        """Nodes that should hold a mirror of ``q`` now, by its policy and who is up (join order kept)."""
        if q.exclusive_owner is not None:
            return []  # exclusive queues live and die with one connection on one node: never mirrored
        policy = q.policy or {}
        mode = policy.get("ha-mode")
        up = [n for n in self.cfg.peers if self.transport.is_up(n)]
        current = list(q.bq.mirrors) if isinstance(q.bq, MirrorMasterBQ) else []
        if mode == "all":
            return up
        if mode == "nodes":
            params = policy.get("ha-params") or []
            wanted = {str(n).rpartition("@")[2] for n in params} if isinstance(params, list) else set()
            return [n for n in up if n in wanted]
        if mode == "exactly":
            try:
                count = max(int(policy.get("ha-params", 1)) - 1, 0)
            except (TypeError, ValueError):
                return []
            keep = [n for n in current if n in up][:count]
            return keep + [n for n in up if n not in keep][: count - len(keep)]
        return []

    def reconcile_mirrors(self) -> None:
        if self.paused or self._await_winner is not None:
            return  # not until this node's view of who masters what is current again
        for q in self._local_masters():
            bq = q.bq
            assert isinstance(bq, MirrorMasterBQ)
            for peer in bq.silent_mirrors():
                log.warning("queue %r: the mirror on %s is not in the group (it did not follow a promotion, or "
                            "left the ring); restarting it", q.name, peer)
                bq.remove_mirror(peer)
            want = self.desired_mirrors(q)
            before = list(bq.mirrors)
            for peer in before:
                if peer not in want:
                    bq.remove_mirror(peer)
            auto = (q.policy or {}).get("ha-sync-mode") == "automatic"
            for peer in want:
                if peer not in bq.mirrors:
                    log.info("queue %r: starting a mirror on %s", q.name, peer)
                    bq.add_mirror(peer, sync=auto)
            if list(bq.mirrors) != before:
                self.local_changed()

    def _maybe_promote(self, vname: str, qname: str, m: Mirror, dead: str, shutdown: bool, waited: int = 0) -> None:
        if self.paused or self.transport.is_up(dead) or self.mirrors.get((vname, qname)) is not m:
            return  # paused: the majority side decides; or the master is back, or this mirror was replaced
        if m.gm is not None and m.master_member in m.gm.ring and waited < 10:
            # GM has not repaired the ring yet: what the dead master sent to any survivor is still on its way here
            asyncio.get_running_loop().call_later(self.cfg.tick / 2, self._maybe_promote, vname, qname, m, dead,
                                                  shutdown, waited + 1)
            return
        data = self.table.live().get(key("queue", vname, qname))
        if data is None or data.get("master") != dead or m.bq is None:
            log.info("queue %r: master %s gone, nothing to promote here (record %r)", qname, dead, data)
            return
        order = [n for n in data.get("mirrors", []) if n != dead]
        alive = [n for n in order if n == self.me or self.transport.is_up(n)]
        if not alive or alive[0] != self.me:
            log.info("queue %r: master %s gone; the oldest live mirror is %s", qname, dead, alive[0] if alive else None)
            return
        vh = self.broker.vhosts.get(vname)
        policy = self.broker.effective_policy(vname, qname)
        definition = policy["definition"] if policy else {}
        rule = definition.get("ha-promote-on-shutdown", "when-synced") if shutdown else \
            definition.get("ha-promote-on-failure", "always")
        if rule == "when-synced" and not m.synced:
            log.warning("queue %r: master %s %s and the mirror here is not in sync; not promoting (%s=when-synced)",
                        qname, dead, "stopped" if shutdown else "died",
                        "ha-promote-on-shutdown" if shutdown else "ha-promote-on-failure")
            return
        if vh is None:
            return
        log.warning("queue %r: master %s %s; promoting the mirror here (%s)", qname, dead,
                    "stopped" if shutdown else "died", "in sync" if m.synced else "NOT in sync")
        bq, msgs, gm = m.take_over()
        self.spawn(self._promote(vh, qname, data, bq, msgs, gm))

    async def _promote(self, vh: VHost, name: str, data: dict[str, Any], bq: BackingQueue,
                       msgs: dict[int, Message], gm: Endpoint | None) -> None:
        old = vh.queues.get(name)
        movers = self._take_consumers(old)
        if old is not None:
            await self._drop_local(vh, old)
        # the other mirrors stay: those whose member is alive in the group follow the new master
        ring = {node_of(m) for m in gm.ring} if gm is not None else set()
        keep = [n for n in data.get("mirrors", []) if n in ring and n != self.me and self.transport.is_up(n)]
        log.info("queue %r: promoted here; mirrors %s follow", name, keep)
        wrapper = MirrorMasterBQ(bq, self, vh.name, name, live=msgs, gm=gm, mirrors=keep)
        q = self.broker.make_queue(vh, name, wrapper, durable=data["durable"], auto_delete=data["auto_delete"],
                                   arguments=data.get("arguments") or {})
        vh.queues[name] = q
        vh.exchanges[""].bind(Binding("", name, name))
        self.broker.apply_policies(q)
        self.broker.metadata_changed(persist=data["durable"])
        self.reconcile_mirrors()
        self._give_consumers(q, movers)

    def sync_queue(self, vhost: str, name: str) -> str:
        q = self._local_master(vhost, name)
        if q is not None:
            assert isinstance(q.bq, MirrorMasterBQ)
            unsynced = [p for p, link in q.bq.mirrors.items() if not link.synced]
            n = q.bq.sync()
            return f"synchronising {len(unsynced)} mirror(s) of {name} with {n} message(s)"
        vh = self.broker.vhosts.get(vhost)
        rq = vh.queues.get(name) if vh is not None else None
        if isinstance(rq, RemoteQueue) and self.transport.send(rq.master, {"t": "sync_req", "vh": vhost, "q": name}):
            return f"asked master {rq.master} to synchronise {name}"
        from broker_impl.broker import BrokerError

        raise BrokerError(f"no queue '{name}' in vhost '{vhost}' with a reachable master")

    async def queue_counts(self, vhost: str, name: str) -> dict[str, Any]:
        """The master's ready and unacked counts, asked afresh when it is elsewhere, and this node's own copy's.

        Any node can answer "is the queue empty?" for a drain only with the master's
        counts: a mirror's copy lags, and a node without one knows nothing. While
        the master cannot be asked its counts are None (unknown, not zero).
        """
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(name) if vh is not None else None
        if isinstance(q, RemoteQueue):
            counts = await q.master_counts()
            ready, unacked = counts if counts is not None else (None, None)
        elif isinstance(q, Queue):
            ready, unacked = q.bq.len(), q.bq.depth() - q.bq.len()
        else:
            return {}
        m = self.mirrors.get((vhost, name))
        local = q.bq if isinstance(q, Queue) else m.bq if m is not None and not m.closed else None
        return {"messages_ready": ready, "messages_unacknowledged": unacked,
                "local_messages_ready": local.len() if local is not None else None,
                "local_messages_unacknowledged": local.depth() - local.len() if local is not None else None}

    def queue_info(self, vhost: str, name: str) -> dict[str, Any]:
        data = self.table.live().get(key("queue", vhost, name)) or {}
        q = self._local_master(vhost, name)
        if q is not None:
            data = q.bq.cluster_fields()  # type: ignore[attr-defined]
        ring = [node_of(m) for m in q.bq.gm.ring] if q is not None else []  # type: ignore[attr-defined]
        return {"node": data.get("master"), "mirrors": data.get("mirrors", []),
                "synchronised_mirrors": data.get("synced", []), "gm_ring": ring}

    # -- partitions ------------------------------------------------------------------------------
    def _check_majority(self) -> None:
        if self.cfg.partition_handling != "pause_minority":
            return
        total = 1 + len(self.cfg.peers)
        seen = 1 + len(self.transport.up_peers())
        minority = seen * 2 <= total
        if minority and not self.paused:
            # As a stopped RabbitMQ node: no clients, no promotions, no metadata writes. The
            # majority promotes mirrors of the queues mastered here meanwhile.
            self.paused = True
            self._await_winner = "*"
            self.gm.pause()
            log.warning("cluster: only %d of %d nodes visible; pausing (pause_minority): client connections closed",
                        seen, total)
            for conn in list(self.broker.connections):
                conn.force_close("node paused: minority partition")
        elif not minority and self.paused:
            # Rejoin as a restarted node would: the majority's records replace ours, so a queue
            # promoted there drops the copy here (what only this copy held is lost, as in RabbitMQ).
            self.paused = False
            self._restart_table("*")
            log.warning("cluster: %d of %d nodes visible again; resuming with the majority's metadata", seen, total)

    def _restart_table(self, source: str) -> None:
        """Forget the table; no local stamping until ``source`` ("*": any peer) has sent its own."""
        clock = self.table.clock
        self.table = Table(self.me)
        self.table.clock = clock
        self._await_winner = source

    def _side(self, returning: str) -> list[str]:
        """The nodes on this side of a partition that just healed towards ``returning``."""
        return sorted({self.me, *(p for p in self.transport.up_peers() if p != returning)})

    def _side_clients(self, side: list[str]) -> int:
        return sum(len(self.broker.connections) if n == self.me else self._clients.get(n, 0) for n in side)

    def _autoheal(self, peer: str, their_side: list[str], their_clients: int) -> None:
        """RabbitMQ's autoheal: the side with fewer clients (ties: the side without the smallest name) restarts.

        Restarting here means: close client connections and forget the metadata
        table, so the winner's records replace ours key by key; a queue mastered on
        both sides keeps the winner's master and our copy is dropped (its messages
        are lost, as in RabbitMQ), and mirrors restart empty under it.
        """
        if self.cfg.partition_handling != "autoheal":
            return
        my_side = self._heal_side.pop(peer, None) or self._side(peer)
        if set(my_side) & set(their_side):
            return  # healed already through a node both sides see: that pair decided
        mine = my_side
        my_clients = self._side_clients(mine)
        lose = (my_clients, min(their_side)) < (their_clients, min(mine))
        if not lose:
            log.warning("autoheal: this side %s (%d clients) wins over %s (%d clients)",
                        mine, my_clients, their_side, their_clients)
            self._skip_meta.add(peer)
            return
        log.warning("autoheal: this side %s (%d clients) loses to %s (%d clients); restarting queues from the winner",
                    mine, my_clients, their_side, their_clients)
        for conn in list(self.broker.connections):
            conn.force_close("autoheal: node restarting after a partition")
        self._restart_table(peer)

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
            "joining": self.joining,
        }


def is_local_master(q: Any) -> bool:
    return isinstance(q, Queue)
