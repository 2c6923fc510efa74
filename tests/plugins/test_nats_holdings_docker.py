"""``node_holdings`` of the NATS plugin on a real 3-node JetStream cluster (nats-server 2.9.10).

Each node's holdings come from its own files: with one replica's broker killed, the records
published afterwards are held by the two running replicas and not by the stopped one, which
no read through the JetStream API (answered by the stream's leader) could show.
"""

from __future__ import annotations

import functools

import pytest

from faults.process import nodectl
from tests.plugins.nats_docker import STREAM, three_replicas
from tests.polling import until

pytestmark = pytest.mark.docker


def test_each_node_reports_its_own_copy() -> None:
    with three_replicas("holdings") as r:
        first = r.publish(range(1, 31))
        want = sorted(first.items())
        assert [s for s, _ in want] == list(range(1, 31))
        for name in r.nodes:
            until(functools.partial(r.holds, name, want), f"{name} holds the 30 records")
        assert r.plugin.node_holdings(r.nodes["n1"], "chaos-9") is None  # no such stream on the node

        nodectl(r.nodes["n3"], "crash")
        more = r.publish(range(31, 41))
        both = sorted({**first, **more}.items())
        for name in ("n1", "n2"):
            until(functools.partial(r.holds, name, both), f"{name} holds all 40")
        assert r.plugin.node_holdings(r.nodes["n3"], STREAM) == want  # read from its files, broker down

        nodectl(r.nodes["n3"], "start")
        r.cluster.wait_ready(["n3"])
        until(functools.partial(r.holds, "n3", both), "n3 caught up")
