"""The node's cluster side: one object the broker holds, built from parts with one duty each.

``ClusterNode`` is what the broker holds when ``[cluster]`` names peers
(``config``). It owns the links and the failure detector (``transport``),
routes what arrives on them, and keeps the order in which the parts hear of a
peer coming up or going down. The parts:

``catalog.Catalog``
    the metadata table on this node (model in ``metadata``): sending local
    changes, applying peers' records, refusing clients until the first are in;
``ha.Mirroring``
    which nodes hold a mirror of each queue mastered here, the copies held
    here, promotion when a master goes, ``sync_queue``;
``partitions.Partitions``
    pause_minority and autoheal;
``forwarding.Forwarder``
    what this node has outstanding with masters elsewhere (publishes awaiting
    a confirm, requests, consumer registrations);
``remote.MasterSide``
    the other side of that: operations forwarded to queues mastered here;
``handoff.Handoff``
    replacing the queue object behind a name (consumers move over);
``gm_link.GmHub``
    the GM members and group store of the mirrored queues;
``membership.Membership``
    which of the configured peers are members now (``forget``, a node's
    request to join, and the copies peers send when a link comes up).

Membership changes: ``forget`` (``ctl forget_cluster_node``, refused while the
node is seen running) drops the node here and tells every member; each of them
stops talking to it (its links close, it is never dialled, its connections are
refused), the GM members on it are recorded dead at once (``members_left``), and
the queues it mastered fail over as when a node dies (those without a mirror on
a member are deleted, as RabbitMQ does); its mirrors are gone from every master. A node that was ``reset`` and given ``join_cluster SEED`` dials
SEED with a HELLO asking to join; SEED admits it (``_admit``), tells the others,
and the node learns the members from SEED and dials them. It starts empty: the
masters start mirrors on it by their policy, synced by ha-sync-mode.

The broker sees only this module's public methods: ``start``/``stop``,
``wrap_backing``, ``local_changed``, ``client_refusal``, and the operator's
``status``, ``queue_info``, ``queue_counts``, ``sync_queue``.

No part holds this object: each is handed the narrow things it uses (the config,
the transport, ``spawn``, the parts below it), lower parts first, and a queue's
master and copies get a ``mirror.Site``. A part that must ask a higher one
something gets a function (the GM hub's ``paused``), so no part imports this module.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from broker_impl.backing import MemoryBackingQueue, make_backing_queue
from broker_impl.backing_queue import BackingQueue
from broker_impl.cluster.catalog import Catalog
from broker_impl.cluster.config import ClusterConfig
from broker_impl.cluster.forwarding import Forwarder
from broker_impl.cluster.gm_link import GmHub
from broker_impl.cluster.ha import Mirroring
from broker_impl.cluster.handoff import Handoff
from broker_impl.cluster.membership import Membership, MembershipError
from broker_impl.cluster.mirror import Mirror, MirrorMasterBQ, Site
from broker_impl.cluster.partitions import Partitions
from broker_impl.cluster.remote import MasterSide, proxies_of
from broker_impl.cluster.transport import Transport
from broker_impl.errors import BrokerError

if TYPE_CHECKING:
    from broker_impl.cluster.host import ClusterHost

log = logging.getLogger("broker_impl.cluster")

#: What a master elsewhere answers this node's proxies with.
_FORWARDED = frozenset({"pub_ok", "reply", "deliver", "cancelled"})
#: A master's word to a mirror node, and the mirrors' answers to a master.
_MIRRORING = frozenset({"mq", "mq_joined", "mq_ack", "mq_gone", "sync_req"})


class ClusterNode:
    """This node as a cluster member; the broker calls ``local_changed`` after every topology change."""

    def __init__(self, broker: ClusterHost, cfg: ClusterConfig) -> None:
        self.broker = broker
        self.cfg = cfg
        self.me = cfg.node
        # Peers seen to go down so far: a confirm that arrives after a loss may be a minority's
        # own (broker_impl.schedule uses it to keep a delayed message until it is routed safely).
        self.peer_losses = 0
        try:
            self.membership = Membership.load(broker.data_dir, self.me, cfg.peers)
        except MembershipError as exc:
            raise BrokerError(str(exc)) from None
        members = {n: addr for n, addr in cfg.peers.items() if self.membership.is_member(n)}
        self.transport = Transport(
            self.me,
            (cfg.listen, cfg.port),
            members,
            tick=cfg.tick,
            down_after=cfg.down_after,
            on_message=self._on_message,
            on_up=self._peer_up,
            on_down=self._peer_down,
            on_join=self._admit,
        )
        seed = self.membership.join
        if seed is not None and seed in cfg.peers:
            self.transport.add_peer(seed, *cfg.peers[seed], join=True)
        # Each part is handed what it uses, lower parts first; what a part learns of a later one
        # (the GM hub asks whether this node is paused) it asks through a function.
        spawn = broker.spawn
        self.gm = GmHub(cfg, self.transport, spawn, paused=lambda: self.partitions.paused)
        self.forwarder = Forwarder(self.me, self.transport)
        self.handoff = Handoff(self.forwarder, self.transport, spawn, broker.apply_policies)
        self.site = Site(
            cfg,
            self.transport,
            self.gm,
            spawn,
            mirrors={},
            reconcile_mirrors=self.reconcile_mirrors,
            local_changed=self.local_changed,
            backing=self._backing,
        )
        self.catalog = Catalog(self.me, self.transport, broker, self.handoff, self.site.mirrors)
        self.partitions = Partitions(
            cfg, self.transport, broker, self.catalog, self.gm, resumed=lambda: self.ha.resumed()
        )
        self.master_side = MasterSide(broker.vhosts, self.transport, spawn, gate=self.partitions)
        self.ha = Mirroring(self.site, broker, self.catalog, self.partitions, self.handoff)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        await self.catalog.recover()
        self.catalog.local_changed()
        self.spawn(self.catalog.apply_loop())
        self.gm.start()
        self.partitions.start()
        await self.transport.start()
        # Until the first peer's records are in, a restarted node may hold stale copies of queues
        # mastered elsewhere: clients wait (or 2 x the down detection time if nobody answers).
        asyncio.get_running_loop().call_later(2 * self.cfg.tick * self.cfg.down_after, self._join_gave_up)
        self.spawn(self._housekeeping())

    def _join_gave_up(self) -> None:
        """No peer's records came in time: serve alone, unless the partition handling says a node that
        cannot see a majority does not serve (pause_minority: it joins once a majority is visible)."""
        if self.partitions.paused or not self.catalog.joining:
            return
        self.partitions.serving_alone()
        self.catalog.joined("no peer answered")

    async def stop(self) -> None:
        """A controlled stop: peers apply ha-promote-on-shutdown instead of -on-failure."""
        for peer in self.transport.up_peers():
            self.transport.send(peer, {"t": "bye"})
        await asyncio.sleep(min(self.cfg.tick, 0.1))
        await self.transport.stop()
        self.ha.stopping()

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.tick)
            try:
                for peer in self.transport.up_peers():
                    self.transport.send(peer, {"t": "clients", "n": len(self.broker.connections)})
                self.partitions.tick()
                self.ha.reconcile()
                self.catalog.local_changed()
            except Exception:
                log.exception("cluster housekeeping failed")

    def wrap_backing(self, vhost: str, name: str, bq: BackingQueue) -> BackingQueue:
        """Every queue mastered here streams to its mirrors (none until a policy asks for some)."""
        return MirrorMasterBQ(bq, self.site, vhost, name)

    def _backing(self, key: str, durable: bool) -> MemoryBackingQueue:
        """A mirror's own copy: a backing queue of this node's store."""
        b = self.broker
        return make_backing_queue(key, durable, b.store, ram_budget_bytes=b.ram_budget())

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """The broker's tasks: cancelled and their failures logged in one place."""
        return self.broker.spawn(coro)

    # -- what the broker and the queue copies (``mirror``) ask -------------------------------
    def local_changed(self) -> None:
        self.catalog.local_changed()

    @property
    def mirrors(self) -> dict[tuple[str, str], Mirror]:
        """The copies held here of queues mastered elsewhere; a copy unregisters itself when it ends."""
        return self.site.mirrors

    def reconcile_mirrors(self) -> None:
        """A master's mirror set may have changed (one left the group): start or stop mirrors now."""
        self.ha.reconcile()

    def confirms_held(self) -> bool:
        """Whether publisher confirms wait now (``partitions.Partitions.confirms_held``)."""
        return self.partitions.confirms_held()

    def client_refusal(self) -> str | None:
        """Why this node turns clients away now, or None when it serves them."""
        if self.partitions.paused:
            return "paused (minority partition)"
        if self.catalog.joining:
            return "joining the cluster"
        return None

    def status(self) -> dict[str, Any]:
        peers = self.transport.status()
        return {
            "node": self.me,
            "listen": f"{self.transport.bound[0]}:{self.transport.bound[1]}",
            "members": [self.me, *self.transport.peers],
            "joining_via": self.membership.join,
            "running": [self.me, *self.transport.up_peers()],
            "down": [p["name"] for p in peers if not p["running"]],
            "peers": peers,
            "partitions": [p["name"] for p in peers if p["times_down"] and not p["running"]],
            "partition_handling": self.cfg.partition_handling,
            "paused": self.partitions.paused,
            "joining": self.catalog.joining,
        }

    def queue_info(self, vhost: str, name: str) -> dict[str, Any]:
        return self.ha.queue_info(vhost, name)

    async def queue_counts(self, vhost: str, name: str) -> dict[str, Any]:
        return await self.ha.queue_counts(vhost, name)

    def sync_queue(self, vhost: str, name: str) -> str:
        return self.ha.sync_queue(vhost, name)

    # -- membership -----------------------------------------------------------------------
    def forget(self, node: str) -> str:
        """The operator removes ``node`` from the cluster (``ctl forget_cluster_node``); every member hears of it."""
        if node == self.me:
            raise BrokerError(f"{node} cannot forget itself: run forget_cluster_node on another member")
        if self.transport.is_up(node):
            raise BrokerError(f"{node} is running; stop its app first (stop_app on {node}), then forget it")
        try:
            self.membership.forget(node)
        except MembershipError as exc:
            raise BrokerError(str(exc)) from None
        self._forgotten(node)
        self._send_members()
        dropped = self.catalog.drop_queues_of(node)
        if dropped:
            log.warning(
                "cluster: queues mastered on %s with no mirror to take over deleted: %s", node, dropped
            )
        return (
            f"{node} removed from the cluster; members now {', '.join([self.me, *self.transport.peers])}"
            + (f"; queues it mastered without a mirror deleted: {', '.join(dropped)}" if dropped else "")
        )

    def _forgotten(self, node: str) -> None:
        """Stop talking to ``node``: links closed (as a node going down: queues it mastered fail over), its
        GM members recorded dead for good, and it no longer counts towards a majority."""
        log.warning("cluster: %s was removed from the cluster; no longer talking to it", node)
        self.transport.remove_peer(node)
        self.gm.node_left(node)
        self.ha.forgotten(node)
        self.partitions.check_majority()
        self.ha.reconcile()

    def _admit(self, node: str) -> bool:
        """``node`` asks to join (its HELLO says so): a member from now on, if the config knows where it is."""
        addr = self.cfg.peers.get(node)
        if addr is None or node == self.me or self.partitions.paused:
            return False
        if self.membership.admit(node):
            log.warning("cluster: %s joins the cluster", node)
        self.transport.add_peer(node, *addr)
        self.partitions.check_majority()  # one more member: a majority of them may not be visible now
        self._send_members()
        return True

    def _send_members(self) -> None:
        for peer in self.transport.up_peers():
            self.transport.send(peer, {"t": "members", "epochs": self.membership.epochs})

    def _members_said(self, peer: str, epochs: dict[str, Any]) -> None:
        added, removed = self.membership.merge({str(n): int(e) for n, e in epochs.items()})
        if self.membership.is_member(self.me) and int(epochs.get(self.me, 0)) % 2 == 1:
            self.membership.joined()  # the cluster counts this node in: no need to ask to join again
        for node in sorted(added - {self.me}):
            addr = self.cfg.peers.get(node)
            if addr is None:
                log.error(
                    "cluster: %s says %s is a member, but [cluster] peers has no address for it", peer, node
                )
                continue
            log.warning("cluster: %s joined the cluster (heard from %s)", node, peer)
            self.transport.add_peer(node, *addr)
        if added:
            # The majority is of the members as they are now: a node that was cut off while members were
            # admitted, and sees a majority of the members it knew, is a minority of the cluster's.
            self.partitions.check_majority()
        for node in sorted(removed):
            if node == self.me:
                log.error(
                    "cluster: %s says this node was removed from the cluster; reset it and join again", peer
                )
            else:
                self._forgotten(node)
        if added or removed:
            self._send_members()

    # -- links ----------------------------------------------------------------------------
    def _peer_up(self, peer: str) -> None:
        self.transport.send(peer, {"t": "members", "epochs": self.membership.epochs})
        self.ha.peer_up(peer)
        self.partitions.peer_up(peer)
        self.catalog.send_table(peer)
        self.gm.peer_up(peer)
        for proxy in proxies_of(self.broker.vhosts, peer):
            proxy.resubscribe()
        self.ha.reconcile()

    def _peer_down(self, peer: str) -> None:
        self.peer_losses += 1
        self.partitions.peer_down(peer)
        self.forwarder.peer_down(peer)
        for proxy in proxies_of(self.broker.vhosts, peer):
            proxy.master_down()
        self.master_side.peer_down(peer)
        # A paused node acts as a stopped RabbitMQ node: its ring members record no deaths (the
        # majority's records, where they are the dead ones, replace them when it resumes).
        self.gm.peer_down(peer, verdict=not self.partitions.paused)
        self.ha.peer_down(peer)
        self.ha.reconcile()

    def _on_message(self, peer: str, h: dict[str, Any], blob: bytes) -> None:
        t = h.get("t")
        if t == "meta":
            self.catalog.received(peer, h)
        elif t == "members":
            self._members_said(peer, h.get("epochs") or {})
        elif t == "clients":
            self.partitions.clients_said(peer, int(h.get("n", 0)))
        elif t == "check_partial":
            self.partitions.check_partial(peer, str(h.get("node")), str(h.get("inc")))
        elif t == "probe":
            self.transport.send(peer, {"t": "probe_ok"})
        elif t == "probe_ok":
            self.partitions.probed(peer)
        elif t == "partial":
            self.partitions.partial(peer, str(h.get("node")))
        elif t == "not_partial":
            self.partitions.not_partial(peer, str(h.get("node")))
        elif t == "heal":
            self.partitions.heal(peer, [str(n) for n in h.get("side", [peer])], int(h.get("clients", 0)))
        elif t in _FORWARDED:
            self.forwarder.handle(peer, h, blob)
        elif t is not None and t.startswith("gm"):
            self.gm.handle(peer, h, blob)
        elif t in _MIRRORING:
            self.ha.handle(peer, h)
        elif t == "bye":
            self.ha.leaving(peer)
        else:
            self.master_side.handle(peer, h, blob)
