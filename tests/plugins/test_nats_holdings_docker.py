"""``node_holdings`` of the NATS plugin on a real 3-node JetStream cluster (nats-server 2.9.10).

Each node's holdings come from its own files: with one replica's broker killed, the records
published afterwards are held by the two running replicas and not by the stopped one, which
no read through the JetStream API (answered by the stream's leader) could show.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from faults.process import nodectl
from tests.plugins.nats_docker import STREAM, publish, three_replicas
from tests.polling import until

pytestmark = pytest.mark.docker


def test_each_node_reports_its_own_copy() -> None:
    with three_replicas("holdings") as (plugin, cluster):
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
