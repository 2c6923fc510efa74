"""Disk faults take effect inside a real node: the reference broker (flush: sync, data on lazyfs)
waits out a slow fsync before it confirms, loses what a lying fsync acknowledged when the power
goes, and meets EIO and ENOSPC, which its own log names."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiormq
import pytest

from faults.disk import DiskError, DiskFull, FsyncLie, SlowFsync
from faults.process import PowerLoss, heal_processes
from harness.host import Host
from harness.runner import running_cluster
from harness.scenario import from_dict
from harness.spec import Fault, FaultContext

pytestmark = pytest.mark.docker

QUEUE = "chaos-disk-probe"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    sc = from_dict(
        {
            "name": "disk-probe",
            "broker": {"plugin": "reference", "nodes": 1, "lazyfs": True, "settings": {"flush": "sync"}},
        }
    )
    with running_cluster(Host.load(), sc) as c:
        yield c


def url(cluster: Any) -> str:
    host, port = cluster.client_endpoints()["n1"]
    return f"amqp://guest:guest@{host}:{port}/"


async def _publish(cluster: Any, bodies: list[bytes]) -> list[tuple[bytes, str, float]]:
    """Publish one at a time with confirms: (body, ack|nack|error text, seconds to the answer)."""
    out = []
    conn = await aiormq.connect(url(cluster))
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.queue_declare(QUEUE, durable=True)
        for body in bodies:
            t = time.monotonic()
            try:
                async with asyncio.timeout(15):
                    r = await ch.basic_publish(
                        body, routing_key=QUEUE, properties=aiormq.spec.Basic.Properties(delivery_mode=2)
                    )
                outcome = "ack" if isinstance(r, aiormq.spec.Basic.Ack) else "nack"
            except Exception as exc:  # noqa: BLE001 - a refused publish is an outcome here
                outcome = f"error: {type(exc).__name__}: {exc}"
            out.append((body, outcome, time.monotonic() - t))
            if outcome.startswith("error"):
                break
    finally:
        if not conn.is_closed:
            await conn.close()
    return out


async def _read_all(cluster: Any) -> set[bytes]:
    conn = await aiormq.connect(url(cluster))
    got: set[bytes] = set()
    try:
        ch = await conn.channel()
        while True:
            msg = await ch.basic_get(QUEUE, no_ack=True)
            if msg.body is None or not isinstance(msg.delivery, aiormq.spec.Basic.GetOk):
                return got
            got.add(msg.body)
    finally:
        await conn.close()


def publish(cluster: Any, tag: str, n: int) -> list[tuple[bytes, str, float]]:
    return asyncio.run(_publish(cluster, [f"{tag}-{i}".encode() for i in range(n)]))


def fault(cluster: Any, cls: type[Fault], params: dict[str, Any], fid: str) -> Fault:
    import random

    return cls(FaultContext(cluster), cls.resolve(params, ["n1"], random.Random(fid)), fid)


def broker_log(cluster: Any) -> str:
    return str(cluster.nodes["n1"].container.logs().decode(errors="replace"))


def test_disk_faults_reach_the_broker(cluster: Any) -> None:
    base = publish(cluster, "base", 5)
    assert [o for _, o, _ in base] == ["ack"] * 5

    # Slow fsync: with flush: sync each confirm waits for its own fsync, so for the delay too.
    slow = fault(cluster, SlowFsync, {"nodes": "all", "delay_ms": 250}, "f1")
    slow.apply()
    waited = publish(cluster, "slow", 4)
    counts = slow.heal()["nodes"]["n1"]
    assert [o for _, o, _ in waited] == ["ack"] * 4
    assert min(s for _, _, s in waited) >= 0.25, waited
    assert counts["hits"] >= 4 and counts["delayed_ms_total"] >= 1000

    # A lying fsync, then a power cut: what the broker confirmed meanwhile is gone.
    lie = fault(cluster, FsyncLie, {"nodes": "all"}, "f2")
    lie.apply()
    lied = publish(cluster, "lied", 10)
    assert [o for _, o, _ in lied] == ["ack"] * 10
    cut = fault(cluster, PowerLoss, {"node": "n1"}, "f3")
    dropped = cut.apply()["nodectl"]["lazyfs"]["dropped_bytes"]
    assert dropped > 0
    cut.heal()
    assert lie.heal()["nodes"]["n1"]["unsynced_bytes_lied_about"] > 0
    kept = asyncio.run(_read_all(cluster))
    assert {b for b, _, _ in base + waited} <= kept, "honestly fsynced messages survive"
    assert not kept & {b for b, _, _ in lied}, "every message confirmed under the lie is lost"

    # EIO on the commit log, then a full disk that df does not show (so no disk alarm blocks
    # publishers first): the broker refuses (or stops), and its own log names the error.
    for fid, cls, params, error in (
        ("f4", DiskError, {}, "Input/output error"),
        ("f5", DiskFull, {"df": False}, "No space left on device"),
    ):
        f = fault(cluster, cls, {"nodes": "all", "files": "store/commitlog/*", **params}, fid)
        f.apply()
        refused = publish(cluster, fid, 3)
        assert refused and all(o != "ack" for _, o, _ in refused), (fid, refused)
        assert f.heal()["nodes"]["n1"]["hits"] >= 1
        assert error in broker_log(cluster)
        heal_processes(cluster)
    assert [o for _, o, _ in publish(cluster, "after", 3)] == ["ack"] * 3
