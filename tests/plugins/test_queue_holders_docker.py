"""``queue_holders`` of the RabbitMQ plugin on a real three-node cluster.

A consumer connected to n2 holds deliveries of a queue mastered on n1 unacked. n2
lists that channel with its unacked count and the queue's consumer on it; n1
lists the consumer (the queue's) but not the channel (n2's). Once the consumer's
connection closes, no node lists a consumer or that channel any more.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq
import pytest

from harness.host import Host
from harness.runner import running_cluster
from harness.scenario import from_dict
from harness.workload import queue_holders_reader
from tests.polling import until_async

pytestmark = pytest.mark.docker

QUEUE = "chaos-holders"
HELD = 4
TOTAL = 10


def channels(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "channel" in r]


def consumers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "consumer_tag" in r]


def test_holders_list_the_channel_that_holds_deliveries_until_it_closes() -> None:
    host = Host.load()
    settings = {"ha_mode": "all", "ha_sync_mode": "automatic"}
    scenario = from_dict(
        {"name": "holders", "broker": {"plugin": "rabbitmq", "nodes": 3, "settings": settings}}
    )
    plugin = host.broker("rabbitmq")
    with running_cluster(host, scenario) as cluster:
        endpoints = cluster.client_endpoints()
        holders = queue_holders_reader(plugin, cluster.nodes)

        def url(node: str) -> str:
            h, p = endpoints[node]
            return f"amqp://guest:guest@{h}:{p}/"

        async def go() -> None:
            setup = await aiormq.connect(url("n1"))  # the queue's master is on n1
            sch = await setup.channel()
            await sch.queue_declare(QUEUE, durable=True)
            for i in range(TOTAL):
                await sch.basic_publish(f"m{i}".encode(), routing_key=QUEUE)
            await setup.close()

            holder = await aiormq.connect(url("n2"))
            hch = await holder.channel()
            await hch.basic_qos(prefetch_count=HELD)
            got: list[Any] = []

            async def keep(message: Any) -> None:
                got.append(message)

            ok = await hch.basic_consume(QUEUE, keep)

            async def holding() -> bool:
                return len(got) == HELD

            await until_async(holding, f"the consumer holds {HELD} deliveries", every=0.2)

            on_n2 = await holders("n2", QUEUE)
            assert on_n2 is not None
            assert on_n2[0] == {"queue": QUEUE, "consumers": 1}
            [ch] = channels(on_n2)
            assert ch["messages_unacknowledged"] == HELD and ch["consumer_count"] == 1, on_n2
            assert ch["pid"].startswith("<rabbit@n2.") and ch["user"] == "guest", on_n2
            [c] = consumers(on_n2)
            assert c["consumer_tag"] == ok.consumer_tag and c["channel_pid"] == ch["pid"], on_n2
            assert c["ack_required"] is True and c["prefetch_count"] == HELD, on_n2

            on_n1 = await holders("n1", QUEUE)
            assert on_n1 is not None
            assert on_n1[0] == {"queue": QUEUE, "consumers": 1} and channels(on_n1) == [], on_n1
            assert [r["channel_pid"] for r in consumers(on_n1)] == [ch["pid"]], on_n1

            await holder.close()

            async def released() -> bool:
                rows = [await holders(n, QUEUE) for n in sorted(cluster.nodes)]
                return all(r == [{"queue": QUEUE, "consumers": 0}] for r in rows)

            await until_async(released, "no node lists a consumer or a channel", every=0.5)

        asyncio.run(go())
