"""Queues whose master runs on another node, and the master's side of serving them.

A client may talk to any node. On a node that is not the queue's master the
vhost holds a ``RemoteQueue``: it looks like a queue to channels and exchanges,
but every operation is forwarded to the master over the cluster link, as a
RabbitMQ channel talks to a queue process on another node. Publishes carry an
id and the client's confirm waits for the master's ``pub_ok``; deliveries come
back tagged with the master's seq and the consumer they are for, and acks,
requeues and rejects go back with those seqs and that consumer.

Who holds what is kept on both sides, so that every delivery is settled exactly
once, by the one who holds it:

* The proxy hands its channels delivery ids of its own, never reused, each
  standing for (master seq, consumer) of the master it came from. A master's
  seqs mean nothing to the next master (a promoted mirror numbers its copy
  itself), so when the master goes or changes the proxy forgets them all: a
  late ack for a dead master's delivery settles nothing (the new master has
  requeued it), rather than whatever the new master gave the same seq.
* The master keeps, per peer and queue, every seq it handed over and to which
  consumer (``MasterSide.held``), and settles only what a peer holds. When a
  remote consumer is cancelled it requeues what that consumer still held,
  including deliveries still on their way (the proxy, finding no consumer for
  them, sends them back: they are no longer held, so nothing is settled twice).
  When the peer's node goes down it requeues everything the peer held.

What a link failure means: when the master's node goes down (or the link
breaks, which counts the same), the proxy nacks publishes still waiting for a
confirm (they may or may not have been stored: "recovered" if they show up)
and forgets its deliveries. Consumers that asked for ``x-cancel-on-ha-failover``
get ``basic.cancel``; the others wait and follow the queue to a promoted
mirror (or to the master when it returns), as RabbitMQ moves them. The
master, seeing the proxy's node down, removes that node's consumers and
requeues everything it delivered to them, marked redelivered. While the
master cannot be reached, operations that need its answer (declare, get,
purge, delete) fail with RabbitMQ's 404 "home node ... is down or
inaccessible" rather than answering for it (a drain told "0 messages" by a
node that could not ask would stop early).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import struct
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from broker_impl.backing_queue import Fetched
from broker_impl.cluster.config import Spawn
from broker_impl.cluster.forwarding import Forwarder
from broker_impl.cluster.transport import Transport
from broker_impl.codec import NOT_FOUND, PRECONDITION_FAILED, ChannelError
from broker_impl.message import Message
from broker_impl.queue import CONFIRM_RECHECK_S, ConfirmCallback, Consumer, Queue

if TYPE_CHECKING:
    from broker_impl.vhost import VHost

log = logging.getLogger("broker_impl.cluster.remote")


class RemoteQueue:
    """A queue mastered elsewhere, with the surface ``Channel``, ``VHost`` and ``Broker`` use."""

    bq = None  # no local storage: memory accounting skips it

    def __init__(
        self,
        forwarder: Forwarder,
        transport: Transport,
        vhost: VHost,
        name: str,
        master: str,
        *,
        durable: bool,
        auto_delete: bool,
        arguments: dict[str, Any],
    ) -> None:
        self.forwarder = forwarder
        self.transport = transport
        self.vhost = vhost
        self.name = name
        self.master = master
        self.durable = durable
        self.auto_delete = auto_delete
        self.arguments = dict(arguments)
        self.exclusive_owner: object | None = None
        self.consumers: deque[Consumer] = deque()
        self.had_consumer = False
        self.deleted = False
        self.policy: dict[str, Any] | None = None
        self.policy_name: str | None = None
        self._count = 0
        self._unacked = 0
        self._consumers_seen = 0
        self._ids = itertools.count(1)
        # delivery id handed to a channel here -> (the current master's seq, the consumer's id there)
        self._live: dict[int, tuple[int, str]] = {}

    @property
    def cluster_fields(self) -> dict[str, Any]:
        return {"master": self.master}

    def _hdr(self, t: str, **kw: Any) -> dict[str, Any]:
        return {"t": t, "vh": self.vhost.name, "q": self.name, **kw}

    # -- publishing --------------------------------------------------------------------
    def enqueue(self, message: Message, sender: object | None, on_done: ConfirmCallback | None) -> None:
        if self.deleted:
            if on_done:
                on_done(True)
            return
        self.forwarder.publish(self.master, self._hdr("pub"), message, on_done)

    def enqueue_batch(
        self, messages: list[Message], sender: object | None, on_done: ConfirmCallback | None
    ) -> None:
        """A committed transaction's publishes: one request, applied by the master as one unit."""
        if self.deleted:
            if on_done:
                on_done(True)
            return
        self.forwarder.publish_blob(self.master, self._hdr("pubtx"), pack_messages(messages), on_done)

    async def ack_batch(self, seqs: list[int], consumer: Consumer | None) -> None:
        """A committed transaction's acks: a request the master answers once it applied them as one unit.

        A plain ack is a one-way message; commit-ok is a promise, so it waits for the answer.
        Deliveries from a master that has died since are void (its successor delivers them
        again); acking them cannot be honoured, so the commit fails and none of the
        transaction's acks on this queue is applied (the live ones go back, redelivered).
        """
        void = [s for s in seqs if s not in self._live]
        if void:
            self.requeue([s for s in seqs if s in self._live], consumer)
            raise ChannelError(
                PRECONDITION_FAILED,
                f"partial tx completion: {len(void)} acked deliveries of queue "
                f"'{self.name}' came from a master that failed over; they will be delivered again",
            )
        for cid, pairs in self._take(seqs).items():
            r, _ = await self._ask("acktx", seqs=[s for _, s in pairs], cid=cid)
            if r.get("error"):
                raise ChannelError(PRECONDITION_FAILED, str(r["error"]))

    async def _ask(self, t: str, **kw: Any) -> tuple[dict[str, Any], bytes]:
        """One request to the master; unreachable, it is RabbitMQ's 404 for a queue whose home node is down."""
        try:
            return await self.forwarder.request(self.master, self._hdr(t, **kw))
        except ConnectionError:
            raise ChannelError(
                NOT_FOUND,
                f"home node '{self.master}' of durable queue '{self.name}' in vhost "
                f"'{self.vhost.name}' is down or inaccessible",
            ) from None

    async def settled(self) -> None:
        """A round trip behind our earlier publishes (links are FIFO) refreshes the counts."""
        r, _ = await self._ask("stat")
        self._count = int(r.get("messages", 0))
        self._unacked = int(r.get("unacked", 0))
        self._consumers_seen = int(r.get("consumers", 0))

    async def master_counts(self) -> tuple[int, int] | None:
        """The master's ready and unacked counts now; None while it cannot be asked."""
        try:
            await self.settled()
        except ChannelError:
            return None
        return self._count, self._unacked

    def message_count(self) -> int:
        return self._count

    def consumer_count(self) -> int:
        return max(self._consumers_seen, len(self.consumers))

    # -- consuming -----------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.had_consumer = True
        self._subscribe(consumer)

    def _subscribe(self, consumer: Consumer) -> None:
        """Register with the master; while it is unreachable the consumer waits (the queue is unavailable)."""
        cid = self.forwarder.register_consumer(consumer)
        self.transport.send(
            self.master,
            self._hdr(
                "consume",
                cid=cid,
                no_ack=consumer.no_ack,
                prefetch=consumer.prefetch,
                exclusive=consumer.exclusive,
                args=_plain(consumer.arguments),
            ),
        )

    def resubscribe(self, previous: str | None = None) -> None:
        """Register every consumer again; the old registrations are cancelled where they were (if still there)."""
        for c in list(self.consumers):
            old = self.forwarder.unregister_consumer(c)
            if old is not None:
                self.transport.send(previous or self.master, self._hdr("cancel", cid=old))
            self._subscribe(c)

    def master_changed(self, master: str) -> None:
        """A mirror was promoted: consumers follow the queue to its new master."""
        previous, self.master = self.master, master
        self._live.clear()
        self.resubscribe(previous)

    def release_consumers(self) -> list[Consumer]:
        """Consumers that move on to a queue object that replaces this proxy (promotion here)."""
        out = list(self.consumers)
        self.consumers.clear()
        for c in out:
            self.forwarder.unregister_consumer(c)
        return out

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        cid = self.forwarder.unregister_consumer(consumer)
        if cid is not None:
            self.transport.send(self.master, self._hdr("cancel", cid=cid))

    def cancel_consumer(self, consumer: Consumer) -> None:
        """The master cancelled it (queue deleted, master gone): tell the channel."""
        try:
            self.consumers.remove(consumer)
        except ValueError:
            pass
        self.forwarder.unregister_consumer(consumer)
        consumer.channel.consumer_cancelled(consumer)

    def delivered(
        self, consumer: Consumer, peer: str, cid: str, seq: int, redelivered: bool, message: Message
    ) -> None:
        if peer != self.master or consumer.channel.state != "open" or consumer not in self.consumers:
            self.transport.send(peer, self._hdr("requeue", seqs=[seq], cid=cid))
            return
        consumer.channel.deliver(
            consumer, self, Fetched(self._track(seq, cid, consumer.no_ack), message, redelivered)
        )

    def _track(self, seq: int, cid: str, no_ack: bool) -> int:
        did = next(self._ids)
        if not no_ack:
            self._live[did] = (seq, cid)
        return did

    def kick(self) -> None:
        """Deliveries are paced by the master's prefetch accounting."""

    async def get(self, no_ack: bool) -> Fetched | None:
        r, blob = await self._ask("get", no_ack=no_ack)
        self._count = int(r.get("count", 0))
        if not r.get("found"):
            return None
        return Fetched(self._track(int(r["seq"]), "", no_ack), Message.from_bytes(blob), bool(r.get("red")))

    def _take(self, dids: list[int]) -> dict[str, list[tuple[int, int]]]:
        """The current master's (delivery id, seq) pairs behind ``dids`` by consumer; forgotten here from now on."""
        out: dict[str, list[tuple[int, int]]] = {}
        for did in dids:
            held = self._live.pop(did, None)
            if held is not None:
                out.setdefault(held[1], []).append((did, held[0]))
        return out

    async def ack(self, seqs: list[int], consumer: Consumer | None) -> None:
        for cid, pairs in self._take(seqs).items():
            self.transport.send(self.master, self._hdr("ack", seqs=[s for _, s in pairs], cid=cid))

    def requeue(self, seqs: list[int], consumer: Consumer | None) -> None:
        for cid, pairs in self._take(seqs).items():
            self.transport.send(self.master, self._hdr("requeue", seqs=[s for _, s in pairs], cid=cid))

    async def reject_messages(self, items: list[tuple[int, Message]], consumer: Consumer | None) -> None:
        bodies = dict(items)
        for cid, pairs in self._take([did for did, _ in items]).items():
            # the bodies travel back so the master can dead-letter them
            self.transport.send(
                self.master,
                self._hdr("reject", seqs=[s for _, s in pairs], cid=cid),
                pack_messages([bodies[did] for did, _ in pairs]),
            )

    async def purge(self) -> int:
        r, _ = await self._ask("purge")
        return int(r.get("n", 0))

    # -- lifecycle -------------------------------------------------------------------------
    def master_down(self) -> None:
        """Deliveries from the dead master are void; consumers that asked for it are cancelled, others wait
        for a promoted mirror or the master's return (``x-cancel-on-ha-failover``, as RabbitMQ)."""
        self._live.clear()
        for c in list(self.consumers):
            if c.arguments.get("x-cancel-on-ha-failover"):
                self.cancel_consumer(c)
            else:
                self.forwarder.unregister_consumer(c)

    async def delete(self) -> int:
        """Only the local proxy goes; the metadata delete tells the master to drop the queue."""
        if self.deleted:
            return 0
        self.deleted = True
        for c in list(self.consumers):
            self.cancel_consumer(c)
        return self._count

    async def close(self) -> None:
        self.deleted = True

    def info(self) -> dict[str, Any]:
        """As of the last answer from the master (``ha.Mirroring.queue_counts`` asks it afresh)."""
        return {
            "name": self.name,
            "vhost": self.vhost.name,
            "durable": self.durable,
            "exclusive": False,
            "auto_delete": self.auto_delete,
            "arguments": self.arguments,
            "messages_ready": self._count,
            "messages_unacknowledged": self._unacked,
            "consumers": len(self.consumers),
            "policy": self.policy_name,
            "effective_policy_definition": self.policy or {},
            "state": "remote",
            "node": self.master,
        }


