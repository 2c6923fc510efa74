"""Queues whose master runs on another node, and the master's side of serving them.

A client may talk to any node. On a node that is not the queue's master the
vhost holds a ``RemoteQueue``: it looks like a queue to channels and exchanges,
but every operation is forwarded to the master over the cluster link, as a
RabbitMQ channel talks to a queue process on another node. Publishes carry an
id and the client's confirm waits for the master's ``pub_ok``; deliveries come
back tagged with the master's seq, and acks, requeues and rejects go back with
those seqs.

What a link failure means: when the master's node goes down (or the link
breaks, which counts the same), the proxy nacks publishes still waiting for a
confirm (they may or may not have been stored: "recovered" if they show up)
and forgets its deliveries, so a late ack cannot hit a seq the master has
requeued and redelivered meanwhile. Consumers that asked for
``x-cancel-on-ha-failover`` get ``basic.cancel``; the others wait and follow
the queue to a promoted mirror (or to the master when it returns), as RabbitMQ
moves them. The master, seeing the proxy's node down, removes that
node's consumers and requeues everything it delivered to them, marked
redelivered.
"""

from __future__ import annotations

import itertools
import json
import logging
import struct
from collections import deque
from typing import TYPE_CHECKING, Any

from broker_impl.backing_queue import Fetched
from broker_impl.message import Message
from broker_impl.queue import ConfirmCallback, Consumer, Queue

if TYPE_CHECKING:
    from broker_impl.cluster.node import ClusterNode
    from broker_impl.vhost import VHost

log = logging.getLogger("broker_impl.cluster.remote")

RPC_TIMEOUT = 10.0


class RemoteQueue:
    """A queue mastered elsewhere, with the surface ``Channel``, ``VHost`` and ``Broker`` use."""

    bq = None  # no local storage: memory accounting skips it

    def __init__(self, node: ClusterNode, vhost: VHost, name: str, master: str, *, durable: bool,
                 auto_delete: bool, arguments: dict[str, Any]) -> None:
        self.node = node
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
        self._consumers_seen = 0
        self._live: set[int] = set()  # seqs delivered here since the link to the master last came up

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
        self.node.forward_publish(self.master, self._hdr("pub"), message, on_done)

    async def settled(self) -> None:
        """A round trip behind our earlier publishes (links are FIFO) refreshes the counts."""
        try:
            r, _ = await self.node.request(self.master, self._hdr("stat"))
        except ConnectionError:
            return
        self._count = int(r.get("messages", 0))
        self._consumers_seen = int(r.get("consumers", 0))

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
        cid = self.node.register_proxy_consumer(consumer)
        self.node.transport.send(self.master, self._hdr(
            "consume", cid=cid, no_ack=consumer.no_ack, prefetch=consumer.prefetch,
            exclusive=consumer.exclusive, args=_plain(consumer.arguments)))

    def resubscribe(self) -> None:
        for c in list(self.consumers):
            self.node.unregister_proxy_consumer(c)
            self._subscribe(c)

    def master_changed(self, master: str) -> None:
        """A mirror was promoted: consumers follow the queue to its new master."""
        self.master = master
        self._live.clear()
        self.resubscribe()

    def release_consumers(self) -> list[Consumer]:
        """Consumers that move on to a queue object that replaces this proxy (promotion here)."""
        out = list(self.consumers)
        self.consumers.clear()
        for c in out:
            self.node.unregister_proxy_consumer(c)
        return out

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        cid = self.node.unregister_proxy_consumer(consumer)
        if cid is not None:
            self.node.transport.send(self.master, self._hdr("cancel", cid=cid))

    def cancel_consumer(self, consumer: Consumer) -> None:
        """The master cancelled it (queue deleted, master gone): tell the channel."""
        try:
            self.consumers.remove(consumer)
        except ValueError:
            pass
        self.node.unregister_proxy_consumer(consumer)
        consumer.channel.consumer_cancelled(consumer)

    def delivered(self, consumer: Consumer, seq: int, redelivered: bool, message: Message) -> None:
        if consumer.channel.state != "open" or consumer not in self.consumers:
            self.node.transport.send(self.master, self._hdr("requeue", seqs=[seq]))
            return
        if not consumer.no_ack:
            self._live.add(seq)
        consumer.channel.deliver(consumer, self, Fetched(seq, message, redelivered))

    def kick(self) -> None:
        """Deliveries are paced by the master's prefetch accounting."""

    async def get(self, no_ack: bool) -> Fetched | None:
        try:
            r, blob = await self.node.request(self.master, self._hdr("get", no_ack=no_ack))
        except ConnectionError:
            return None
        self._count = int(r.get("count", 0))
        if not r.get("found"):
            return None
        seq = int(r["seq"])
        if not no_ack:
            self._live.add(seq)
        return Fetched(seq, Message.from_bytes(blob), bool(r.get("red")))

    def _keep_live(self, seqs: list[int]) -> list[int]:
        out = [s for s in seqs if s in self._live]
        self._live.difference_update(out)
        return out

    async def ack(self, seqs: list[int], consumer: Consumer | None) -> None:
        seqs = self._keep_live(seqs)
        if seqs:
            self.node.transport.send(self.master, self._hdr("ack", seqs=seqs, cid=self.node.cid_of(consumer)))

    def requeue(self, seqs: list[int], consumer: Consumer | None) -> None:
        seqs = self._keep_live(seqs)
        if seqs:
            self.node.transport.send(self.master, self._hdr("requeue", seqs=seqs, cid=self.node.cid_of(consumer)))

    async def reject_messages(self, items: list[tuple[int, Message]], consumer: Consumer | None) -> None:
        keep = set(self._keep_live([s for s, _ in items]))
        kept = [(s, m) for s, m in items if s in keep]
        if kept:
            # the bodies travel back so the master can dead-letter them
            self.node.transport.send(self.master, self._hdr("reject", seqs=[s for s, _ in kept],
                                                            cid=self.node.cid_of(consumer)), pack_messages([m for _, m in kept]))

    async def purge(self) -> int:
        try:
            r, _ = await self.node.request(self.master, self._hdr("purge"))
        except ConnectionError:
            return 0
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
                self.node.unregister_proxy_consumer(c)

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
        return {
            "name": self.name, "vhost": self.vhost.name, "durable": self.durable, "exclusive": False,
            "auto_delete": self.auto_delete, "arguments": self.arguments, "messages_ready": self._count,
            "messages_unacknowledged": None, "consumers": len(self.consumers), "policy": self.policy_name,
            "effective_policy_definition": self.policy or {}, "state": "remote", "node": self.master,
        }


