"""Which nodes hold a mirror of each queue mastered here, and promotion when a master goes.

The copies themselves are ``mirror``'s (``MirrorMasterBQ`` on the master,
``Mirror`` on the others). Here: the nodes that should hold a mirror by the
policy's ha-mode and who is up (checked every tick and on every membership
change), restarting mirrors that left the ring; the master's direct messages to
a mirror node (start, stop); promotion one tick after a master is seen down (the
oldest live in-sync mirror, else by ha-promote-on-failure, or -on-shutdown when
the master said goodbye: see ``promotion_candidate``), waiting for GM to repair
the ring first; ``sync_queue``;
and the per-queue view the admin CLI shows (``queue_info``, ``queue_counts``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker_impl.backing_queue import BackingQueue
from broker_impl.cluster.catalog import Catalog
from broker_impl.cluster.gm_link import Endpoint, node_of
from broker_impl.cluster.handoff import Handoff
from broker_impl.cluster.metadata import key, queue_options
from broker_impl.cluster.mirror import Mirror, MirrorMasterBQ, Site
from broker_impl.cluster.partitions import Partitions
from broker_impl.cluster.remote import RemoteQueue
from broker_impl.errors import BrokerError
from broker_impl.exchange import Binding
from broker_impl.message import Message
from broker_impl.queue import Queue
from broker_impl.vhost import VHost

if TYPE_CHECKING:
    from broker_impl.cluster.host import ClusterHost

log = logging.getLogger("broker_impl.cluster")


def promotion_candidate(alive: list[str], synced: set[str], rule: str) -> str | None:
    """Which live mirror (``alive`` in join order, oldest first) takes over a queue whose master is gone.

    The oldest live mirror that is in sync; without one, ``always`` takes the
    oldest live mirror (what only the master held is lost) and ``when-synced``
    nobody (the queue waits for its master). RabbitMQ states the promise (the
    change that added the key: "If set to when-synced, unsynchronised slaves
    will not be promoted"), but its 3.x code
    (``rabbit_mirror_queue_misc:remove_from_queue``) always takes the oldest live
    mirror and lets when-synced refuse only when no mirror at all is in sync,
    which loses messages when the oldest mirror is the unsynchronised one and a
    younger one is in sync. This broker keeps the stated promise under both
    rules. Every node computes the same answer from the queue's record (its
    mirrors in join order) and the master's own count of its in-sync mirrors
    as its broadcasts carried it (``in_sync``).
    """
    for node in alive:
        if node in synced:
            return node
    if rule == "always" and alive:
        return alive[0]
    return None


def in_sync(m: Mirror, data: dict[str, Any]) -> set[str]:
    """The mirrors a promotion counts in sync: those the dead master counted so in the newest of its
    broadcasts delivered to the copy ``m`` (the same on every surviving copy once GM has repaired the
    ring), not the queue's record. The record is sent apart from the stream and may lag it: a master
    that counted a mirror in sync, and confirmed on its acks, may die before its record leaves (or while
    its catalog holds local changes back as it applies a peer's records). Only a copy that has had no
    broadcast yet (it has just joined) falls back on the record."""
    return set(m.counted) if m.counted is not None else set(data.get("synced", []))


class Mirroring:
    """The mirrors of the queues mastered here, the copies held here, and promotion."""

    def __init__(
        self, site: Site, broker: ClusterHost, catalog: Catalog, partitions: Partitions, handoff: Handoff
    ) -> None:
        self.site = site
        self.broker = broker
        self.me = site.me
        self.cfg = site.cfg
        self.transport = site.transport
        self.catalog = catalog
        self.partitions = partitions
        self.handoff = handoff
        self.mirrors = site.mirrors  # the copies held here, of queues mastered elsewhere
        self._leaving: set[str] = set()  # peers that said goodbye: a controlled stop, not a failure

    # -- queues mastered here ------------------------------------------------------------
    def _local_masters(self) -> list[Queue]:
        return [
            q
            for vh in self.broker.vhosts.values()
            for q in vh.queues.values()
            if isinstance(q, Queue) and isinstance(q.bq, MirrorMasterBQ) and not q.deleted
        ]

    def _local_master(self, vhost: str, name: str) -> Queue | None:
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(name) if vh is not None else None
        return q if isinstance(q, Queue) and isinstance(q.bq, MirrorMasterBQ) and not q.deleted else None

    def _master_bq(self, vhost: str, name: str) -> MirrorMasterBQ | None:
        q = self._local_master(vhost, name)
        return q.bq if q is not None and isinstance(q.bq, MirrorMasterBQ) else None

    def desired_mirrors(self, q: Queue) -> list[str]:
        """Nodes that should hold a mirror of ``q`` now, by its policy and who is up (join order kept)."""
        if q.exclusive_owner is not None:
            return []  # exclusive queues live and die with one connection on one node: never mirrored
        policy = q.policy or {}
        mode = policy.get("ha-mode")
        up = [n for n in self.transport.peers if self.transport.is_up(n)]  # the members, in join order
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

    def reconcile(self) -> None:
        if self.partitions.paused or self.catalog.await_winner is not None:
            return  # not until this node's view of who masters what is current again
        for q in self._local_masters():
            bq = q.bq
            assert isinstance(bq, MirrorMasterBQ)
            for peer in bq.silent_mirrors():
                log.warning(
                    "queue %r: the mirror on %s is not in the group (it did not follow a promotion, or "
                    "left the ring); restarting it",
                    q.name,
                    peer,
                )
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
                self.catalog.local_changed()

    def stopping(self) -> None:
        """The links are closed: no mirror will ack again, so the masters here drop them and publishes waiting
        for their acks stop waiting (their clients are gone already), and the queues can close."""
        for q in self._local_masters():
            assert isinstance(q.bq, MirrorMasterBQ)
            for peer in list(q.bq.mirrors):
                q.bq.remove_mirror(peer, stop=False)

    def sync_queue(self, vhost: str, name: str) -> str:
        q = self._local_master(vhost, name)
        if q is not None:
            assert isinstance(q.bq, MirrorMasterBQ)
            unsynced = [p for p, link in q.bq.mirrors.items() if not link.synced]
            n = q.bq.sync()
            return f"synchronising {len(unsynced)} mirror(s) of {name} with {n} message(s)"
        vh = self.broker.vhosts.get(vhost)
        rq = vh.queues.get(name) if vh is not None else None
        if isinstance(rq, RemoteQueue) and self.transport.send(
            rq.master, {"t": "sync_req", "vh": vhost, "q": name}
        ):
            return f"asked master {rq.master} to synchronise {name}"
        raise BrokerError(f"no queue '{name}' in vhost '{vhost}' with a reachable master")

    # -- messages between a master and its mirrors -------------------------------------------
    def handle(self, peer: str, h: dict[str, Any]) -> None:
        """``mq`` (the master's word to a mirror node) and the mirrors' answers to a master here."""
        t = h.get("t")
        if t == "mq":
            self._mirror_op(peer, h)
            return
        mbq = self._master_bq(h.get("vh", ""), h.get("q", ""))
        if mbq is None:
            return
        if t == "mq_joined":
            mbq.mirror_joined(peer)
        elif t == "mq_ack":
            mbq.mirror_acked(peer, int(h["n"]), bool(h.get("synced")), int(h.get("epoch", 0)))
        elif t == "mq_gone":
            if peer in mbq.mirrors:
                log.warning("queue %r: the mirror on %s is gone; it will be restarted", mbq.queue, peer)
                mbq.remove_mirror(peer, stop=False)
        elif t == "sync_req":
            mbq.sync()

    def _mirror_op(self, peer: str, h: dict[str, Any]) -> None:
        """The master's direct word to this node: start a mirror (it joins the queue's GM group), or stop it."""
        k = (str(h.get("vh", "")), str(h.get("q", "")))
        m = self.mirrors.get(k)
        if h.get("op") == "start":
            record = self.catalog.table.live().get(key("queue", *k))
            if record is not None and record.get("master") != peer:
                # a stale master (e.g. a node resuming after a partition): not ours to follow
                self.transport.send(peer, {"t": "mq_gone", "vh": k[0], "q": k[1]})
                return
            handoff = self.handoff
            vh = self.broker.vhosts.get(k[0])
            local = vh.queues.get(k[1]) if vh is not None else None
            if vh is not None and isinstance(local, Queue) and record is not None:
                # The copy this node mastered before (it restarted, or a partition healed): the record applied
                # next would drop it, but the mirror must not open the same store queue until it is deleted (or
                # the deletion would hit the mirror's copy).
                log.warning(
                    "queue %r in vhost %r: master is now %s; dropping the copy here", k[1], k[0], peer
                )
                handoff.demote(vh, local, peer, record)
            self.mirrors[k] = Mirror(
                self.site,
                k[0],
                k[1],
                peer,
                bool(h.get("durable")),
                str(h["group"]),
                str(h["mm"]),
                predecessor=m,
                after=handoff.dropping.get(k),
            )
        elif h.get("op") == "stop" and m is not None and m.master == peer:
            self.site.spawn(m.discard())

    # -- failover ---------------------------------------------------------------------------
    def leaving(self, peer: str) -> None:
        """``peer`` said goodbye: when its link goes, ha-promote-on-shutdown applies."""
        self._leaving.add(peer)

    def peer_up(self, peer: str) -> None:
        self._leaving.discard(peer)

    def peer_down(self, peer: str) -> None:
        """Its mirrors are gone from our masters; the copies here whose master it was may be promoted."""
        shutdown = peer in self._leaving
        self._leaving.discard(peer)
        for q in self._local_masters():
            if isinstance(q.bq, MirrorMasterBQ):
                q.bq.remove_mirror(peer, stop=False)
        # one tick of grace: in a partition the other peers may be about to go too (pause_minority)
        self._promote_later(lambda master: master == peer, shutdown)

    def forgotten(self, node: str) -> None:
        """``node`` left the cluster for good: the queues it mastered fail over by ha-promote-on-failure even
        if it stopped in a controlled way (when-synced would wait for a master that never comes back with its
        messages), as ``rabbitmqctl forget_cluster_node`` promotes the oldest mirror."""
        self._promote_later(lambda master: master == node, False)

    def resumed(self) -> None:
        """This node resumed from a pause: a copy here whose master is still down may be promoted now. The check
        at the master's loss found this node paused and left it to the majority, and the majority may be waiting
        for this very copy (a node paused for a partition that was partial only while it formed)."""
        self._promote_later(lambda master: not self.transport.is_up(master), False)

    def _promote_later(self, gone: Callable[[str], bool], shutdown: bool) -> None:
        """In a tick, consider promoting each copy here whose master ``gone`` says is gone."""
        for (vname, qname), m in list(self.mirrors.items()):
            if gone(m.master):
                asyncio.get_running_loop().call_later(
                    self.cfg.tick, self._maybe_promote, vname, qname, m, m.master, shutdown
                )

    def _maybe_promote(
        self, vname: str, qname: str, m: Mirror, dead: str, shutdown: bool, waited: int = 0
    ) -> None:
        if self.partitions.paused or self.transport.is_up(dead) or self.mirrors.get((vname, qname)) is not m:
            return  # paused: the majority side decides; or the master is back, or this mirror was replaced
        follows = node_of(m.master_member)
        if follows != dead:
            # Another survivor took over first and this copy follows it (its ``promoted`` broadcast came here
            # through GM). The record here may still name the dead master: deciding from it would promote a
            # second master (under ``always``, this copy even when not in sync).
            log.info(
                "queue %r: master %s gone, nothing to promote here: the mirror here follows %s, promoted since",
                qname,
                dead,
                follows,
            )
            return
        if m.gm is not None and m.master_member in m.gm.ring and waited < 10:
            # GM has not repaired the ring yet: what the dead master sent to any survivor is still on its way here
            asyncio.get_running_loop().call_later(
                self.cfg.tick / 2, self._maybe_promote, vname, qname, m, dead, shutdown, waited + 1
            )
            return
        data = self.catalog.table.live().get(key("queue", vname, qname))
        if data is None or data.get("master") != dead or m.bq is None:
            log.info("queue %r: master %s gone, nothing to promote here (record %r)", qname, dead, data)
            return
        self._promote_if_chosen(vname, qname, m, dead, shutdown, data)

    def _promotion_rule(self, vname: str, qname: str, shutdown: bool) -> str:
        """The queue's policy on which mirror may take over: one rule for a clean stop, another for a crash."""
        policy = self.broker.effective_policy(vname, qname)
        definition = policy["definition"] if policy else {}
        return (
            definition.get("ha-promote-on-shutdown", "when-synced")
            if shutdown
            else definition.get("ha-promote-on-failure", "always")
        )

    def _promote_if_chosen(
        self, vname: str, qname: str, m: Mirror, dead: str, shutdown: bool, data: dict[str, Any]
    ) -> None:
        """Among the live mirrors the queue's record lists, the rule picks one: promote it if it is this one."""
        order = [n for n in data.get("mirrors", []) if n != dead]
        alive = [n for n in order if n == self.me or self.transport.is_up(n)]
        vh = self.broker.vhosts.get(vname)
        rule = self._promotion_rule(vname, qname, shutdown)
        synced = in_sync(m, data)
        chosen = promotion_candidate(alive, synced, rule)
        key_name = "ha-promote-on-shutdown" if shutdown else "ha-promote-on-failure"
        if chosen is None:
            # With no live mirror listed at all no rule promotes: say so, and which rule held (it is not
            # always when-synced then; the record's mirror list is what to look at).
            log.warning(
                "queue %r: master %s %s and no live mirror is in sync; not promoting (%s=%s%s)",
                qname,
                dead,
                "stopped" if shutdown else "died",
                key_name,
                rule,
                "" if alive else f"; none of the mirrors the queue's record lists, {order}, is up",
            )
            return
        if chosen != self.me:
            log.info(
                "queue %r: master %s gone; live mirrors %s, in sync %s: %s takes over",
                qname,
                dead,
                alive,
                sorted(synced),
                chosen,
            )
            return
        if rule == "when-synced" and not (m.counted_in_sync if m.counted is not None else m.synced):
            log.warning(
                "queue %r: master %s %s and the mirror here is not in sync; not promoting (%s=when-synced)",
                qname,
                dead,
                "stopped" if shutdown else "died",
                key_name,
            )
            return
        if vh is None:
            return
        log.warning(
            "queue %r: master %s %s; promoting the mirror here (%s)",
            qname,
            dead,
            "stopped" if shutdown else "died",
            "in sync" if m.synced else "NOT in sync",
        )
        bq, msgs, gm = m.take_over()
        self.site.spawn(self._promote(vh, qname, data, bq, msgs, gm))

    async def _promote(
        self,
        vh: VHost,
        name: str,
        data: dict[str, Any],
        bq: BackingQueue,
        msgs: dict[int, Message],
        gm: Endpoint | None,
    ) -> None:
        handoff = self.handoff
        old = vh.queues.get(name)
        movers = handoff.take_consumers(old)
        # the other mirrors stay: those whose member is alive in the group follow the new master
        ring = {node_of(m) for m in gm.ring} if gm is not None else set()
        keep = [n for n in data.get("mirrors", []) if n in ring and n != self.me and self.transport.is_up(n)]
        log.info("queue %r: promoted here; mirrors %s follow", name, keep)
        wrapper = MirrorMasterBQ(bq, self.site, vh.name, name, live=msgs, gm=gm, mirrors=keep)
        q = self.broker.make_queue(
            vh,
            name,
            wrapper,
            **queue_options(data),
        )
        # The proxy leaves the name in the step the new master takes it: a publish that found no queue
        # under the name, here or forwarded from another node, would be confirmed as unroutable, and dropped.
        dropped = handoff.start_drop(vh, old) if old is not None else None
        vh.queues[name] = q
        vh.exchanges[""].bind(Binding("", name, name))
        self.broker.apply_policies(q)
        q.restore_deadlines(promoted=True)  # after the policies: a policy's message-ttl counts too
        self.broker.metadata_changed(persist=data["durable"])
        self.reconcile()
        handoff.give_consumers(q, movers)
        if dropped is not None:
            await dropped

    # -- the operator's view -------------------------------------------------------------------
    def queue_info(self, vhost: str, name: str) -> dict[str, Any]:
        data = self.catalog.table.live().get(key("queue", vhost, name)) or {}
        q = self._local_master(vhost, name)
        if q is not None:
            data = q.bq.cluster_fields()  # type: ignore[attr-defined]
        ring = [node_of(m) for m in q.bq.gm.ring] if q is not None else []  # type: ignore[attr-defined]
        return {
            "node": data.get("master"),
            "mirrors": data.get("mirrors", []),
            "synchronised_mirrors": data.get("synced", []),
            "gm_ring": ring,
        }

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
        return {
            "messages_ready": ready,
            "messages_unacknowledged": unacked,
            "local_messages_ready": local.len() if local is not None else None,
            "local_messages_unacknowledged": local.depth() - local.len() if local is not None else None,
        }
