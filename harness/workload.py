"""The workload: producers with publisher confirms, consumers with manual acks, a final drain.

Protocol-independent scheduling lives here; a driver (``AmqpDriver`` in
``plugins.amqp091.client``) knows one wire protocol. Every operation goes to the
history as an invoke plus exactly one completion; an exception is ``info``.
A message counts as consumed when its ack completed ``ok``, not when it arrived.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.drain import run_drain
from harness.history import Recorder
from harness.progress import say
from harness.scenario import WorkloadSection
from harness.spec.broker import BrokerPlugin, HeldTotal, NodeHandle
from harness.spec.client import (  # noqa: F401 - RateLimiter: tests
    Driver,
    DriverOptions,
    NodeHoldings,
    QueueDepth,
    QueueHolders,
    QueueReplicas,
    RateLimiter,
)
from harness.spec.client import reason as _reason
from harness.spec.errors import ScenarioError
from harness.spec.history import HOLDINGS, dead_letter_queue
from harness.spec.history import Recorder as SpecRecorder

log = logging.getLogger("brokerchaos.workload")


def _orphaned_task_failed(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A client library's own task that failed after the operation awaiting it had given up (an
    ack's round trip that timed out, then its connection closed in a partition): that operation's
    outcome is in the history already, so the error goes to the log, not to the terminal as a
    traceback, even when it is collected after the workload's loop has closed. Anything else
    goes to asyncio's default handler."""
    if context.get("message", "").startswith("Task exception was never retrieved"):
        exc = context.get("exception")
        log.debug("a client task failed after its operation ended: %s", exc if exc is not None else context)
        return
    loop.default_exception_handler(context)


@dataclass
class WorkloadStats:
    started: float = 0.0
    stopped: float = 0.0
    cpu_seconds: float = 0.0
    published_ok: int = 0
    published_fail: int = 0
    published_info: int = 0
    consumed: int = 0  # acks completed ok
    delivered: int = 0
    abandoned: int = 0
    reconnects: int = 0
    drained: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        wall = max(self.stopped - self.started, 1e-9)
        ops = self.published_ok + self.published_fail + self.published_info + self.consumed
        return {
            "wall_seconds": round(wall, 3),
            "driver_cpu_seconds": round(self.cpu_seconds, 3),
            "messages_published_ok": self.published_ok,
            "messages_published_fail": self.published_fail,
            "messages_published_info": self.published_info,
            "messages_consumed": self.consumed,
            "messages_delivered": self.delivered,
            "messages_abandoned": self.abandoned,
            "reconnects": self.reconnects,
            "ops_per_second": round(ops / wall, 1),
            # What one core of this driver could sustain: operations per CPU-second it spent.
            "driver_capacity_ops_per_cpu_second": round(ops / self.cpu_seconds, 1)
            if self.cpu_seconds
            else None,
            "driver_cpu_share": round(self.cpu_seconds / wall, 3),
        }


def queue_names(w: WorkloadSection) -> list[str]:
    return [f"{w.queue_prefix}-{i}" for i in range(1, w.queues + 1)]


def assignments(w: WorkloadSection, nodes: Sequence[str], seed: int) -> dict[str, tuple[str, str]]:
    """Which queue and first node each producer and consumer uses (spread, seeded)."""
    rng = random.Random(seed)
    queues = queue_names(w)
    order = list(nodes)
    rng.shuffle(order)
    out: dict[str, tuple[str, str]] = {}
    for i in range(w.producers):
        out[f"p{i + 1}"] = (queues[i % len(queues)], order[i % len(order)])
    for i in range(w.consumers):
        out[f"c{i + 1}"] = (queues[i % len(queues)], order[(i + 1) % len(order)])
    for i in range(w.readers):
        out[f"r{i + 1}"] = (queues[i % len(queues)], order[(i + 2) % len(order)])
    for i, q in enumerate(dead_letter_queues(w)):  # one consumer more per dead-letter queue
        n = w.consumers + i + 1
        out[f"c{n}"] = (q, order[n % len(order)])
    return out


