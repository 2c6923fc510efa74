"""A mirror whose copy diverged from the master's is not in sync, even with the same number of messages.

The literal case: the master holds A and C, the mirror A and B (it got B where
the master had C). Both hold two messages. The master fetches A then C; the
mirror's second fetch takes B, the digests differ, it requeues B. "Equal depth"
calls that mirror in sync, and promotion and confirms would trust a copy that
lacks C. The mirror here is a real ``Mirror`` replaying the master's operations
on a real backing queue; only what it is handed of the node (GM, links) is a recorder.
"""

from __future__ import annotations

import asyncio
import hashlib
from functools import partial
from typing import Any

from pamqp import commands

from broker_impl.backing import make_backing_queue
from broker_impl.cluster.config import ClusterConfig
from broker_impl.cluster.mirror import Mirror, Site, digest
from broker_impl.message import Message
from tests.polling import until_async


class _Endpoint:
    ring: list[str] = []

    def join(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Transport:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, peer: str, msg: dict[str, Any]) -> bool:
        self.sent.append(msg)
        return True


class _Gm:
    def endpoint(self, group: str, **_callbacks: Any) -> _Endpoint:
        return _Endpoint()


def _site(transport: _Transport) -> Site:
    """What a Mirror is handed of its node: tasks, a GM endpoint, a link to the master, backing queues
    with no store."""
    return Site(
        ClusterConfig("n2"),
        transport,  # type: ignore[arg-type]
        _Gm(),  # type: ignore[arg-type]
        lambda coro: asyncio.get_running_loop().create_task(coro),
        mirrors={},
        reconcile_mirrors=lambda: None,
        local_changed=lambda: None,
        backing=lambda key, durable: make_backing_queue(key, durable, None, ram_budget_bytes=1 << 20),
    )


def _acked(transport: _Transport, n: int) -> bool:
    return any(m.get("n") == n for m in transport.sent)


def fingerprint(m: Message) -> int:
    """A message's share of the content fingerprint the master broadcasts (summed mod 2**64): an 8-byte
    BLAKE2b of its stored form without the node-local id."""
    return int.from_bytes(hashlib.blake2b(m.to_bytes()[8:], digest_size=8).digest(), "big")


def _msg(body: bytes) -> Message:
    return Message("", "q", commands.Basic.Properties(delivery_mode=1), body)


async def _replay() -> list[dict[str, Any]]:
    transport = _Transport()
    mirror = Mirror(_site(transport), "/", "q", "n1", False, "g", "n1/m")
    a, b, c = _msg(b"A"), _msg(b"B"), _msg(b"C")
    master_fp = (fingerprint(a) + fingerprint(c)) & ((1 << 64) - 1)  # the master holds A and C
    ops: list[tuple[dict[str, Any], bytes]] = [
        ({"op": "start", "n": -1, "depth": -1}, b""),
        ({"op": "pub", "n": 1, "depth": 1, "fp": fingerprint(a)}, a.to_bytes()),
        (
            {"op": "pub", "n": 2, "depth": 2, "fp": master_fp},
            b.to_bytes(),
        ),  # the mirror got B, the master has C
        ({"op": "fetch", "n": 3, "depth": 2, "fp": master_fp, "seq": 0, "d": digest(a)}, b""),
        (
            {"op": "fetch", "n": 4, "depth": 2, "fp": master_fp, "seq": 1, "d": digest(c)},
            b"",
        ),  # mismatch: B here
    ]
    for batch, last in ((ops[:2], 1), (ops[2:], 4)):  # A alone first (in sync on both sides), then the rest
        for h, blob in batch:
            mirror.feed({"vh": "/", "q": "q", **h}, blob)
        await until_async(partial(_acked, transport, last), f"the mirror's ack of op {last}", every=0.005)
    await mirror.discard()
    return [m for m in transport.sent if m.get("t") == "mq_ack"]


def test_a_diverged_mirror_with_the_masters_depth_is_not_in_sync() -> None:
    acks = asyncio.run(_replay())
    by_n = {m["n"]: m["synced"] for m in acks}
    assert by_n.get(1) is True  # A on both: in sync
    assert by_n.get(4) is False, f"diverged copy reported in sync: {acks}"
