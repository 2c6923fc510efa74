"""Held-back (delayed) messages, kept the RocketMQ way: a schedule queue in the commit log.

RocketMQ rewrites a delayed message to ``SCHEDULE_TOPIC_XXXX`` (one consume queue per
delay level), and ``ScheduleMessageService`` reads each level's consume queue from its
own offset table, writes the message back to its real topic when due, and only then
advances the offset. Here every vhost has one schedule queue in the node's store
(``SCHEDULE_TOPIC_XXXX`` + NUL + vhost: the NUL keeps it apart from any store key a
user's queue gets). Its records are the published message as the exchange got it;
the due time is the record's STORETIMESTAMP plus the ``x-delay`` header (RocketMQ's
``computeDeliverTimestamp``). Delays are arbitrary milliseconds, not a few levels, so
entries come due out of order and the schedule's consume progress is the store's
per-index ack set of that queue (``store.progress``) rather than one offset per level.

- A delayed publish is confirmed when its schedule record is as durable as the flush
  policy promises (``Store.wait_durable``), not when it is delivered.
- When due, the message is routed through its exchange as it is then (bindings added
  or removed meanwhile count, as with the plugin), enqueued, and its schedule entry is
  acked only once every queue confirmed it. A crash before that ack routes it again
  after the restart: at least once, never lost, never before its due time.
- Nothing is routed while the node turns clients away (joining the cluster after a restart,
  paused in a minority partition, or joining again after it resumed from that pause or lost
  an autoheal, until the awaited peer's records are applied: ``Catalog.restart``): its view
  of where queues are mastered may be about to be replaced, and a message enqueued into a
  copy the cluster then drops would be lost (seen in ``scenarios/reference-delayed.yaml``
  before this rule: a restarted node routed its overdue messages into its recovered copy
  0.1 s before taking the cluster's records, which dropped that copy; and before a resumed
  node counted as joining, n2 routed 67 into its stale copy in the 50 ms after it resumed).
  Due messages wait; they come out late, not lost.
- A routing during which a cluster peer went down is not trusted: a master cut off in a
  minority confirms alone before it pauses, and its copy is dropped when the partition heals
  (21 lost that way in ``reference-delayed.yaml`` before this rule). The entry stays and is
  routed again once the node serves clients; if the first copy survived too, the queue
  gets a duplicate (at least once).
- A message with no queue to go to when due is dropped (the plugin makes one attempt; here
  it is tried again every second, ``UNROUTED_TRIES`` times, first: a node taking the cluster's
  records after a partition heals replaces its copy of a queue, and a message routed in that
  step found no queue and was dropped, 77 of them in ``reference-delayed.yaml``); a
  queue that refuses it (nack, e.g. its master unreachable) is retried every second
  until it takes it; the queues that already took it are not given it again.
- Due times are wall-clock milliseconds (they must survive a restart; a monotonic clock
  does not). The timer never sleeps more than a second, so a wall clock stepped
  forward or back is noticed within a second; a clock stepped forward makes messages
  come due early by that step, which is what the harness's ``early`` check is for.

Where the schedule lives in a cluster: on the node that accepted the publish, in its
own store, as the plugin keeps its Mnesia table on the local node only. Routing happens
when due, so a queue whose master failed over meanwhile gets the message at its new
master. The schedule survives a crash or power loss of its node (what was confirmed is
in its commit log and is routed after the restart, late); it does not survive the
permanent loss of that node's disk, and while the node is down its due messages wait.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from broker_impl.backing_queue import StoreError
from broker_impl.delayed import delay_ms, swapped_headers
from broker_impl.message import Message

if TYPE_CHECKING:
    from broker_impl.queue import Queue
    from broker_impl.store import Store
    from broker_impl.vhost import VHost

log = logging.getLogger("broker_impl.schedule")

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX\x00"
RETRY_MS = 1000  # a due message some queue refused is offered to it again this much later
UNROUTED_TRIES = 5  # a due message that finds no queue is tried this many more times before it is dropped
# A queue that neither confirms nor refuses in this time counts as refused, and the message is
# routed again (RocketMQ's flush timeout is 5 s too). A copy the cluster drops (a master cut off,
# a copy replaced when a partition heals) never answers: with 30 s, messages held through a
# partition in reference-delayed.yaml waited past the heal until their node was next restarted.
CONFIRM_TIMEOUT_S = 5.0
GONE_POLL_S = 0.1  # how often a routing waiting for confirms looks whether its queues are still there
MAX_SLEEP_S = 1.0  # the timer looks at the wall clock at least this often
HELD_POLL_S = 0.1  # while the node turns clients away, how often it looks whether it serves again


def schedule_key(vhost: str) -> str:
    return SCHEDULE_TOPIC + vhost


class ScheduleOwner(Protocol):
    """What the scheduler needs from the node it runs on (``broker_impl.broker.Broker``)."""

    store: Store | None
    vhosts: dict[str, VHost]

    def peer_losses(self) -> int: ...

    def client_refusal(self) -> str | None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...


@dataclass(order=True, slots=True)
class _Entry:
    due_ms: int
    vhost: str = field(compare=False)
    index: int
    offset: int = field(compare=False)
    size: int = field(compare=False)
    delay: int = field(compare=False)
    unrouted: int = field(default=0, compare=False)  # attempts that found no queue


class Scheduler:
    """One node's schedule: holds delayed messages in its store, routes them when due."""

    def __init__(self, broker: ScheduleOwner) -> None:
        self.broker = broker
        self._heap: list[_Entry] = []
        self._taken: dict[tuple[str, int], set[str]] = {}  # queues that already confirmed a due message
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._routing = 0
        self.stats = {"scheduled": 0, "routed": 0, "dropped": 0, "retried": 0, "held_for_cluster": 0}

    @property
    def pending(self) -> int:
        """Delayed messages not yet routed for good (waiting, or being routed now)."""
        return len(self._heap) + self._routing

    def start(self) -> None:
        """Reload what the store holds (every unacked schedule entry), then run the timer."""
        store = self.broker.store
        assert store is not None
        for key in sorted(store.recovered_queues()):
            if not key.startswith(SCHEDULE_TOPIC):
                continue
            vhost = key[len(SCHEDULE_TOPIC) :]
            for index, offset, size in store.open_queue(key).unacked():
                rec = store.read(offset, size)
                if rec is None:
                    continue  # unreadable: the store logged it; nothing can be routed from it
                delay = delay_ms(Message.from_bytes(rec.payload).properties) or 0
                heapq.heappush(self._heap, _Entry(rec.store_ms + delay, vhost, index, offset, size, delay))
        if self._heap:
            log.info("schedule: %d delayed message(s) recovered", len(self._heap))
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def schedule(self, vhost: str, message: Message, delay: int) -> Awaitable[None]:
        """Write the message to the schedule now (publish order); await the result for its durability.

        Raises StoreError at once if the store refuses the write; the awaitable raises it if the
        flush fails or times out (the publisher then gets a nack).
        """
        store = self.broker.store
        if store is None:
            raise StoreError("the store is closed")
        offset, size, index = store.append(schedule_key(vhost), message.to_bytes())
        heapq.heappush(self._heap, _Entry(_now_ms() + delay, vhost, index, offset, size, delay))
        self.stats["scheduled"] += 1
        self._wake.set()
        return store.wait_durable(offset + size)

    async def _run(self) -> None:
        while True:
            now = _now_ms()
            due = bool(self._heap) and self._heap[0].due_ms <= now
            if due and self.broker.client_refusal() is not None:
                # Joining (the queue records may still be replaced by the cluster's) or paused in a
                # minority: a message routed now could go to a copy the cluster then drops.
                self.stats["held_for_cluster"] += 1
                sleep = HELD_POLL_S
            else:
                while self._heap and self._heap[0].due_ms <= now:
                    self._routing += 1
                    self.broker.spawn(self._routed(heapq.heappop(self._heap)))
                sleep = (
                    MAX_SLEEP_S if not self._heap else min(MAX_SLEEP_S, (self._heap[0].due_ms - now) / 1000)
                )
            self._wake.clear()
            try:
                async with asyncio.timeout(max(sleep, 0.001)):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _routed(self, e: _Entry) -> None:
        try:
            await self._route(e)
        finally:
            self._routing -= 1

    async def _route(self, e: _Entry) -> None:
        store = self.broker.store
        if store is None:
            return
        key = schedule_key(e.vhost)
        rec = store.read(e.offset, e.size)
        vh = self.broker.vhosts.get(e.vhost)
        msg = Message.from_bytes(rec.payload) if rec is not None else None
        ex = vh.exchanges.get(msg.exchange) if vh is not None and msg is not None else None
        if vh is None or msg is None or ex is None:
            self._done(key, e, "its exchange is gone" if msg is not None else "its record is unreadable")
            return
        props = swapped_headers(msg.properties, e.delay)
        taken = self._taken.setdefault((e.vhost, e.index), set())
        queues = [q for q in vh.route(ex, msg.routing_key, props) if q.name not in taken]
        if not queues and not taken:
            e.unrouted += 1
            if e.unrouted <= UNROUTED_TRIES:
                self._again(e)
                return
            self._done(key, e, "no queue is bound to take it")
            return
        losses = self.broker.peer_losses()
        loop = asyncio.get_running_loop()
        results: dict[str, asyncio.Future[bool]] = {q.name: loop.create_future() for q in queues}
        for q in queues:
            q.enqueue(
                Message(msg.exchange, msg.routing_key, props, msg.body), None, _resolver(results[q.name])
            )
        await _confirmed_or_gone(results, queues, vh, CONFIRM_TIMEOUT_S)
        if self.broker.peer_losses() != losses or self.broker.client_refusal() is not None:
            # A peer went down while the queues confirmed: a master cut off in a minority
            # confirms alone and its copy is dropped at the heal. Route it again later.
            self._again(e)
            return
        taken.update(name for name, fut in results.items() if fut.done() and fut.result())
        if any(not (f.done() and f.result()) for f in results.values()):
            self._again(e)
            return
        self._taken.pop((e.vhost, e.index), None)
        self.stats["routed"] += 1
        if self.broker.store is store:
            store.ack(key, [e.index])

    def _again(self, e: _Entry) -> None:
        self.stats["retried"] += 1
        e.due_ms = _now_ms() + RETRY_MS
        heapq.heappush(self._heap, e)
        self._wake.set()

    def _done(self, key: str, e: _Entry, why: str) -> None:
        log.info("schedule: delayed message %d in vhost %r dropped: %s", e.index, e.vhost, why)
        self.stats["dropped"] += 1
        self._taken.pop((e.vhost, e.index), None)
        store = self.broker.store
        if store is not None:
            store.ack(key, [e.index])


async def _confirmed_or_gone(
    results: dict[str, asyncio.Future[bool]], queues: list[Queue], vh: VHost, timeout: float
) -> None:
    """Wait until every queue answered, one of them is no longer the vhost's (a copy dropped or
    replaced when the node took the cluster's records: it will never answer), or ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = set(results.values())
    while pending and loop.time() < deadline:
        _, pending = await asyncio.wait(pending, timeout=min(GONE_POLL_S, max(0.0, deadline - loop.time())))
        if any(q.deleted or vh.queues.get(q.name) is not q for q in queues):
            return


def _resolver(fut: asyncio.Future[bool]) -> Callable[[bool], None]:
    def done(ok: bool) -> None:
        if not fut.done():
            fut.set_result(ok)

    return done


def _now_ms() -> int:
    return int(time.time() * 1000)