def dead_letter_queues(w: WorkloadSection) -> list[str]:
    """``workload.dead_letter``: each workload queue's dead-letter queue, in the queues' order."""
    return [dead_letter_queue(q) for q in queue_names(w)] if w.dead_letter else []


async def run_workload(
    driver: Driver,
    w: WorkloadSection,
    nodes: Sequence[str],
    seed: int,
    recorder: Recorder,
    *,
    on_tick: Any = None,
    nemesis: Any = None,
    holdings: NodeHoldings | None = None,
    broker_dead_letter: Sequence[str] = (),
    down: Mapping[str, str] | None = None,
) -> WorkloadStats:
    """Run producers and consumers for ``w.duration`` seconds (with the nemesis alongside),
    then stop producers, let the nemesis heal, drain every queue (and after them the dead-letter
    queues: the workload's own and the broker's, ``broker_dead_letter``), and record what each
    node's copy of each queue holds (``holdings``, when the broker plugin can tell). ``down``: the
    nodes the final heal could not bring back (``Nemesis.down``, filled as the nemesis ends): the
    drain reads around them."""
    stats = WorkloadStats()
    asyncio.get_running_loop().set_exception_handler(_orphaned_task_failed)
    queues = queue_names(w)
    read = getattr(driver, "read", None)
    if w.readers and read is None:
        raise ScenarioError(
            f"workload.readers: the {type(driver).__name__} client has no ordered stream readers; set it to 0"
        )
    await driver.setup(queues)
    plan = assignments(w, nodes, seed)
    stop_producers = asyncio.Event()
    stop_consumers = asyncio.Event()
    stop_readers = asyncio.Event()
    cpu0 = time.process_time()
    stats.started = time.monotonic()
    tasks = [
        asyncio.create_task(
            _client(driver, read, proc, queue, stop_producers, stop_consumers, stop_readers), name=proc
        )
        for proc, (queue, _node) in plan.items()
    ]
    nemesis_task = asyncio.create_task(nemesis(w.duration)) if nemesis else None
    ticker = asyncio.create_task(_tick(on_tick, recorder, stats)) if on_tick else None
    try:
        await asyncio.sleep(w.duration)
        stop_producers.set()
        await _wait_for(tasks, "p", w.confirm_timeout + 5)
        producers_done = time.monotonic()
        if nemesis_task is not None:
            await nemesis_task  # heals everything and settles before returning
        await until_delayed_due(w, producers_done)
        stop_consumers.set()
        await _wait_for(tasks, "c", 10)
        dead = [*dead_letter_queues(w), *broker_dead_letter]
        stats.drained = {}
        up = [n for n in nodes if n not in (down or {})]
        if not up:
            say("drain", "no node that serves clients came back after the final heal: nothing to drain")
            return stats
        await _drain_all(driver, queues, dead, up, w, recorder, stats.drained)
        stop_readers.set()  # each reads on to the stream's end, within the drain's time
        await _wait_for(tasks, "r", w.drain_timeout)
        if holdings is not None:
            await record_holdings(holdings, up, [*queues, *dead], recorder)
    finally:
        stop_producers.set()
        stop_consumers.set()
        stop_readers.set()
        for t in tasks:
            t.cancel()
        if nemesis_task is not None and not nemesis_task.done():
            nemesis_task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if nemesis_task is not None:
            await asyncio.gather(nemesis_task, return_exceptions=True)
        if ticker is not None:
            ticker.cancel()
        _count(stats, recorder, cpu0)
    return stats


def _client(
    driver: Driver,
    read: Any,
    proc: str,
    queue: str,
    stop_producers: asyncio.Event,
    stop_consumers: asyncio.Event,
    stop_readers: asyncio.Event,
) -> Coroutine[Any, Any, None]:
    """The client coroutine of one workload process, by its name's first letter."""
    if proc.startswith("p"):
        return driver.produce(proc, queue, stop_producers)
    if proc.startswith("r"):
        return read(proc, queue, stop_readers)
    return driver.consume(proc, queue, stop_consumers)


