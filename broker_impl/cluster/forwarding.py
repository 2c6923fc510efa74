"""The proxy side of queues mastered elsewhere: what this node forwards and what comes back for it.

``remote.RemoteQueue`` turns a channel's operations into messages to the
master; this object keeps what waits for an answer: publishes waiting for the
master's ``pub_ok`` (the client's confirm), requests waiting for a ``reply``,
and the consumers registered with a master, by the id the master's deliveries
name. A link that goes down fails what waited on it (a publish nacked: it may
or may not have been stored) and tells the proxies whose master it was.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from broker_impl.cluster.transport import Transport
from broker_impl.message import Message
from broker_impl.queue import ConfirmCallback, Consumer

RPC_TIMEOUT = 10.0


class Forwarder:
    """Publishes, requests and consumer registrations this node has outstanding with masters elsewhere."""

    def __init__(self, me: str, transport: Transport) -> None:
        self.me = me
        self.transport = transport
        self._pending_pubs: dict[int, tuple[str, ConfirmCallback]] = {}
        self._requests: dict[int, tuple[str, asyncio.Future[tuple[dict[str, Any], bytes]]]] = {}
        self._ids = itertools.count(1)
        self._proxy_consumers: dict[str, Consumer] = {}
        self._cid_of: dict[int, str] = {}

    def publish(
        self, master: str, h: dict[str, Any], message: Message, on_done: ConfirmCallback | None
    ) -> None:
        self.publish_blob(master, h, message.to_bytes(), on_done)

    def publish_blob(
        self, master: str, h: dict[str, Any], blob: bytes, on_done: ConfirmCallback | None
    ) -> None:
        """Send one publish request (a message, or a transaction's batch) and route its answer to ``on_done``."""
        if on_done is not None:
            pid = next(self._ids)
            h["id"] = pid
            if not self.transport.send(master, h, blob):
                on_done(False)
                return
            self._pending_pubs[pid] = (master, on_done)
        else:
            self.transport.send(master, h, blob)

    async def request(self, peer: str, h: dict[str, Any], blob: bytes = b"") -> tuple[dict[str, Any], bytes]:
        rid = next(self._ids)
        fut: asyncio.Future[tuple[dict[str, Any], bytes]] = asyncio.get_running_loop().create_future()
        if not self.transport.send(peer, {**h, "id": rid}, blob):
            raise ConnectionError(f"node {peer} is down")
        self._requests[rid] = (peer, fut)
        try:
            async with asyncio.timeout(RPC_TIMEOUT):
                return await fut
        except TimeoutError:
            raise ConnectionError(f"node {peer} did not answer") from None
        finally:
            self._requests.pop(rid, None)

    def register_consumer(self, c: Consumer) -> str:
        cid = f"{self.me}:{next(self._ids)}"
        self._proxy_consumers[cid] = c
        self._cid_of[id(c)] = cid
        return cid

    def unregister_consumer(self, c: Consumer) -> str | None:
        cid = self._cid_of.pop(id(c), None)
        if cid is not None:
            self._proxy_consumers.pop(cid, None)
        return cid

    def handle(self, peer: str, h: dict[str, Any], blob: bytes) -> None:
        """A master's answer: ``pub_ok``, ``reply``, ``deliver`` or ``cancelled``."""
        t = h.get("t")
        if t == "pub_ok":
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
            c.queue.delivered(  # type: ignore[attr-defined]  # a proxy consumer's queue is a RemoteQueue
                c, peer, cid, int(h["seq"]), bool(h.get("red")), Message.from_bytes(blob)
            )
        elif t == "cancelled":
            c = self._proxy_consumers.get(h["cid"])
            if c is not None:
                c.queue.cancel_consumer(c)  # type: ignore[attr-defined]

    def peer_down(self, peer: str) -> None:
        for pid, (p, cb) in list(self._pending_pubs.items()):
            if p == peer:
                del self._pending_pubs[pid]
                cb(False)
        for rid, (p, fut) in list(self._requests.items()):
            if p == peer:
                del self._requests[rid]
                if not fut.done():
                    fut.set_exception(ConnectionError(f"node {peer} is down"))
