"""``node_holdings`` of the NATS plugin on a real 3-node JetStream cluster (nats-server 2.9.10).

Each node's holdings come from its own files: with one replica's broker killed, the records
published afterwards are held by the two running replicas and not by the stopped one, which
no read through the JetStream API (answered by the stream's leader) could show.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import nats
import pytest
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from faults.process import nodectl
from harness.host import Host
from harness.runner import running_cluster
from harness.scenario import from_dict
from plugins.nats.client import ID_HEADER
from tests.polling import until

pytestmark = pytest.mark.docker

STREAM = "chaos-1"


async def publish(host: str, port: int, ids: list[str], replicas: int) -> dict[int, str]:
    """Publish ``ids`` (creating the stream first); stream sequence -> id from the acks."""
    nc = await nats.connect(f"nats://{host}:{port}", user="guest", password="guest", allow_reconnect=False)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(
            StreamConfig(
                name=STREAM,
                subjects=[STREAM],
                storage=StorageType.FILE,
                num_replicas=replicas,
                retention=RetentionPolicy.LIMITS,
            )
        )
        acks = {}
        for msg_id in ids:
            ack = await js.publish(
                STREAM, f"{msg_id}|body".encode(), stream=STREAM, headers={ID_HEADER: msg_id}
            )
            acks[int(ack.seq)] = msg_id
        return acks
    finally:
        await nc.close()


def test_each_node_reports_its_own_copy() -> None:
    host = Host.load()
    scenario = from_dict(
        {"name": "holdings", "broker": {"plugin": "nats", "nodes": 3, "settings": {"replicas": 3}}}
    )
    plugin = host.broker("nats")
    with running_cluster(host, scenario) as cluster:
        nodes: dict[str, Any] = cluster.nodes
        (h, port) = cluster.client_endpoints()["n1"]
        first = asyncio.run(publish(h, port, [f"p1:{i}" for i in range(1, 31)], 3))
        want = sorted(first.items())
        assert [s for s, _ in want] == list(range(1, 31))

        def holds(name: str, entries: list[tuple[int, str]]) -> bool:
            return plugin.node_holdings(nodes[name], STREAM) == entries

        for name in nodes:
            until(functools.partial(holds, name, want), f"{name} holds the 30 records")
        assert plugin.node_holdings(nodes["n1"], "chaos-9") is None  # no such stream on the node

        nodectl(nodes["n3"], "crash")
        more = asyncio.run(publish(h, port, [f"p1:{i}" for i in range(31, 41)], 3))
        both = sorted({**first, **more}.items())
        for name in ("n1", "n2"):
            until(functools.partial(holds, name, both), f"{name} holds all 40")
        assert plugin.node_holdings(nodes["n3"], STREAM) == want  # read from its files, broker down

        nodectl(nodes["n3"], "start")
        cluster.wait_ready(["n3"])
        until(functools.partial(holds, "n3", both), "n3 caught up")