async def _wait_for(tasks: Sequence[asyncio.Task[Any]], role: str, timeout: float) -> None:
    """Wait up to ``timeout`` for the clients of one role (their task names' first letter)."""
    mine = [t for t in tasks if t.get_name().startswith(role)]
    if mine:
        await asyncio.wait(mine, timeout=timeout)


async def _drain_all(
    driver: Driver,
    queues: list[str],
    dead: list[str],
    nodes: Sequence[str],
    w: WorkloadSection,
    recorder: Recorder,
    drained: dict[str, Any],
) -> None:
    """Drain every queue, then the dead-letter queues (a message expiring during the queues' drain
    reaches its dead-letter queue only then); into ``drained``, per queue what its drain returned,
    or its error."""
    drainers = [(f"d{i}", q) for i, q in enumerate([*queues, *dead], start=1)]
    for batch in (drainers[: len(queues)], drainers[len(queues) :]):
        results = await asyncio.gather(
            *(drain_queue(driver, d, q, nodes, w, recorder) for d, q in batch), return_exceptions=True
        )
        for (_d, q), res in zip(batch, results, strict=True):
            drained[q] = res if isinstance(res, int) else f"error: {res}"


def _count(stats: WorkloadStats, recorder: Recorder, cpu0: float) -> None:
    """The workload's end: its time, its CPU, and what the recorder counted."""
    stats.stopped = time.monotonic()
    stats.cpu_seconds = time.process_time() - cpu0
    c = recorder.counts
    stats.published_ok = c.get(("publish", "ok"), 0)
    stats.published_fail = c.get(("publish", "fail"), 0)
    stats.published_info = c.get(("publish", "info"), 0)
    stats.consumed = c.get(("ack", "ok"), 0)
    stats.delivered = c.get(("consume", "ok"), 0)
    stats.abandoned = c.get(("abandon", "invoke"), 0)


async def drain_queue(
    driver: Driver, process: str, queue: str, nodes: Sequence[str], w: WorkloadSection, recorder: SpecRecorder
) -> int:
    """The final drain of one queue: the harness's rounds (``harness.drain``) over the driver's
    reads of one node per visit (``drain_reader``)."""
    reader = driver.drain_reader(process, queue)
    return await run_drain(reader, recorder, process, queue, nodes, timeout=w.drain_timeout)


#: After the last delayed publish is due, how long consumers keep running before the drain: a node
#: restarted at the final heal routes what came due while it was down only once it is up again.
DELAY_GRACE_S = 2.0


async def until_delayed_due(w: WorkloadSection, producers_done: float) -> None:
    """``workload.delay``: the drain ends once queues are empty, and a delayed message is in no queue
    until it is due; so consumers keep running until every delayed publish has come due."""
    if w.delay is None:
        return
    await asyncio.sleep(max(0.0, producers_done + w.delay.max_ms / 1000 + DELAY_GRACE_S - time.monotonic()))


async def _tick(on_tick: Any, recorder: Recorder, stats: WorkloadStats) -> None:
    while True:
        await asyncio.sleep(1.0)
        c = recorder.counts
        on_tick(
            {
                "published": c.get(("publish", "ok"), 0),
                "failed": c.get(("publish", "fail"), 0),
                "unknown": c.get(("publish", "info"), 0),
                "consumed": c.get(("ack", "ok"), 0),
                "faults": c.get(("heal", "ok"), 0),
            }
        )