class RemoteConsumerChannel:
    """The master's stand-in for a channel on another node: deliveries go out on the link."""

    def __init__(self, node: ClusterNode, peer: str, cid: str) -> None:
        self.node = node
        self.peer = peer
        self.cid = cid
        self.unacked: set[int] = set()
        self.state = "open"

    def can_deliver(self, consumer: Consumer) -> bool:
        return self.state == "open" and self.node.transport.is_up(self.peer)

    def deliver(self, consumer: Consumer, queue: Queue, fetched: Fetched) -> None:
        if not consumer.no_ack:
            self.unacked.add(fetched.seq)
        self.node.transport.send(self.peer, {"t": "deliver", "cid": self.cid, "seq": fetched.seq,
                                             "red": fetched.redelivered}, fetched.message.to_bytes())

    def consumer_cancelled(self, consumer: Consumer) -> None:
        self.state = "closed"
        self.node.master_side.forget(self.peer, self.cid)
        self.node.transport.send(self.peer, {"t": "cancelled", "cid": self.cid})


class MasterSide:
    """Serves operations forwarded by other nodes to queues mastered here."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.consumers: dict[tuple[str, str], tuple[Consumer, RemoteConsumerChannel]] = {}
        self.gets: dict[tuple[str, str, str], set[int]] = {}  # (peer, vhost, queue) -> seqs taken by basic.get
        self._ids = itertools.count(1)

    def _queue(self, h: dict[str, Any]) -> Queue | None:
        vh = self.node.broker.vhosts.get(h.get("vh", ""))
        q = vh.queues.get(h.get("q", "")) if vh is not None else None
        return q if isinstance(q, Queue) and not q.deleted else None

    def forget(self, peer: str, cid: str) -> None:
        self.consumers.pop((peer, cid), None)

    def handle(self, peer: str, h: dict[str, Any], blob: bytes) -> None:
        t = h["t"]
        q = self._queue(h)
        if t == "pub":
            vh = self.node.broker.vhosts.get(h.get("vh", ""))
            exists = vh is not None and h.get("q") in vh.queues
            if q is None:
                if "id" in h:  # gone: acked as RabbitMQ acks an unroutable publish; not master: refused
                    self.node.transport.send(peer, {"t": "pub_ok", "id": h["id"], "ok": not exists})
                return
            cb = None
            if "id" in h:
                pid = h["id"]

                def cb(ok: bool, pid: int = pid) -> None:
                    self.node.transport.send(peer, {"t": "pub_ok", "id": pid, "ok": ok})
            q.enqueue(Message.from_bytes(blob), None, cb)
        elif t == "consume":
            cid = h["cid"]
            rc = RemoteConsumerChannel(self.node, peer, cid)
            if q is None:
                self.node.transport.send(peer, {"t": "cancelled", "cid": cid})
                return
            c = Consumer(cid, rc, q, bool(h.get("no_ack")), bool(h.get("exclusive")), int(h.get("prefetch", 0)),
                         arguments=dict(h.get("args") or {}))
            self.consumers[(peer, cid)] = (c, rc)
            q.add_consumer(c)
        elif t == "cancel":
            entry = self.consumers.pop((peer, h["cid"]), None)
            if entry is not None:
                entry[1].state = "closed"
                entry[0].queue.remove_consumer(entry[0])
        elif t in ("ack", "requeue", "reject"):
            self._settle(peer, t, h, q, blob)
        elif t in ("stat", "get", "purge"):
            self.node.spawn(self._answer(peer, t, h, q))

    def _settle(self, peer: str, t: str, h: dict[str, Any], q: Queue | None, blob: bytes) -> None:
        seqs = [int(s) for s in h.get("seqs", [])]
        entry = self.consumers.get((peer, h.get("cid") or ""))
        consumer = entry[0] if entry else None
        if entry:
            entry[1].unacked.difference_update(seqs)
        taken = self.gets.get((peer, h.get("vh", ""), h.get("q", "")))
        if taken:
            taken.difference_update(seqs)
        if q is None:
            return
        if consumer is not None and consumer.queue is not q:
            consumer = None
        if t == "ack":
            self.node.spawn(q.ack(seqs, consumer))
        elif t == "requeue":
            q.requeue(seqs, consumer)
        else:
            self.node.spawn(q.reject_messages(list(zip(seqs, unpack_messages(blob), strict=True)), consumer))

    async def _answer(self, peer: str, t: str, h: dict[str, Any], q: Queue | None) -> None:
        rid = h.get("id")
        blob = b""
        if q is None:
            reply: dict[str, Any] = {"messages": 0, "consumers": 0, "found": False, "count": 0, "n": 0}
        elif t == "stat":
            await q.settled()
            reply = {"messages": q.message_count(), "consumers": q.consumer_count()}
        elif t == "purge":
            await q.settled()
            reply = {"n": await q.purge()}
        else:
            await q.settled()
            f = q.get(bool(h.get("no_ack")))
            reply = {"found": f is not None, "count": q.message_count()}
            if f is not None:
                reply.update(seq=f.seq, red=f.redelivered)
                blob = f.message.to_bytes()
                if not h.get("no_ack"):
                    self.gets.setdefault((peer, q.vhost.name, q.name), set()).add(f.seq)
        self.node.transport.send(peer, {"t": "reply", "re": rid, **reply}, blob)

    def peer_down(self, peer: str) -> None:
        """Everything delivered to that node and not acked goes back, redelivered."""
        for (p, cid) in [k for k in self.consumers if k[0] == peer]:
            c, rc = self.consumers.pop((p, cid))
            rc.state = "closed"
            if rc.unacked and not c.queue.deleted:
                c.queue.requeue(sorted(rc.unacked), c)
            c.queue.remove_consumer(c)
        for key in [k for k in self.gets if k[0] == peer]:
            seqs = self.gets.pop(key)
            vh = self.node.broker.vhosts.get(key[1])
            q = vh.queues.get(key[2]) if vh else None
            if isinstance(q, Queue) and seqs and not q.deleted:
                q.requeue(sorted(seqs), None)


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
