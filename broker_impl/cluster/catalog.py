"""This node's side of the cluster metadata: what it sends, and applying what peers send.

The table and its consistency model are ``metadata``'s. Here: after every local
topology change the node diffs its topology against the table and sends what
changed (``local_changed``); records from peers are merged at once (so a
message that follows on the same link sees them) and applied in order later,
one batch at a time, vhosts before the queues and bindings that need them.
Applying a queue record is where a queue object changes kind on this node: a
proxy (``remote.RemoteQueue``) when the master is elsewhere, the real queue
when it is here, and the copy of a master replaced elsewhere is dropped.

No local stamping while merged records wait to be applied (they would look
like local deletions), nor while a partition's loser waits for the winner's
records (``await_winner``). Until the first peer's records are applied after a
start, a node may hold stale copies of queues mastered elsewhere: it refuses
clients meanwhile (``joining``).

The table is persisted with its stamps (``cluster.json`` in the data directory,
fsynced before anything that follows a change: a promoted master writes its
record before it confirms a publish). At start the node applies the queue
records it persisted before it claims anything (``recover``): a durable queue
whose recorded master is another node becomes a proxy and the copy here is
dropped, so after a whole-cluster cold start the master is the node that
confirmed the messages, not the node with the highest name.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from broker_impl.cluster.handoff import Handoff
from broker_impl.cluster.metadata import Entry, Table, collect, key, queue_options, split_key
from broker_impl.cluster.mirror import Mirror, MirrorMasterBQ
from broker_impl.cluster.remote import RemoteQueue
from broker_impl.cluster.transport import Transport
from broker_impl.config import Permission
from broker_impl.errors import BrokerError
from broker_impl.exchange import Binding, destination_exchange
from broker_impl.exchange_types import make_exchange
from broker_impl.store.durable import write_file
from broker_impl.vhost import VHost

if TYPE_CHECKING:
    from broker_impl.cluster.host import ClusterHost

log = logging.getLogger("broker_impl.cluster")

TABLE_FILE = "cluster.json"

_APPLY_ORDER = {"vhost": 0, "user": 1, "perm": 2, "policy": 3, "exchange": 4, "queue": 5, "binding": 6}


class Catalog:
    """The metadata table on this node, its sending and its applying."""

    def __init__(
        self,
        me: str,
        transport: Transport,
        broker: ClusterHost,
        handoff: Handoff,
        mirrors: dict[tuple[str, str], Mirror],
    ) -> None:
        self.broker = broker
        self.me = me
        self.transport = transport
        self.handoff = handoff
        self.mirrors = (
            mirrors  # the copies held here (``ha.Mirroring``'s): a stale one goes when a record moves on
        )
        self._path = self.broker.data_dir / TABLE_FILE
        self.table = self._restore()
        self._inbox: asyncio.Queue[tuple[str, dict[str, Entry]]] = asyncio.Queue()
        self._pending_apply = 0
        self._applying = False
        self._dirty = False
        self.joining = True
        self.await_winner: str | None = (
            None  # a peer ("*": any) whose records must come before we stamp again
        )
        self._skip_meta: set[str] = set()  # autoheal: the losing side's next table is not merged

    # -- persistence ------------------------------------------------------------------------
    def _restore(self) -> Table:
        if not self._path.exists():
            return Table(self.me)
        try:
            return Table.load(self.me, self._path.read_bytes())
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise BrokerError(
                f"{self._path}: cluster metadata is not valid ({exc}); move it away and the node "
                "takes the cluster's records from its peers"
            ) from None

    def _save(self) -> None:
        write_file(self._path, self.table.dump())

    async def recover(self) -> None:
        """Before the first claim after a start: follow the masters the persisted records name."""
        for k, data in self.table.live().items():
            parts = split_key(k)
            if parts[0] == "queue" and data.get("master", self.me) != self.me:
                await self._apply_queue(self._vhost(parts[1]), parts[2], data)

    # -- sending ----------------------------------------------------------------------------
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
        if self._applying or self._pending_apply or self.await_winner is not None:
            # merged records not applied yet would look like local deletions
            self._dirty = True
            return
        changed = self.table.diff(collect(self.broker, self._queue_fields()))
        if changed:
            self._save()
            self._broadcast(changed)

    def _broadcast(self, entries: dict[str, Entry]) -> None:
        transport = self.transport
        body = {"t": "meta", "entries": self.table.encode(entries)}
        for peer in transport.up_peers():
            transport.send(peer, body)

    def send_table(self, peer: str, *, ask: bool = False) -> None:
        """The whole table to a peer whose link just came up: how a returning node catches up. ``ask``: the
        peer sends its own back (``rejoin``)."""
        self.transport.send(peer, {"t": "meta", "entries": self.table.encode(), "ask": ask})

    def restart(self, source: str) -> None:
        """Forget the table; no local stamping until ``source`` ("*": any peer) has sent its own (autoheal's
        loser, whose winner's records replace its own).

        The node is joining again, as after a start: it turns clients away, and its schedule routes
        no delayed message, until ``source``'s records are applied. Until then its queues are what
        they were before (a copy it mastered while cut off is still its master here), and a publish
        or a due delayed message confirmed by such a copy is lost when the records drop it
        (``scenarios/reference-delayed.yaml`` seed 17 lost 67 delayed messages that way, routed by
        a node resuming after ``pause_minority`` in the 50 ms before the majority's records
        replaced its copy of the queue).
        """
        clock = self.table.clock
        self.table = Table(self.me)
        self.table.clock = clock
        self.await_winner = source
        self.joining = True

    def rejoin(self) -> None:
        """After a pause (pause_minority): joining again with the table kept, as after a start.

        No local stamping and no clients until a peer's records are merged into it (by generation,
        then stamp). Unlike ``restart`` nothing is forgotten: the peer may have been paused too, with no
        records newer than ours to send.

        The visible peers are sent ours and asked for theirs (``ask``): a node that resumes
        while its links stayed up (a partition that stopped being partial) gets no link-up exchange, and
        waited out the join's time limit while its promotions reached no peer.
        """
        self.await_winner = "*"
        self.joining = True
        for peer in self.transport.up_peers():
            self.send_table(peer, ask=True)

    def drop_queues_of(self, node: str) -> list[str]:
        """``node`` was forgotten: delete the records of the queues it mastered that have no mirror on a member
        to fail over to (``rabbitmqctl forget_cluster_node`` deletes them too: the node comes back empty, if at
        all). Sent to every member and applied here as a master's delete would be. Returns the queue names."""
        members = {self.me, *self.transport.peers}
        gone: dict[str, Entry] = {}
        for k, data in self.table.live().items():
            parts = split_key(k)
            if parts[0] != "queue" or data.get("master") != node:
                continue
            if any(m in members for m in data.get("mirrors", [])):
                continue  # a mirror takes over (``ha.forgotten``)
            gone[k] = self.table.set(k, None)
        if gone:
            self._broadcast(gone)
            self._pending_apply += 1
            self._inbox.put_nowait((self.me, gone))
        return sorted(f"{split_key(k)[1]}/{split_key(k)[2]}" for k in gone)

    def skip_next_from(self, peer: str) -> None:
        self._skip_meta.add(peer)

    # -- receiving --------------------------------------------------------------------------
    def joined(self, why: str) -> None:
        if self.joining:
            self.joining = False
            log.info("cluster: serving clients (%s)", why)

    def received(self, peer: str, h: dict[str, Any]) -> None:
        """A ``meta`` message: merge at once (so a message that follows on the link sees the new records), and
        answer with this node's table when the sender asks for it."""
        self._merge(peer, h)
        if h.get("ask"):
            self.send_table(peer)

    def _merge(self, peer: str, h: dict[str, Any]) -> None:
        if peer in self._skip_meta:
            self._skip_meta.discard(peer)
            return
        if self.await_winner in (peer, "*"):
            self.await_winner = None
        # after a restart only the awaited peer's records end the join, not another peer's
        ends_join = self.joining and self.await_winner is None
        changed = self.table.merge(Table.decode(h.get("entries", {})))
        if changed:
            self._save()
            self._pending_apply += 1
            self._inbox.put_nowait((peer, changed))
        if ends_join and (changed or self._pending_apply):
            # clients are served once the records merged so far are applied (a peer's records that add
            # nothing do not end the join while earlier ones wait: reference-delayed seed 15 lost 14 so)
            self._inbox.put_nowait((peer, {}))
        elif ends_join:
            self.joined(f"records from {peer} merged")

    async def apply_loop(self) -> None:
        while True:
            peer, changed = await self._inbox.get()
            if not changed:
                self.joined(f"records from {peer} applied")
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
                b.permissions[(k[1], k[2])] = Permission(
                    k[1], k[2], data["configure"], data["write"], data["read"]
                )
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
                ex = make_exchange(
                    data["type"],
                    k[2],
                    durable=data["durable"],
                    auto_delete=data["auto_delete"],
                    internal=data["internal"],
                    arguments=data.get("arguments") or {},
                )
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
                bnd.arguments = json.loads(k[5])
                src.unbind(bnd)
            elif k[3] in vh.queues or destination_exchange(k[3]) in vh.exchanges:
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
        handoff = self.handoff
        master = data.get("master", self.me)
        stale = self.mirrors.get((vh.name, name))
        if stale is not None and stale.master != master and not stale.will_follow(master):
            await stale.discard()
        if master == self.me:
            if local is None or isinstance(local, RemoteQueue):
                movers = handoff.take_consumers(local)
                # The proxy leaves the name and the queue takes it with no wait in between (opening a backing
                # queue does not wait): a publish that found no queue under the name would be confirmed as
                # unroutable, and dropped.
                dropped = handoff.start_drop(vh, local) if local is not None else None
                q = await vh.declare_queue(
                    name,
                    owner=None,
                    **queue_options(data),
                )
                handoff.give_consumers(q, movers)
                if dropped is not None:
                    await dropped
            return
        if isinstance(local, RemoteQueue):
            if local.master != master:
                local.master_changed(master)
            return
        if local is not None:
            log.warning(
                "queue %r in vhost %r: master is now %s; dropping the copy here", name, vh.name, master
            )
            await handoff.demote(vh, local, master, data)
            return
        handoff.install_proxy(vh, name, master, data)