def driver_options(
    w: WorkloadSection,
    plugin: BrokerPlugin,
    settings: Mapping[str, Any],
    *,
    seed: int = 0,
    first_node: Mapping[str, str] | None = None,
    queue_depth: QueueDepth | None = None,
    queue_holders: QueueHolders | None = None,
    queue_replicas: QueueReplicas | None = None,
) -> DriverOptions:
    """Every keyword option of a client factory (``harness.spec.client.DriverOptions``)."""
    return {
        "workload": w,
        "seed": seed,
        "first_node": dict(first_node or {}),
        "username": plugin.username,
        "password": plugin.password,
        "vhost": plugin.vhost,
        "queue_arguments": plugin.queue_arguments(settings),
        "client_settings": plugin.client_settings(settings),
        "queue_depth": queue_depth,
        "queue_holders": queue_holders,
        "queue_replicas": queue_replicas,
    }


def depth_timeout(drain_timeout: float, drained: int) -> float:
    """How long one ``queue_depth`` answer may take: the node's share of the drain's budget
    (``workload.drain_timeout`` over the ``drained`` nodes a round visits). A depth is one node's
    answer among those a round needs, so no single slow node's may take the whole budget and
    leave the others unvisited; and it grows with the budget, so a loaded host that needs more
    time gets it by raising ``drain_timeout`` (a fixed limit made that knob useless)."""
    return drain_timeout / max(1, drained)


def queue_depth_reader(plugin: BrokerPlugin, nodes: Mapping[str, NodeHandle], timeout: float) -> QueueDepth:
    """The plugin's ``queue_depth`` as the drain calls it: awaitable, by node name, each answer
    within ``timeout`` (``depth_timeout``). It runs a command in the node's container and
    blocks, so it runs in a thread off the event loop."""

    async def depth(node: str, queue: str) -> tuple[int, int] | HeldTotal | None:
        return await asyncio.to_thread(plugin.queue_depth, nodes[node], queue, timeout)

    return depth


async def record_holdings(
    holdings: NodeHoldings, nodes: Sequence[str], queues: Sequence[str], recorder: Recorder
) -> None:
    """One ``holdings`` op per node and queue (``harness.spec.history``), every node asked at once."""

    async def one(node: str, queue: str) -> None:
        inv = recorder.invoke(HOLDINGS, HOLDINGS, node=node, queue=queue)
        try:
            got = await holdings(node, queue)
        except Exception as exc:  # noqa: BLE001 - evidence only: a node that cannot answer is recorded
            inv.info(_reason(exc))
            return
        if got is None:
            inv.info("the broker plugin cannot tell this node's holdings")
        else:
            inv.ok({"entries": [[offset, msg_id] for offset, msg_id in got]})

    await asyncio.gather(*(one(n, q) for q in queues for n in nodes))


def node_holdings_reader(plugin: BrokerPlugin, nodes: Mapping[str, NodeHandle]) -> NodeHoldings | None:
    """The plugin's ``node_holdings`` as the harness calls it after the drain (awaitable, by node
    name, off the event loop like ``queue_depth``); None when the plugin does not implement it."""
    if getattr(type(plugin), "node_holdings", None) is BrokerPlugin.node_holdings:
        return None

    async def held(node: str, queue: str) -> list[tuple[int | None, str]] | None:
        return await asyncio.to_thread(plugin.node_holdings, nodes[node], queue)

    return held


def queue_holders_reader(plugin: BrokerPlugin, nodes: Mapping[str, NodeHandle]) -> QueueHolders:
    """The plugin's ``queue_holders`` as the drain calls it (awaitable, by node name, off the loop)."""

    async def holders(node: str, queue: str) -> list[dict[str, Any]] | None:
        return await asyncio.to_thread(plugin.queue_holders, nodes[node], queue)

    return holders


def queue_replicas_reader(plugin: BrokerPlugin, nodes: Mapping[str, NodeHandle]) -> QueueReplicas | None:
    """The plugin's ``queue_replicas`` as a drain calls it (awaitable, by node name, off the loop);
    None when the plugin does not implement it."""
    if getattr(type(plugin), "queue_replicas", None) is BrokerPlugin.queue_replicas:
        return None

    async def replicas(node: str, queue: str) -> set[str] | None:
        return await asyncio.to_thread(plugin.queue_replicas, nodes[node], queue)

    return replicas
