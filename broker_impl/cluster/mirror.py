"""Mirrored queues: the master's backing queue broadcasts every operation over GM, mirrors replay it.

Every mirrored queue has one GM group (``gm``, run on the node links by
``gm_link``). The master's queue runs on ``MirrorMasterBQ``, a backing queue
that applies each operation to the real one and then broadcasts it, numbered,
to the group: publish, publish_delivered, fetch, ack, requeue, drop, purge,
delete, with the master's depth after the operation. A mirror (``Mirror``) is
a member of the group; it replays the master's broadcasts on its own ordinary
backing queue, one operation at a time, and tells the master, straight over
the link, the number it reached and whether it holds what the master holds:
that is what *in sync* means. Equal depth alone is not the same messages: a
copy that diverged (a fetch took another message there than on the master) can
hold as many messages as the master and still lack some of them. So every
broadcast also carries the master's content fingerprint (the sum of the digests
of every message it holds, ``Held.fp``), and a mirror is in sync only when its
depth and its own fingerprint both match. A publish returns (so the client's confirm goes
out) only once every mirror the master counts in sync has acknowledged it; every broadcast
carries that count (``insync``: each counted mirror with the spell in sync it was counted
for), which is what a promotion decides from (``ha.in_sync``); a mirror
acknowledges a persistent message after its own store has it on disk. (As in
RabbitMQ, where mirrors confirm to the channel themselves: GM's own
"seen by the whole ring" is not "on disk everywhere".)

GM gives what a plain stream from the master would not: per-sender order on
a ring, and if the master dies mid-broadcast, an operation that reached any
surviving mirror reaches every one of them (the ring member downstream of the
dead master inherits its in-flight messages).

A new mirror is started by a direct message from the master; it joins the
group and starts empty from its join point (GM never replays older traffic).
It becomes in sync when the old head drains, or at once by ``sync``: once the
mirror says it has joined, the master broadcasts every message it holds, in
seq order, in batches of ``SYNC_BATCH`` addressed to that mirror, so the
mirror sees the snapshot and then the stream, in the master's order. "Every
message it holds" includes publishes still waiting for their fsync (``Held``):
a snapshot without them leaves the mirror short of them for good, out of sync
under any steady publish load, and the master then waits for its other
mirrors only.

Promotion: the promoted mirror's GM member stays in the group and becomes the
sender; its first broadcast is ``promoted``, on which every other mirror
requeues its unacked messages (as the new master did), follows the new sender
and compares depths again. Operations of the dead master that a mirror
delivers after that are ignored: none was confirmed (a confirm waits for every
in-sync mirror, the promoted one included). A mirror whose copy differs from
the new master's shows as not in sync and is synced by the policy's sync mode.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker_impl.backing import MemoryBackingQueue, store_queue_key
from broker_impl.backing_queue import BackingQueue, Fetched, StoreError
from broker_impl.cluster.config import ClusterConfig, Spawn
from broker_impl.cluster.gm_link import Endpoint, GmHub, node_of
from broker_impl.cluster.remote import pack_messages
from broker_impl.cluster.transport import Transport
from broker_impl.message import Message
from broker_impl.store.record import pack_batch, unpack_batch

log = logging.getLogger("broker_impl.cluster.mirror")

SYNC_BATCH = 4096


FP_MASK = (1 << 64) - 1


def digest(m: Message) -> str:
    """Which message a fetch took, comparable across nodes: its byte form without the node-local id."""
    return hashlib.blake2b(memoryview(m.to_bytes())[8:], digest_size=8).hexdigest()


def fingerprint_bytes(blob: bytes) -> int:
    """A message's share of a queue's content fingerprint, from its ``to_bytes`` form (order-free: the
    sum of these mod 2**64). The leading node-local id is left out. The master has the blob anyway
    (it is what it broadcasts) and a mirror receives it, so a publish costs one hash, no re-encoding."""
    return int.from_bytes(hashlib.blake2b(memoryview(blob)[8:], digest_size=8).digest(), "big")


def fingerprint(m: Message) -> int:
    return fingerprint_bytes(m.to_bytes())


class Held(dict[int, Message]):
    """What a backing queue holds, in its order, as its wrapper can tell: seq -> message, and waiting publishes.

    The backing queue returns a publish's seq only once the message is as safe
    as the policy promises (after its fsync), but it holds the message, counted
    in its depth, from the moment the publish starts. Those publishes wait here
    under a ticket. Tickets are taken in the order publishes start, which is the
    order in which the backing queue hands out seqs, so the queue's order is
    ticket order (what was there before the first ticket comes first, by seq). A
    waiting publish is ready: a fetch is what makes it unacked, and a fetch
    tells its seq (``fetched``).
    """

    def __init__(self, known: dict[int, Message] | None = None) -> None:
        super().__init__(known or {})
        self._ticket_of: dict[int, int] = {}
        self._waiting: dict[int, Message] = {}  # ticket -> message, in ticket order
        self._tickets = 0
        # the content fingerprint: sum of every held message's ``fingerprint``, kept per entry to subtract it
        self._fp_of: dict[int, int] = {s: fingerprint(m) for s, m in self.items()}
        self._fp_waiting: dict[int, int] = {}
        self.fp = sum(self._fp_of.values()) & FP_MASK

    def ticket(self) -> int:
        self._tickets += 1
        return self._tickets

    def wait(self, message: Message, fp: int | None = None) -> int:
        """A publish is starting (call before the backing queue's publish); its ticket."""
        t = self.ticket()
        self._waiting[t] = message
        f = self._fp_waiting[t] = fingerprint(message) if fp is None else fp
        self.fp = (self.fp + f) & FP_MASK
        return t

    def waiting(self) -> int:
        return len(self._waiting)

    def placed(self, ticket: int, seq: int) -> None:
        """A waiting publish returned its seq (a no-op if a fetch told it already, or a purge took it)."""
        message = self._waiting.pop(ticket, None)
        if message is not None:
            self._place(ticket, seq, message, self._fp_waiting.pop(ticket))

    def add(self, ticket: int, seq: int, message: Message, fp: int | None = None) -> None:
        f = fingerprint(message) if fp is None else fp
        self.fp = (self.fp + f) & FP_MASK
        self._place(ticket, seq, message, f)

    def _place(self, ticket: int, seq: int, message: Message, fp: int) -> None:
        self[seq] = message
        self._ticket_of[seq] = ticket
        self._fp_of[seq] = fp

    def fetched(self, seq: int, message: Message) -> None:
        """The backing queue handed ``seq`` out: if it was a waiting publish, its seq is known from now on.

        It is the oldest waiting publish, since the backing queue hands out
        ready messages by seq; one that does not match was skipped by the
        backing queue as unreadable and is gone from it.
        """
        if seq in self or not self._waiting:
            return
        match = next((t for t, w in self._waiting.items() if w is message), None)
        if match is None:  # read back from disk: the same message, another object
            d = digest(message)
            match = next((t for t, w in self._waiting.items() if digest(w) == d), None)
        if match is None:
            return
        for t in [t for t in self._waiting if t < match]:
            del self._waiting[t]
            self.fp = (self.fp - self._fp_waiting.pop(t)) & FP_MASK
        self._place(match, seq, self._waiting.pop(match), self._fp_waiting.pop(match))

    def clear(self) -> None:
        super().clear()
        self._ticket_of.clear()
        self._waiting.clear()
        self._fp_of.clear()
        self._fp_waiting.clear()
        self.fp = 0

    def forget(self, seqs: list[int]) -> None:
        for s in seqs:
            self.pop(s, None)
            self._ticket_of.pop(s, None)
            f = self._fp_of.pop(s, None)
            if f is not None:
                self.fp = (self.fp - f) & FP_MASK

    def purge(self, unacked: set[int]) -> None:
        """Every ready message is gone, the waiting publishes with them."""
        self._waiting.clear()
        self.fp = (self.fp - sum(self._fp_waiting.values())) & FP_MASK
        self._fp_waiting.clear()
        for s in [s for s in self if s not in unacked]:
            self.forget([s])

    def snapshot(self) -> list[tuple[int, Message]]:
        """Everything held, in the queue's order; a waiting publish's seq shows as -1 (it is not unacked)."""
        items = [(self._ticket_of.get(s, 0), s, m) for s, m in self.items()]
        items += [(t, -1, m) for t, m in self._waiting.items()]
        items.sort(key=lambda i: (i[0], i[1]))
        return [(s, m) for _t, s, m in items]


class _Link:
    __slots__ = ("acked", "synced", "epoch", "joined", "deadline", "in_ring", "missing_since")

    def __init__(self, joined: int, deadline: float | None = None, in_ring: bool = False) -> None:
        self.acked = -1
        self.synced = False
        self.epoch = -1  # which of the mirror's spells in sync ``synced`` counts (``Mirror.epoch``)
        self.joined = joined
        self.deadline = deadline  # a kept mirror must answer the promotion by then
        self.in_ring = in_ring  # its member joined the group (from then on it must stay in the ring)
        self.missing_since: float | None = None


@dataclass(frozen=True, slots=True)
class Site:
    """What a queue's master and its copies use of the node they run on (``ClusterNode`` makes one)."""

    cfg: ClusterConfig
    transport: Transport
    gm: GmHub
    spawn: Spawn
    #: The copies held here, by (vhost, queue); a copy unlists itself when it ends.
    mirrors: dict[tuple[str, str], Mirror]
    #: A master's mirror set may have changed (one left the group): start or stop mirrors now.
    reconcile_mirrors: Callable[[], None]
    #: The queue's record changed (it lists the in-sync mirrors, as the operator's view shows them).
    local_changed: Callable[[], None]
    #: A backing queue of this node's store for a store queue key, durable or not.
    backing: Callable[[str, bool], MemoryBackingQueue]

    @property
    def me(self) -> str:
        return self.cfg.node


class MirrorMasterBQ(BackingQueue):
    """The master's backing queue: the real one plus the broadcast of every operation to the group."""

    def __init__(
        self,
        inner: BackingQueue,
        site: Site,
        vhost: str,
        queue: str,
        live: dict[int, Message] | None = None,
        gm: Endpoint | None = None,
        mirrors: list[str] | None = None,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.durable = inner.durable
        self.site = site
        self.vhost = vhost
        self.queue = queue
        # a promoted mirror's own: publishes it was still writing become known to the master as they finish
        self.held = live if isinstance(live, Held) else Held(live)
        self.mirrors: dict[str, _Link] = {}  # join order
        self._sync_on_join: set[str] = set()
        self._ring_nodes: set[str] | None = None  # nodes of the ring's last view (``_view_changed``)
        self._n = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        if gm is None:
            self._new_group()
        else:
            # a promoted mirror: its member goes on in the same group, now as the sender
            self.gm = gm
            self.group = gm.group
            gm.on_deliver, gm.on_joined, gm.on_stopped = self._delivered, None, self._stopped
            gm.on_view = self._view_changed
            cfg = site.cfg
            deadline = time.monotonic() + 2 * cfg.tick * cfg.down_after
            for peer in mirrors or []:
                self.mirrors[peer] = _Link(0, deadline, in_ring=True)
            self._bcast({"op": "promoted"})

    def _new_group(self) -> None:
        self.group = f"{self.vhost}/{self.queue}/{secrets.token_hex(4)}"
        self.gm = self.site.gm.endpoint(self.group, on_deliver=self._delivered, on_stopped=self._stopped)
        self.gm.on_view = self._view_changed
        self.gm.join()

    def _view_changed(self, version: int, alive: tuple[Any, ...]) -> None:
        """The ring changed while a mirror was being synchronised (a mirror other than the one
        whose joining made the change): a state worth reaching, since the sync's broadcasts
        must reach that mirror across the change. Logged for coverage."""
        nodes = {node_of(m) for m in alive}
        before, self._ring_nodes = self._ring_nodes, nodes
        if before is None:
            return
        joined, left = nodes - before, before - nodes
        syncing = sorted(p for p, link in self.mirrors.items() if not link.synced and p not in joined)
        if syncing:
            log.info(
                "queue %r: GM view v%d (joined %s, left %s) while mirror(s) %s not in sync",
                self.queue,
                version,
                sorted(joined),
                sorted(left),
                syncing,
            )

    def _delivered(self, sender: str, payload: Any) -> None:
        pass  # the master's own broadcasts, and strays of a master it replaced

    def _stopped(self, reason: str) -> None:
        """Our member was recorded dead (e.g. by the other side of a partition): start a new group."""
        log.warning(
            "queue %r: the master's GM member left the group (%s); restarting the mirrors in a new group",
            self.queue,
            reason,
        )
        for peer in list(self.mirrors):
            self.remove_mirror(peer)
        self._new_group()
        self.site.reconcile_mirrors()

    # -- the stream ---------------------------------------------------------------------
    def _bcast(self, op: dict[str, Any], blob: bytes = b"") -> int:
        self._n += 1
        if self.mirrors:  # a mirror joins from now on, never earlier: nothing to send while there is none
            self.gm.broadcast(
                (
                    {
                        "vh": self.vhost,
                        "q": self.queue,
                        "n": self._n,
                        "depth": self.inner.depth(),
                        "fp": self.held.fp,
                        "insync": self.counted(),
                        **op,
                    },
                    blob,
                )
            )
        return self._n

    def _control(self, peer: str, op: str) -> None:
        self.site.transport.send(
            peer,
            {
                "t": "mq",
                "vh": self.vhost,
                "q": self.queue,
                "op": op,
                "group": self.group,
                "mm": self.gm.id,
                "durable": self.durable,
            },
        )

    async def _confirmed(self, n: int) -> None:
        if not self._needed(n):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        await fut

    def _needed(self, n: int) -> list[str]:
        return [
            p
            for p, link in self.mirrors.items()
            if link.synced and link.acked < n and self.site.transport.is_up(p)
        ]

    def _release(self) -> None:
        while self._waiters and not self._needed(self._waiters[0][0]):
            _n, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    def counted(self) -> dict[str, int]:
        """The mirrors whose acks a confirm waits for (in sync on the master's count), with the spell in sync
        of each that the count rests on: every broadcast carries it, and promotion decides from it."""
        return {p: link.epoch for p, link in self.mirrors.items() if link.synced}

    def mirror_acked(self, peer: str, n: int, synced: bool, epoch: int = 0) -> None:
        link = self.mirrors.get(peer)
        if link is None or n < link.joined:
            return
        link.acked = max(link.acked, n)
        changed = synced != link.synced or (synced and epoch != link.epoch)
        if synced and not link.synced:
            log.info("queue %r: mirror on %s is in sync", self.queue, peer)
        link.synced = synced
        link.epoch = epoch if synced else -1
        if changed:
            # Told in the stream, before a confirm that counts on it (or no longer waits for it) goes out:
            # GM hands every surviving mirror the same broadcasts, so all of them decide a promotion alike.
            self._bcast({"op": "depth"})
        self._release()
        if changed:
            self.site.local_changed()  # the record lists the in-sync mirrors too (the operator's view)

    def silent_mirrors(self) -> list[str]:
        """Mirrors to restart: kept at a promotion they never answered, or joined and since gone from the ring."""
        now = time.monotonic()
        ring = {node_of(m) for m in self.gm.ring}
        grace = 2 * self.site.cfg.tick
        out = []
        for p, link in self.mirrors.items():
            if link.in_ring and p not in ring:
                link.missing_since = link.missing_since or now
            else:
                link.missing_since = None
            if (link.deadline is not None and link.acked < 1 and now > link.deadline) or (
                link.missing_since is not None and now - link.missing_since > grace
            ):
                out.append(p)
        return out

    def mirror_joined(self, peer: str) -> None:
        """The mirror on ``peer`` is in the group: it sees everything broadcast from now on."""
        if peer in self.mirrors:
            self.mirrors[peer].in_ring = True
        if peer in self._sync_on_join and peer in self.mirrors:
            self._sync_on_join.discard(peer)
            self.sync(peer)
        elif peer in self.mirrors:
            self._bcast({"op": "depth"})  # a mirror of an empty queue is in sync at once, as in RabbitMQ

    def add_mirror(self, peer: str, sync: bool) -> None:
        self._n += 1
        self.mirrors[peer] = _Link(self._n)
        if sync:
            self._sync_on_join.add(peer)
        self._control(peer, "start")

    def remove_mirror(self, peer: str, stop: bool = True) -> None:
        self._sync_on_join.discard(peer)
        link = self.mirrors.pop(peer, None)
        if link is not None and stop:
            self._control(peer, "stop")
        if link is not None and link.synced and not self.gm.closed:
            self._bcast({"op": "depth"})  # confirms stop waiting for it: the stream says so first
        self._release()

    def sync(self, peer: str | None = None) -> int:
        """Send every held message to one mirror (or all unsynced ones); returns how many."""
        targets = [peer] if peer else [p for p, link in self.mirrors.items() if not link.synced]
        unacked = set(self.inner.unacked())
        items = self.held.snapshot()  # the order the master hands them out
        for p in targets:
            if p not in self.mirrors:
                continue
            if not self.mirrors[p].in_ring:
                self._sync_on_join.add(p)  # a snapshot broadcast before its member joined would pass it by
                continue
            self.mirrors[p].joined = self._n + 1
            for i in range(0, max(len(items), 1), SYNC_BATCH):
                batch = items[i : i + SYNC_BATCH]
                self._bcast(
                    {
                        "op": "sync",
                        "to": p,
                        "first": i == 0,
                        "seqs": [s for s, _ in batch],
                        "unacked": [s for s, _ in batch if s in unacked],
                    },
                    pack_messages([m for _, m in batch]),
                )
            log.info(
                "queue %r: synchronising mirror on %s (%d message(s), %d of them still being written)",
                self.queue,
                p,
                len(items),
                self.held.waiting(),
            )
        return len(items)

    def cluster_fields(self) -> dict[str, Any]:
        return {
            "master": self.site.me,
            "mirrors": list(self.mirrors),
            "synced": [p for p, link in self.mirrors.items() if link.synced],
        }

    # -- BackingQueue ---------------------------------------------------------------------
    async def publish(self, message: Message) -> int:
        # Sent before the inner publish, in the same step in which the inner queue gives the
        # message its place: a fetch of it (possible while its fsync is pending) cannot overtake it.
        blob = message.to_bytes()
        fp = fingerprint_bytes(blob)
        n = self._bcast(
            {"op": "pub", "depth": self.inner.depth() + 1, "fp": (self.held.fp + fp) & FP_MASK}, blob
        )
        ticket = self.held.wait(message, fp)
        seq = await self.inner.publish(message)
        self.held.placed(ticket, seq)
        await self._confirmed(n)
        return seq

    async def publish_batch(self, messages: list[Message], *, hold: bool = True) -> list[int]:
        """A committed transaction's publishes: ONE broadcast, so the mirrors get all of them or none.

        RabbitMQ sends tx.commit-ok once every publish of the transaction is
        confirmed, which on a mirrored queue means by every in-sync mirror; the
        same wait happens here (``_confirmed``). Broadcasting the publishes one by
        one would give the same commit-ok but not the same failover: GM hands a
        surviving mirror everything that reached any mirror, message by message,
        so a master dying mid-commit could leave the promoted mirror with half a
        transaction. One GM message is delivered whole or not at all, and each
        mirror applies it as one unit on its own backing queue (``publish_batch``).
        """
        blobs = [m.to_bytes() for m in messages]
        fps = [fingerprint_bytes(b) for b in blobs]
        n = self._bcast(
            {
                "op": "pubtx",
                "depth": self.inner.depth() + len(messages),
                "fp": (self.held.fp + sum(fps)) & FP_MASK,
            },
            pack_batch(blobs),
        )
        tickets = [self.held.wait(m, f) for m, f in zip(messages, fps, strict=True)]
        seqs = await self.inner.publish_batch(messages, hold=hold)
        for ticket, seq in zip(tickets, seqs, strict=True):
            self.held.placed(ticket, seq)
        await self._confirmed(n)
        return seqs

    async def ack_batch(self, seqs: list[int]) -> None:
        """A committed transaction's acks: tx.commit-ok waits until every in-sync mirror applied them.

        A plain ack is fire-and-forget, as in RabbitMQ; a committed one is a promise
        that a failover must keep, else the promoted mirror would deliver again
        what the commit said was acked.

        Broadcast in the step in which the inner queue takes the messages out of
        its depth, before the ack record's fsync: an operation broadcast during
        that fsync carries the master's depth without them, and a mirror that had
        not seen the acks yet could not match it. It answered "NOT in sync", the
        master stopped waiting for it, and a commit in that window got commit-ok
        with no mirror holding its publishes (every mirror flips together: they
        replay the same stream). ``scenarios/reference-tx.yaml`` showed it as
        hundreds of flips a run.
        """
        unacked = set(self.inner.unacked())
        taken = sum(1 for s in dict.fromkeys(seqs) if s in unacked)
        self.held.forget(seqs)
        n = self._bcast({"op": "ack", "seqs": seqs, "tx": True, "depth": self.inner.depth() - taken})
        await self.inner.ack_batch(seqs)  # takes them in this same step, then waits for the fsync
        await self._confirmed(n)

    async def publish_delivered(self, message: Message) -> int:
        ticket = self.held.ticket()
        seq = await self.inner.publish_delivered(message)
        blob = message.to_bytes()
        self.held.add(ticket, seq, message, fingerprint_bytes(blob))
        await self._confirmed(self._bcast({"op": "pubd", "seq": seq}, blob))
        return seq

    def fetch(self) -> Fetched | None:
        f = self.inner.fetch()
        if f is not None:
            self.held.fetched(f.seq, f.message)
            self._bcast({"op": "fetch", "seq": f.seq, "d": digest(f.message)})
        return f

    async def ack(self, seqs: list[int]) -> None:
        await self.inner.ack(seqs)
        self.held.forget(seqs)
        self._bcast({"op": "ack", "seqs": seqs})

    def requeue(self, seqs: list[int]) -> None:
        self.inner.requeue(seqs)
        self._bcast({"op": "requeue", "seqs": seqs})

    async def drop(self, seqs: list[int]) -> None:
        await self.inner.drop(seqs)
        self.held.forget(seqs)
        self._bcast({"op": "drop", "seqs": seqs})

    async def purge(self) -> int:
        n = await self.inner.purge()
        self.held.purge(set(self.inner.unacked()))
        self._bcast({"op": "purge"})
        return n

    def len(self) -> int:
        return self.inner.len()

    def depth(self) -> int:
        return self.inner.depth()

    def unacked(self) -> list[int]:
        return self.inner.unacked()

    def ram_bytes(self) -> int:
        return self.inner.ram_bytes()

    def recovered_messages(self) -> list[tuple[int, int, Message]]:
        return self.inner.recovered_messages()

    def held_since(self) -> list[tuple[int, int, Message]]:
        return self.inner.held_since()

    async def delete(self) -> None:
        await self.inner.delete()
        self.held.clear()
        self._bcast({"op": "delete"})
        self.gm.tick()  # out before the member leaves
        for peer in list(self.mirrors):
            self._control(peer, "stop")
        self.mirrors.clear()
        self._release()
        self.gm.close()

    async def close(self) -> None:
        await self.inner.close()
        self.gm.close()


class Mirror:
    """A queue's copy on a mirror node: replays the master's stream in order on its own backing queue."""

    def __init__(
        self,
        site: Site,
        vhost: str,
        queue: str,
        master: str,
        durable: bool,
        group: str,
        master_member: str,
        predecessor: Mirror | None = None,
        after: asyncio.Future[Any] | None = None,
    ) -> None:
        self.site = site
        self.vhost = vhost
        self.queue = queue
        self.master = master  # the node acks go to; switches when a ``promoted`` is applied
        self.master_member = master_member  # whose broadcasts are followed; switches when one arrives
        self.durable = durable
        self.bq: MemoryBackingQueue | None = None
        self.seqmap: dict[int, int] = {}  # master seq -> our seq
        self.held = Held()  # what our backing queue holds: the new master's snapshots if we are promoted
        self.synced = False
        self.epoch = 0  # this copy's spells in sync so far: an ack names the one it reports
        # The master's count of its in-sync mirrors (node -> spell), from the newest of its broadcasts
        # delivered here; None before the first.
        self.counted: dict[str, int] | None = None
        self.closed = False
        self._inbox: asyncio.Queue[tuple[dict[str, Any], bytes]] = asyncio.Queue()
        self._acks: deque[tuple[int, asyncio.Future[Any] | None, bool, str, int]] = deque()
        self._ack_soon = False
        # the copy this one replaces: its backing queue must be gone before ours opens the same store queue
        self._mismatches = 0
        self._predecessor = predecessor
        self._after = after  # the deletion of a local queue copy that used the same store queue
        if predecessor is not None:
            predecessor.closed = True
            if predecessor.gm is not None:
                predecessor.gm.close()
                predecessor.gm = None
        self._task = site.spawn(self._run())
        self.group = group
        self.gm: Endpoint | None = site.gm.endpoint(
            group, on_deliver=self._delivered, on_joined=self._joined, on_stopped=self._stopped
        )
        self.gm.join()

    def _delivered(self, sender: str, payload: tuple[dict[str, Any], bytes]) -> None:
        h, blob = payload
        if sender == self.master_member:
            self._count(h)
            self.feed(h, blob)
        elif h.get("op") == "promoted" and not self.closed:
            log.info("mirror of %r: following %s, promoted to master", self.queue, sender)
            self.master_member = sender
            self._count(h)
            self.feed({**h, "mm": sender}, blob)

    def _count(self, h: dict[str, Any]) -> None:
        """Keep the master's count of its in-sync mirrors as delivered (not as replayed): after GM repairs
        the ring every surviving copy has had the same broadcasts delivered, so all hold the same count."""
        counted = h.get("insync")
        if isinstance(counted, dict):
            self.counted = {str(p): int(e) for p, e in counted.items()}

    @property
    def counted_in_sync(self) -> bool:
        """In sync here, and counted so by the master for this very spell: every confirm since waited for us.

        In sync here alone is not enough: until the master counts a mirror in sync
        it confirms without that mirror's ack, and a publish it confirmed so may
        have reached no surviving copy (a mirror that went out of sync and back in,
        with its report on the way, is the same case: hence the spell).
        """
        counted = self.counted or {}
        return self.synced and counted.get(self.site.me) == self.epoch

    def _joined(self) -> None:
        """In the group: start empty, then tell the master (it may sync us now)."""
        self.feed({"op": "start", "n": -1, "depth": -1}, b"")
        self.site.transport.send(self.master, {"t": "mq_joined", "vh": self.vhost, "q": self.queue})

    def _stopped(self, reason: str) -> None:
        """Our member was recorded dead: this copy cannot follow the stream any more; the master restarts it."""
        self.gm = None
        if not self.closed:
            log.warning(
                "mirror of %r: left the group (%s); asking %s for a new mirror",
                self.queue,
                reason,
                self.master,
            )
            self.synced = False
            self.site.transport.send(self.master, {"t": "mq_gone", "vh": self.vhost, "q": self.queue})

    def will_follow(self, master: str) -> bool:
        """Whether a promoted master on ``master`` is (or is about to be) followed: its member is in our ring."""
        if node_of(self.master_member) == master:
            return True
        return self.gm is not None and any(node_of(m) == master for m in self.gm.ring)

    def feed(self, h: dict[str, Any], blob: bytes) -> None:
        self._inbox.put_nowait((h, blob))

    async def _fresh(self) -> MemoryBackingQueue:
        """A mirror always starts empty: whatever a previous life left in the store is dropped."""
        if self._predecessor is not None:
            await self._predecessor.discard()
            self._predecessor = None
        if self._after is not None:
            await asyncio.gather(self._after, return_exceptions=True)  # its failure is logged where it ran
            self._after = None
        if self.bq is not None:
            await self.bq.delete()
        key = store_queue_key(self.vhost, self.queue)
        bq = self.site.backing(key, self.durable)
        if bq.depth():
            await bq.delete()
            bq = self.site.backing(key, self.durable)
        self.seqmap.clear()
        self.held = Held()  # a write of the old copy finishing later must not land in the new one's
        return bq

    async def _run(self) -> None:
        while not self.closed:
            h, blob = await self._inbox.get()
            pending: asyncio.Future[Any] | None = None
            try:
                pending = await self._apply(h, blob)
            except Exception:
                log.exception("mirror of %r: replaying %s failed; restarting empty", self.queue, h.get("op"))
                self.bq = await self._fresh()
                self.synced = False
            if self.closed:
                return
            if self.bq is not None:
                was, self.synced = self.synced, self.in_sync_with(h)
                if self.synced and not was:
                    self.epoch += 1
                if was != self.synced or (h.get("op") == "sync" and h.get("to") == self.site.me):
                    log.info(
                        "mirror of %r (master %s): %s after %s, depth %d here, %s on the master",
                        self.queue,
                        self.master,
                        "in sync" if self.synced else "NOT in sync",
                        h.get("op"),
                        self.bq.depth(),
                        h.get("depth"),
                    )
            self._acks.append((int(h.get("n", 0)), pending, self.synced, self.master, self.epoch))
            if pending is not None:
                pending.add_done_callback(lambda _f: self._ack_later())
            self._ack_later()

    def _ack_later(self) -> None:
        """Acknowledge at the end of this turn of the event loop: one ack for everything that got safe in it."""
        if not self._ack_soon:
            self._ack_soon = True
            asyncio.get_running_loop().call_soon(self._flush_acks)

    def in_sync_with(self, h: dict[str, Any]) -> bool:
        """The same number of messages as the master after operation ``h``, and the same messages."""
        assert self.bq is not None
        return self.bq.depth() == int(h.get("depth", -1)) and int(h.get("fp", -1)) == self.held.fp

    def _flush_acks(self) -> None:
        """Acknowledge up to the newest operation whose publishes (and all before) are safe here.

        Publishes are started in order and left to finish concurrently, so one
        store flush covers many of them (group commit) as on the master.
        """
        self._ack_soon = False
        last: tuple[int, bool, str, int] | None = None
        while self._acks and (self._acks[0][1] is None or self._acks[0][1].done()):
            n, fut, synced, master, epoch = self._acks.popleft()
            if fut is not None and (fut.cancelled() or fut.exception() is not None):
                log.error("mirror of %r: a replayed publish failed; out of sync", self.queue)
                self.synced = synced = False
            if last is not None and last[2] != master:
                self._send_ack(*last)  # numbered by the master before a promotion: that one's only
            last = (n, synced, master, epoch)
        if last is not None:
            self._send_ack(*last)

    def _send_ack(self, n: int, synced: bool, master: str, epoch: int) -> None:
        if not self.closed and n >= 0:
            self.site.transport.send(
                master,
                {"t": "mq_ack", "vh": self.vhost, "q": self.queue, "n": n, "synced": synced, "epoch": epoch},
            )

    def _publish_started(
        self, bq: MemoryBackingQueue, m: Message, fp: int | None = None
    ) -> asyncio.Future[Any]:
        """Start a publish: it holds its place in the queue on return; the future settles once it is safe."""
        held, ticket = self.held, self.held.wait(m, fp)
        try:
            fut: asyncio.Future[Any] = asyncio.ensure_future(bq.start_publish(m))
        except StoreError as e:  # refused at once: out of sync, as a publish that fails later is
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(e)

        def placed(f: asyncio.Future[Any]) -> None:
            if not f.cancelled() and f.exception() is None:
                held.placed(ticket, f.result())

        fut.add_done_callback(placed)
        return fut

    async def _batch_started(self, bq: BackingQueue, blob: bytes) -> asyncio.Future[Any]:
        """Start a transaction's publishes as one unit; return once they hold their places."""
        blobs = unpack_batch(blob)
        messages = [Message.from_bytes(b) for b in blobs]
        held = self.held
        tickets = [held.wait(m, fingerprint_bytes(b)) for m, b in zip(messages, blobs, strict=True)]
        fut = asyncio.ensure_future(bq.publish_batch(messages, hold=False))  # the master held them already

        def placed(f: asyncio.Future[Any]) -> None:
            if not f.cancelled() and f.exception() is None:
                for ticket, seq in zip(tickets, f.result(), strict=True):
                    held.placed(ticket, seq)

        fut.add_done_callback(placed)
        await asyncio.sleep(0)  # the task's first step (where the entries are added) runs before we resume
        return fut

    async def _apply(self, h: dict[str, Any], blob: bytes) -> asyncio.Future[Any] | None:
        op = h["op"]
        if op == "start":
            self.bq = await self._fresh()
            return None
        if op == "promoted":
            self.master = node_of(str(h["mm"]))
            if self.bq is not None:
                unacked = self.bq.unacked()
                if unacked:
                    self.bq.requeue(unacked)
            self.seqmap.clear()  # the new master's seqs are its own; its head matches ours by digest
            return None
        bq = self.bq
        if bq is None:
            return None
        if op == "pub":
            return self._publish_started(bq, Message.from_bytes(blob), fingerprint_bytes(blob))
        if op == "pubtx":
            return await self._batch_started(bq, blob)
        elif op == "pubd":
            m = Message.from_bytes(blob)
            ticket = self.held.ticket()
            s = await bq.publish_delivered(m)
            self.seqmap[int(h["seq"])] = s
            self.held.add(ticket, s, m, fingerprint_bytes(blob))
        elif op == "fetch":
            # the master's head is ours too unless it was published before we joined
            f = bq.fetch()
            if f is None:
                return None
            self.held.fetched(f.seq, f.message)
            if digest(f.message) != h.get("d"):
                bq.requeue([f.seq])
                self._mismatches += 1
                if self._mismatches <= 3:
                    log.info(
                        "mirror of %r: the master's head %s is not ours (%d of %d here)",
                        self.queue,
                        h.get("seq"),
                        bq.len(),
                        bq.depth(),
                    )
                return None
            self.seqmap[int(h["seq"])] = f.seq
        elif op in ("ack", "drop"):
            mine = [self.seqmap.pop(int(s)) for s in h["seqs"] if int(s) in self.seqmap]
            self.held.forget(mine)
            if mine:
                await (bq.drop(mine) if op == "drop" else bq.ack_batch(mine) if h.get("tx") else bq.ack(mine))
        elif op == "requeue":
            mine = [self.seqmap[int(s)] for s in h["seqs"] if int(s) in self.seqmap]
            if mine:
                bq.requeue(mine)
        elif op == "purge":
            await bq.purge()
            keep = set(bq.unacked())
            self.seqmap = {k: v for k, v in self.seqmap.items() if v in keep}
            self.held.purge(keep)
        elif op == "sync":
            from broker_impl.cluster.remote import unpack_messages

            if h.get("to") != self.site.me:
                return None  # a snapshot for another mirror
            if h.get("first"):
                self.bq = bq = await self._fresh()
            taken = set(h.get("unacked", []))
            started: list[asyncio.Future[Any]] = []
            for mseq, m in zip(h["seqs"], unpack_messages(blob), strict=True):
                if mseq in taken:  # awaited: a following ack needs its seq
                    ticket = self.held.ticket()
                    s = await bq.publish_delivered(m)
                    self.seqmap[int(mseq)] = s
                    self.held.add(ticket, s, m)
                else:
                    started.append(self._publish_started(bq, m))
            return asyncio.gather(*started) if started else None
        elif op in ("delete", "stop"):
            await self.discard()
        return None

    async def discard(self) -> None:
        """Drop this copy (its store queue too); a successor may already be registered under the same key."""
        self.closed = True
        if self.gm is not None:
            self.gm.close()
            self.gm = None
        if asyncio.current_task() is not self._task:
            self._task.cancel()
        if self._predecessor is not None:
            await self._predecessor.discard()
            self._predecessor = None
        if self.bq is not None:
            bq, self.bq = self.bq, None
            await bq.delete()
        if self.site.mirrors.get((self.vhost, self.queue)) is self:
            del self.site.mirrors[(self.vhost, self.queue)]

    def take_over(self) -> tuple[BackingQueue, Held, Endpoint | None]:
        """Promotion: hand the backing queue and the GM member over, unacked messages back to ready."""
        assert self.bq is not None
        self.closed = True
        gm, self.gm = self.gm, None
        self._task.cancel()
        bq, self.bq = self.bq, None
        unacked = bq.unacked()
        if unacked:
            bq.requeue(unacked)
        if self.site.mirrors.get((self.vhost, self.queue)) is self:
            del self.site.mirrors[(self.vhost, self.queue)]
        return bq, self.held, gm  # the same Held: replayed publishes still writing finish into it
