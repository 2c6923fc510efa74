"""The final drain of one queue, read through one node per visit (``harness.spec.client.DrainReader``).

Reading a queue through one node and stopping at the first passive declare that
says 0 ready misses what that count leaves out: deliveries still held unacked by
a connection nobody closed, and copies of the queue that only another node
serves (a split brain, an unmirrored queue, a node that came back with its own
data). So the harness goes round all nodes, each through its healed proxy, and
on each visit this reader consumes until ``drain_idle`` seconds pass with nothing
delivered and every ack confirmed, cancels its consumer and asks the node for the
queue's depth (ready and unacked, from the broker plugin's ``queue_depth``; a
passive declare when the plugin cannot tell). The first look of a visit comes after
at most ``FIRST_LOOK`` quiet seconds when the plugin tells the depth: a node that
holds nothing is then done at once. The harness ends the drain ``ok``
only after a full round in which every node reported the queue empty and nothing
new was acked; a connection lost on the way moves it to the next node, and if
``drain_timeout`` runs out first it ends ``info``: the checkers can then say
"unknown", never "lost".

What the reader shows per node (the drain op's value, the contract with the
checkers): what the drain acked there, the last depth seen, when the node first
reported the queue empty after the drain had been idle on it (``empty_at_ns``,
history time) and the last error. A message found through node B after node A
reported empty is a copy only B had.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from harness.spec import HeldTotal, QueueDepth, Recorder, depth_value
from harness.spec.client import NodeDrain, QueueHolders, reason
from harness.spec.history import DEPTH
from plugins.amqp091.consumer import Session
from plugins.amqp091.link import BROKER_ERRORS, CONNECT_TIMEOUT, OP_TIMEOUT, Link

POLL = 0.05  # seconds between looks at a session while waiting for it to go quiet
#: A visit's first look at the depth comes after at most this many quiet seconds. Emptiness is
#: decided by the depth (ready and unacked, after the consumer is cancelled and every ack is
#: confirmed), never by the quiet itself, so a node that holds nothing is done after one short
#: look; a node that still holds messages is read with the whole ``drain_idle`` from then on.
FIRST_LOOK = 0.5


@dataclass
class NodeView:
    consumed: int = 0
    ready: int | None = None
    unacked: int | None = None
    empty_at_ns: int | None = None
    error: str | None = None


class _VisitEnded(Exception):
    """This visit cannot go on (the node's error is the message); the drain tries the next node."""


class Drain(NodeDrain[NodeView]):
    """One queue's drain through AMQP 0-9-1, one node per visit (``DrainReader``)."""

    def __init__(
        self,
        *,
        nodes: list[str],
        open_link: Callable[[str], Awaitable[Link]],
        recorder: Recorder,
        process: str,
        queue: str,
        depth: QueueDepth | None,
        seed: int,
        message_size: int,
        prefetch: int,
        idle: float,
        timeout: float,
        clients: Callable[[], int] | None = None,
        holders: QueueHolders | None = None,
    ) -> None:
        super().__init__(nodes, NodeView)
        self.clients = clients  # the workload's client connections still open on this queue
        self.holders = holders
        self.open_link = open_link
        self.recorder = recorder
        self.process = process
        self.queue = queue
        self.depth = depth
        self.seed = seed
        self.message_size = message_size
        self.prefetch = prefetch
        self.idle = idle
        self.timeout = timeout  # for the error a visit the time cut short records
        # Leave a node that stays non-empty with nothing acked for this long; come back next round.
        self.patience = max(10.0, 4 * idle)
        self.loop = asyncio.get_running_loop()
        self._left: Callable[[], float] = lambda: timeout

    async def visit(self, node: str, left: Callable[[], float]) -> bool:
        self._left = left
        return await self._visit(node)

    async def _visit(self, node: str) -> bool:
        """Drain through ``node`` until it reports the queue empty; False if it did not."""
        view = self.node_views[node]
        try:
            link = await self.open_link(node)
        except BROKER_ERRORS as exc:
            view.error = f"connect: {reason(exc)}"
            return False
        session = Session(
            link,
            self.recorder,
            self.process,
            self.queue,
            seed=self.seed,
            message_size=self.message_size,
            prefetch=self.prefetch,
        )
        empty = False
        try:
            async with asyncio.timeout(min(OP_TIMEOUT, max(0.1, self._left()))):
                await session.open()
            async with asyncio.timeout(max(0.1, self._left())):
                empty = await self._until_empty(node, session, view)
        except _VisitEnded as exc:
            view.error = str(exc)
        except BROKER_ERRORS as exc:
            ran_out = self._left() <= 0
            view.error = f"drain_timeout ({self.timeout:g}s) ran out on this node" if ran_out else reason(exc)
        finally:
            why = session.broken()
            if why is not None:
                session.lost(why)
                view.error = view.error or why
            elif not session.ended:
                await session.close("close", min(CONNECT_TIMEOUT, max(1.0, self._left())))
            await link.close()
            self.count(view, session.acked)
        if empty:
            view.error = None
        return empty

    async def _until_empty(self, node: str, session: Session, view: NodeView) -> bool:
        progress_acked, progress_at = session.acked, self.loop.time()
        # Without the plugin's depth the unacked count is unknown: every look waits the whole idle.
        idle = min(self.idle, FIRST_LOOK) if self.depth is not None else self.idle
        while True:
            await self._quiet(session, idle=idle)
            idle = self.idle
            await session.cancel()
            await self._quiet(session, idle=0.0)  # what came before cancel-ok is acked, every ack confirmed
            ready, unacked = await self._depth(node, session)
            view.ready, view.unacked = ready, unacked
            if ready == 0 and not unacked:
                return self.emptied(view, self.recorder.now_ns())
            now = self.loop.time()
            if session.acked > progress_acked:
                progress_acked, progress_at = session.acked, now
            elif now - progress_at > self.patience:
                raise _VisitEnded(
                    f"not empty after {now - progress_at:.0f}s without a new ack "
                    f"(ready {ready}, unacked {'?' if unacked is None else unacked})"
                )
            await session.consume()

    async def _quiet(self, session: Session, idle: float | None = None) -> None:
        """Until nothing was delivered for ``idle`` seconds, nothing is held and every ack is confirmed."""
        idle = self.idle if idle is None else idle
        while True:
            why = session.broken()
            if why is not None:
                raise _VisitEnded(why)
            if (
                self.loop.time() - session.last_delivery >= idle
                and not session.held
                and not session.unconfirmed
            ):
                return
            if session.unconfirmed and not session.held:
                await session.barrier()
            else:
                await asyncio.sleep(POLL)

    async def _holders(self, node: str) -> dict[str, Any]:
        """What the broker lists as holding deliveries nobody of the harness's holds (if it can tell)."""
        if self.holders is None:
            return {}
        try:
            got = await self.holders(node, self.queue)
        except Exception as exc:  # noqa: BLE001 - evidence only: its failure is recorded, not raised
            return {"holders_error": reason(exc)}
        return {} if got is None else {"holders": got}

    async def _depth(self, node: str, session: Session) -> tuple[int, int | None]:
        if self.depth is not None:
            # Each look is a ``depth`` op: with no client connection of the harness left on the
            # queue and none held by the drain, unacked deliveries are held for no consumer.
            look = self.recorder.invoke(self.process, DEPTH, node=node, queue=self.queue)
            try:
                got = await self.depth(node, self.queue)
            except Exception as exc:  # noqa: BLE001 - a plugin's exec failing is this node's error
                look.info(f"queue depth: {reason(exc)}")
                raise _VisitEnded(f"queue depth: {reason(exc)}") from None
            if got is not None:
                seen: dict[str, Any] = {**depth_value(got), "own_unacked": len(session.held)}
                if self.clients is not None:
                    seen["clients"] = self.clients()
                    if seen["unacked"] and not seen["clients"] and not seen["own_unacked"]:
                        seen |= await self._holders(node)
                look.ok(seen)
                return (got.total, None) if isinstance(got, HeldTotal) else got
            look.info("the broker plugin cannot tell this node's depth")
        async with asyncio.timeout(OP_TIMEOUT):
            declared = await session.ch.queue_declare(self.queue, passive=True)
        return int(declared.message_count or 0), None
