"""``queue_depth`` on real clusters, and the drain that relies on it.

A connection nobody closed holds deliveries unacked on the queue's master. A
passive declare counts only ready messages, so a drain that trusted it would
call the queue empty while those deliveries were still out. The drain asks every
node for ready and unacked and waits.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiormq
import pytest
from aiormq.abc import AbstractConnection
from pamqp import commands as spec

from harness.history import Recorder, read_jsonl
from harness.host import Host
from harness.runner import running_cluster
from harness.scenario import WorkloadSection, from_dict
from harness.spec import Endpoint, HeldTotal
from harness.spec.history import message_body
from harness.workload import depth_timeout, drain_queue, queue_depth_reader
from plugins.amqp091.client import AmqpDriver
from tests.polling import until_async

pytestmark = pytest.mark.docker

SEED = 3
SIZE = 128
QUEUE = "chaos-1"
HELD = 5
IDS = [f"p1:{i}" for i in range(1, 31)]

CLUSTERS = {
    "reference": {"ha_mode": "all", "ha_sync_mode": "automatic"},
    "rabbitmq": {"ha_mode": "all", "ha_sync_mode": "automatic"},
}


def url(ep: Endpoint) -> str:
    return f"amqp://guest:guest@{ep.host}:{ep.port}/"


@pytest.mark.parametrize("plugin_name", sorted(CLUSTERS))
def test_the_drain_waits_for_deliveries_another_connection_holds(tmp_path: Path, plugin_name: str) -> None:
    host = Host.load()
    scenario = from_dict(
        {"name": "depth", "broker": {"plugin": plugin_name, "nodes": 3, "settings": CLUSTERS[plugin_name]}}
    )
    plugin = host.broker(plugin_name)
    settings = plugin.validate_settings(scenario.broker.settings)
    with running_cluster(host, scenario) as cluster:
        endpoints = {n: Endpoint(n, *ep) for n, ep in cluster.client_endpoints().items()}
        depth = queue_depth_reader(plugin, cluster.nodes, depth_timeout(scenario.workload.drain_timeout, 3))
        seen: list[tuple[str, tuple[int, int] | HeldTotal | None]] = []

        async def watched(node: str, queue: str) -> tuple[int, int] | HeldTotal | None:
            got = await depth(node, queue)
            seen.append((node, got))
            return got

        rec = Recorder(tmp_path / "history.jsonl")
        w = WorkloadSection(prefetch=10, message_size=SIZE, drain_idle=1.0, drain_timeout=240)
        driver = AmqpDriver(
            endpoints,
            rec,
            workload=w,
            seed=SEED,
            queue_depth=watched,
            queue_arguments=plugin.queue_arguments(settings),
        )
        released: list[int] = []

        async def go() -> None:
            await driver.setup([QUEUE])  # through n1: the queue's master is there
            await _publish_confirmed(endpoints["n1"])
            # The holder consumes through n2 and never acks.
            holder = await _hold_deliveries(endpoints["n2"])
            for node in cluster.nodes:  # every node that can tell says what the master holds
                assert await depth(node, QUEUE) in (None, (len(IDS) - HELD, HELD))
            assert await depth("n1", QUEUE) == (len(IDS) - HELD, HELD)

            task = asyncio.create_task(
                drain_queue(driver, "d1", QUEUE, driver.nodes, driver.w, driver.recorder)
            )

            async def waiting() -> bool:
                return sum(1 for _n, d in seen if isinstance(d, tuple) and d[1] > 0) >= 2

            await until_async(waiting, "the drain saw the held deliveries twice", every=0.2)
            assert not task.done(), "the drain ended while deliveries were still held"
            released.append(rec.now_ns())
            await holder.close()
            assert await task == len(IDS)
            rec.close()

        asyncio.run(go())

    _assert_the_held_came_back_once_released(list(read_jsonl(tmp_path / "history.jsonl")), released[0])


async def _publish_confirmed(endpoint: Endpoint) -> None:
    """Every id, persistent, through ``endpoint``; each confirmed."""
    pub = await aiormq.connect(url(endpoint))
    ch = await pub.channel()
    for msg_id in IDS:
        confirm = await ch.basic_publish(
            message_body(msg_id, SEED, SIZE),
            routing_key=QUEUE,
            properties=spec.Basic.Properties(delivery_mode=2, message_id=msg_id),
        )
        assert isinstance(confirm, spec.Basic.Ack)
    await pub.close()


async def _hold_deliveries(endpoint: Endpoint) -> AbstractConnection:
    """A connection that takes ``HELD`` deliveries and never acks them: returned open, holding them."""
    holder = await aiormq.connect(url(endpoint))
    hch = await holder.channel(publisher_confirms=False)
    await hch.basic_qos(prefetch_count=HELD)
    got: list[Any] = []

    async def keep(message: Any) -> None:
        got.append(message)

    await hch.basic_consume(QUEUE, keep)

    async def holding() -> bool:
        return len(got) == HELD

    await until_async(holding, f"the holder has {HELD} deliveries", every=0.2)
    return holder


def _assert_the_held_came_back_once_released(records: list[dict[str, Any]], released_ns: int) -> None:
    """Every id acked; the held ones only after the holder let go, redelivered; the drain saw every node empty."""
    acks = {r["value"]: r for r in records if r["f"] == "ack" and r["type"] == "ok"}
    assert sorted(acks) == sorted(IDS)
    late = [i for i in IDS if acks[i]["time_ns"] > released_ns]
    assert len(late) == HELD  # what the holder had came back only once it let go
    assert all(
        any(r["f"] == "consume" and r["value"] == i and r["redelivered"] for r in records) for i in late
    )
    drain = [r for r in records if r["f"] == "drain"]
    assert [r["type"] for r in drain] == ["invoke", "ok"]
    view = json.loads(drain[1]["value"])["nodes"]
    assert set(view) == {"n1", "n2", "n3"}
    for v in view.values():
        assert (
            v["ready"] == 0
            and v["unacked"] in (0, None)
            and v["error"] is None
            and v["empty_at_ns"] is not None
        )
    assert view["n1"]["unacked"] == 0
