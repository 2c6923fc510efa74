"""Replacing the queue object behind a name: its consumers move over, the old object is deleted.

A queue changes kind on a node when its master moves: a proxy
(``remote.RemoteQueue``) becomes the real queue on promotion here or when the
record says so, and a local copy becomes a proxy when a master elsewhere
replaced it (``demote``). Bindings name the queue, not the object, so they
stay. Consumers of a replaced proxy follow the queue unless they asked for
``x-cancel-on-ha-failover``; what they held from the old master is void (the
new master requeued it). A local copy's deletion is tracked until it is done,
because a mirror of the same queue opens the same store queue and must wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker_impl.cluster.config import Spawn
from broker_impl.cluster.forwarding import Forwarder
from broker_impl.cluster.metadata import queue_options
from broker_impl.cluster.remote import RemoteQueue
from broker_impl.cluster.transport import Transport
from broker_impl.exchange import Binding
from broker_impl.queue import Consumer, Queue

if TYPE_CHECKING:
    from broker_impl.vhost import VHost


class Handoff:
    """Moves consumers between queue objects and deletes replaced ones."""

    def __init__(
        self,
        forwarder: Forwarder,
        transport: Transport,
        spawn: Spawn,
        apply_policies: Callable[[Queue], None],
    ) -> None:
        self.forwarder = forwarder  # a proxy's way to its master
        self.transport = transport
        self.spawn = spawn
        self.apply_policies = apply_policies  # the broker's
        self.dropping: dict[tuple[str, str], asyncio.Task[Any]] = {}  # local queue copies being deleted

    @staticmethod
    def take_consumers(q: Any) -> list[Consumer]:
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
    def give_consumers(q: Queue, consumers: list[Consumer]) -> None:
        for c in consumers:
            c.queue = q
            c.unacked = 0
            q.add_consumer(c)

    def start_drop(self, vh: VHost, q: Any) -> asyncio.Task[Any]:
        """Unlist ``q`` now and delete it, without touching its bindings (they name the queue, not the object).

        The caller lists the replacement in the same step; a mirror that opens the
        same store queue waits for the deletion (``dropping``).
        """
        name = q.name
        if vh.queues.get(name) is q:
            del vh.queues[name]
        return self._track(vh.name, name, self.spawn(q.delete()))

    def _track(self, vhost: str, name: str, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        k = (vhost, name)
        self.dropping[k] = task
        task.add_done_callback(lambda t: self.dropping.pop(k) if self.dropping.get(k) is t else None)
        return task

    def install_proxy(self, vh: VHost, name: str, master: str, data: dict[str, Any]) -> RemoteQueue:
        rq = RemoteQueue(
            self.forwarder,
            self.transport,
            vh,
            name,
            master,
            **queue_options(data),
        )
        vh.queues[name] = rq  # type: ignore[assignment]
        vh.exchanges[""].bind(Binding("", name, name))
        self.apply_policies(rq)  # type: ignore[arg-type]
        return rq

    def demote(self, vh: VHost, q: Queue, master: str, data: dict[str, Any]) -> asyncio.Task[Any]:
        """A copy mastered here lost its place to a master elsewhere: a proxy takes the name, the copy is discarded.

        In one step: no publish may find the name without a queue (an unroutable
        publish is confirmed, and dropped), and what the copy had not confirmed yet
        is refused, not confirmed (``Queue.discard``).
        """
        self.install_proxy(vh, q.name, master, data)
        return self._track(vh.name, q.name, self.spawn(q.discard()))