def proxies_of(vhosts: dict[str, VHost], master: str) -> list[RemoteQueue]:
    """The proxies here of the queues mastered on ``master``."""
    out: list[RemoteQueue] = []
    for vh in vhosts.values():
        for q in list(vh.queues.values()):
            if isinstance(q, RemoteQueue) and q.master == master:
                out.append(q)
    return out


class RemoteConsumerChannel:
    """The master's stand-in for a channel on another node: deliveries go out on the link."""

    def __init__(self, transport: Transport, master_side: MasterSide, peer: str, cid: str) -> None:
        self.transport = transport
        self.master_side = master_side
        self.peer = peer
        self.cid = cid
        self.state = "open"

    def can_deliver(self, consumer: Consumer) -> bool:
        return self.state == "open" and self.transport.is_up(self.peer)

    def deliver(self, consumer: Consumer, queue: Queue, fetched: Fetched) -> None:
        if not consumer.no_ack:
            self.master_side.hold(self.peer, queue, fetched.seq, self.cid)
        self.transport.send(
            self.peer,
            {
                "t": "deliver",
                "vh": queue.vhost.name,
                "q": queue.name,
                "cid": self.cid,
                "seq": fetched.seq,
                "red": fetched.redelivered,
            },
            fetched.message.to_bytes(),
        )

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The queue went away (deleted, or its copy here dropped): what the consumer held goes with it."""
        self.state = "closed"
        self.master_side.forget(self.peer, self.cid, consumer.queue)
        self.transport.send(self.peer, {"t": "cancelled", "cid": self.cid})


class ConfirmGate(Protocol):
    """What the master side asks before it confirms a forwarded publish (``partitions.Partitions``)."""

    paused: bool
    pauses: int  # how many times this node has paused

    def confirms_held(self) -> bool: ...


class MasterSide:
    """Serves operations forwarded by other nodes to queues mastered here.

    A forwarded publish is confirmed under the same rule as a local channel's (``ConfirmGate``): a paused
    node refuses it (``pub_ok`` false: the publisher gets a nack), and a confirm taken while confirms are
    held waits, and becomes a refusal if the node paused meanwhile (its copy may be dropped when it
    resumes). Confirming them regardless lost what a peer forwarded to a master paused for a partial
    partition (``scenarios/reference-confirm-alone-before-pause.yaml`` held longer: 89 to 186 lost).
    """

    def __init__(
        self, vhosts: dict[str, VHost], transport: Transport, spawn: Spawn, gate: ConfirmGate
    ) -> None:
        self.vhosts = vhosts  # the broker's
        self.transport = transport
        self.spawn = spawn
        self.gate = gate
        self.consumers: dict[tuple[str, str], tuple[Consumer, RemoteConsumerChannel]] = {}
        # peer -> queue -> seq -> the consumer id it was delivered to ("" for basic.get): what each peer holds
        self.held: dict[str, dict[Queue, dict[int, str]]] = {}

    def _confirm(self, peer: str, pid: int, ok: bool, since: int) -> None:
        """Answer a forwarded publish taken when the node had paused ``since`` times (class doc)."""
        if ok and self.gate.pauses != since:
            ok = False
        elif ok and self.gate.confirms_held():
            asyncio.get_running_loop().call_later(CONFIRM_RECHECK_S, self._confirm, peer, pid, ok, since)
            return
        self.transport.send(peer, {"t": "pub_ok", "id": pid, "ok": ok})

    def _queue(self, h: dict[str, Any]) -> Queue | None:
        vh = self.vhosts.get(h.get("vh", ""))
        q = vh.queues.get(h.get("q", "")) if vh is not None else None
        return q if isinstance(q, Queue) and not q.deleted else None

    def hold(self, peer: str, q: Queue, seq: int, cid: str) -> None:
        self.held.setdefault(peer, {}).setdefault(q, {})[seq] = cid

    def _release(self, peer: str, q: Queue, seqs: list[int], cid: str) -> list[int]:
        """The seqs of ``seqs`` that ``peer`` holds for ``cid``; they are no longer held."""
        held = self.held.get(peer, {}).get(q)
        if not held:
            return []
        out = [s for s in seqs if held.get(s) == cid]
        for s in out:
            del held[s]
        return out

    def _held_by(self, peer: str, q: Queue, cid: str) -> list[int]:
        return sorted(s for s, c in self.held.get(peer, {}).get(q, {}).items() if c == cid)

    def forget(self, peer: str, cid: str, q: Queue) -> None:
        self.consumers.pop((peer, cid), None)
        self._release(peer, q, self._held_by(peer, q, cid), cid)

    def handle(self, peer: str, h: dict[str, Any], blob: bytes) -> None:
        t = h["t"]
        q = self._queue(h)
        if t in ("pub", "pubtx"):
            vh = self.vhosts.get(h.get("vh", ""))
            exists = vh is not None and h.get("q") in vh.queues
            if q is None or self.gate.paused:
                # gone: acked as RabbitMQ acks an unroutable publish; not master here, or paused: refused
                if "id" in h:
                    ok = q is None and not exists
                    self.transport.send(peer, {"t": "pub_ok", "id": h["id"], "ok": ok})
                return
            cb = None
            if "id" in h:
                pid, since = h["id"], self.gate.pauses

                def cb(ok: bool, pid: int = pid, since: int = since) -> None:
                    self._confirm(peer, pid, ok, since)

            if t == "pubtx":
                q.enqueue_batch(unpack_messages(blob), None, cb)
            else:
                q.enqueue(Message.from_bytes(blob), None, cb)
        elif t == "consume":
            cid = h["cid"]
            rc = RemoteConsumerChannel(self.transport, self, peer, cid)
            if q is None:
                self.transport.send(peer, {"t": "cancelled", "cid": cid})
                return
            c = Consumer(
                cid,
                rc,
                q,
                bool(h.get("no_ack")),
                bool(h.get("exclusive")),
                int(h.get("prefetch", 0)),
                arguments=dict(h.get("args") or {}),
            )
            self.consumers[(peer, cid)] = (c, rc)
            q.add_consumer(c)
        elif t == "cancel":
            entry = self.consumers.pop((peer, h["cid"]), None)
            if entry is not None:
                c, rc = entry
                rc.state = "closed"
                c.queue.remove_consumer(c)
                # what it still holds, deliveries on their way to it included, goes back now
                seqs = self._release(peer, c.queue, self._held_by(peer, c.queue, rc.cid), rc.cid)
                if seqs and not c.queue.deleted:
                    c.queue.requeue(seqs, c)
        elif t in ("ack", "requeue", "reject"):
            self._settle(peer, t, h, q, blob)
        elif t in ("stat", "get", "purge", "acktx"):
            self.spawn(self._answer(peer, t, h, q))

    def _settle(self, peer: str, t: str, h: dict[str, Any], q: Queue | None, blob: bytes) -> None:
        """Apply an ack, requeue or reject to what the peer holds for that consumer; anything else is stale."""
        if q is None:
            return
        given = [int(s) for s in h.get("seqs", [])]
        cid = str(h.get("cid") or "")
        seqs = self._release(peer, q, given, cid)
        if not seqs:
            return
        entry = self.consumers.get((peer, cid)) if cid else None
        consumer = entry[0] if entry is not None and entry[0].queue is q else None
        if t == "ack":
            self.spawn(q.ack(seqs, consumer))
        elif t == "requeue":
            q.requeue(seqs, consumer)
        else:
            bodies = dict(zip(given, unpack_messages(blob), strict=True))
            self.spawn(q.reject_messages([(s, bodies[s]) for s in seqs], consumer))

    async def _answer(self, peer: str, t: str, h: dict[str, Any], q: Queue | None) -> None:
        rid = h.get("id")
        blob = b""
        if q is None:
            reply: dict[str, Any] = {"messages": 0, "consumers": 0, "found": False, "count": 0, "n": 0}
        elif t == "stat":
            await q.settled()
            reply = {
                "messages": q.message_count(),
                "unacked": q.bq.depth() - q.bq.len(),
                "consumers": q.consumer_count(),
            }
        elif t == "purge":
            await q.settled()
            reply = {"n": await q.purge()}
        elif t == "acktx":
            cid = str(h.get("cid") or "")
            seqs = self._release(peer, q, [int(s) for s in h.get("seqs", [])], cid)
            entry = self.consumers.get((peer, cid)) if cid else None
            reply = {"acked": len(seqs)}
            try:
                if seqs:
                    await q.ack_batch(seqs, entry[0] if entry is not None and entry[0].queue is q else None)
            except ChannelError as exc:  # the commit on the peer fails with the same reason
                reply = {"error": exc.text}
        else:
            await q.settled()
            f = q.get(bool(h.get("no_ack")))
            reply = {"found": f is not None, "count": q.message_count()}
            if f is not None:
                reply.update(seq=f.seq, red=f.redelivered)
                blob = f.message.to_bytes()
                if not h.get("no_ack"):
                    self.hold(peer, q, f.seq, "")
        self.transport.send(peer, {"t": "reply", "re": rid, **reply}, blob)

    def peer_down(self, peer: str) -> None:
        """Everything delivered to that node and not acked goes back, redelivered."""
        for p, cid in [k for k in self.consumers if k[0] == peer]:
            c, rc = self.consumers.pop((p, cid))
            rc.state = "closed"
            c.queue.remove_consumer(c)
        for q, held in self.held.pop(peer, {}).items():
            if held and not q.deleted:
                q.requeue(sorted(held), None)


def pack_messages(messages: list[Message]) -> bytes:
    return b"".join(struct.pack(">I", len(b)) + b for b in (m.to_bytes() for m in messages))


def unpack_messages(blob: bytes) -> list[Message]:
    out, off = [], 0
    while off < len(blob):
        (n,) = struct.unpack_from(">I", blob, off)
        out.append(Message.from_bytes(blob[off + 4 : off + 4 + n]))
        off += 4 + n
    return out


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
