"""What the NATS plugin's Docker tests share: a 3-node JetStream cluster with 3 replicas, a
publish through n1's client endpoint that creates the stream first, and what a node's own files
hold of the stream."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import nats
import nats.errors
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from harness.host import Host
from harness.runner import running_cluster
from harness.scenario import from_dict
from plugins.nats.client import ID_HEADER

STREAM = "chaos-1"
T = TypeVar("T")
PUBLISH_ATTEMPTS = 6  # of 10 s each: a stream without a leader for a minute is a real failure


async def publish(host: str, port: int, ids: list[str], replicas: int) -> dict[int, str]:
    """Publish ``ids`` (creating the stream first); stream sequence -> id from the acks."""
    nc = await nats.connect(f"nats://{host}:{port}", user="guest", password="guest", allow_reconnect=False)
    try:
        js = nc.jetstream(timeout=10)
        config = StreamConfig(
            name=STREAM,
            subjects=[STREAM],
            storage=StorageType.FILE,
            num_replicas=replicas,
            retention=RetentionPolicy.LIMITS,
        )
        await retried(lambda: js.add_stream(config))  # the same config again: no change
        acks = {}
        for msg_id in ids:
            # Sent again under the same Nats-Msg-Id after a timeout, JetStream stores it once (a
            # retry of one that was stored gets the first one's sequence back).
            headers = {ID_HEADER: msg_id, "Nats-Msg-Id": msg_id}
            body = f"{msg_id}|body".encode()
            ack = await retried(functools.partial(js.publish, STREAM, body, stream=STREAM, headers=headers))
            acks[int(ack.seq)] = msg_id
        return acks
    finally:
        await nc.close()


@dataclass
class Replicated:
    """The nats plugin and a running 3-node cluster whose streams have 3 replicas."""

    plugin: Any
    cluster: Any

    @property
    def nodes(self) -> dict[str, Any]:
        return self.cluster.nodes

    def publish(self, seqs: range) -> dict[int, str]:
        """Publish ``p1:i`` for each i of ``seqs`` through n1; stream sequence -> id."""
        host, port = self.cluster.client_endpoints()["n1"]
        return asyncio.run(publish(host, port, [f"p1:{i}" for i in seqs], 3))

    def holds(self, node: str, entries: list[tuple[int, str]]) -> bool:
        """Whether ``node``'s own files hold exactly ``entries`` (sequence, id) of the stream."""
        return self.plugin.node_holdings(self.nodes[node], STREAM) == entries


@contextmanager
def three_replicas(name: str) -> Iterator[Replicated]:
    """A running 3-node cluster whose streams have 3 replicas, stopped after."""
    host = Host.load()
    scenario = from_dict(
        {"name": name, "broker": {"plugin": "nats", "nodes": 3, "settings": {"replicas": 3}}}
    )
    with running_cluster(host, scenario) as cluster:
        yield Replicated(host.broker("nats"), cluster)


async def retried(request: Callable[[], Awaitable[T]]) -> T:
    """``request()`` again while it times out: right after a node's crash the stream or the meta
    group may be electing a leader."""
    for attempt in range(PUBLISH_ATTEMPTS):
        try:
            return await request()
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            if attempt == PUBLISH_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
