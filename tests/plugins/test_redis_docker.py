"""The Redis plugin on a real 3-node cluster with Sentinel (Debian's redis-server 7.0): the driver
finds the primary by asking Sentinel, publishes and drains through it, every node's own copy of
the stream holds what was confirmed, and after a failover the driver follows the new primary while
the drain skips the replicas, and an ordered reader goes on from its last entry id there."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from harness.drain import run_drain
from harness.history import Recorder, read_jsonl
from harness.host import Host
from harness.runner import running_cluster
from harness.scenario import WorkloadSection, from_dict
from harness.spec import NodeHandle
from plugins.redis import SENTINEL_PORT, Redis, cli
from plugins.redis.client import MASTER_NAME, RedisDriver
from tests.polling import until, until_async

pytestmark = pytest.mark.docker

QUEUE = "chaos-1"
SETTINGS = {"sentinel": True, "appendfsync": "always", "down_after_ms": 2000, "failover_timeout_ms": 5000}


async def _publish(driver: RedisDriver, process: str, ids: range) -> None:
    """Publish ``ids`` one by one through the primary Sentinel names, each confirmed."""
    node = await driver.primary(process)
    assert node is not None
    conn = await driver.connect(node)
    try:
        for i in ids:
            msg_id = f"{process}:{i}"
            inv = driver.recorder.invoke(process, "publish", node=node, queue=QUEUE, value=msg_id)
            assert await driver._publish_one(conn, inv, QUEUE, msg_id) == "ok"
    finally:
        await conn.aclose()


async def _drain(driver: RedisDriver, process: str) -> int:
    """The harness's drain rounds over the driver's reader, through every node."""
    reader = driver.drain_reader(process, QUEUE)
    return await run_drain(
        reader, driver.recorder, process, QUEUE, driver.nodes, timeout=driver.w.drain_timeout
    )


def test_sentinel_primary_drain_holdings_and_failover(tmp_path: Path) -> None:
    host = Host.load()
    if "redis" not in host.registry.brokers:  # not installed as an entry point: load the module
        host = Host.load(["plugins.redis"])
    scenario = from_dict({"name": "redis", "broker": {"plugin": "redis", "nodes": 3, "settings": SETTINGS}})
    plugin = host.broker("redis")
    assert isinstance(plugin, Redis)
    settings = plugin.validate_settings(scenario.broker.settings)
    with running_cluster(host, scenario) as cluster:
        rec = Recorder(tmp_path / "history.jsonl")
        w = WorkloadSection(message_size=128, drain_idle=0.5, drain_timeout=60, confirm_timeout=5)
        driver = RedisDriver(
            cluster.endpoints(), rec, workload=w, seed=5, client_settings=plugin.client_settings(settings)
        )
        nodes = cluster.nodes

        async def first() -> tuple[str | None, int]:
            await driver.setup([QUEUE])
            primary = await driver.primary("p1")
            await _publish(driver, "p1", range(1, 21))
            return primary, await _drain(driver, "d1")

        primary, drained = asyncio.run(first())
        assert primary == "n1" and drained == 20
        _assert_every_node_holds_the_first_20(plugin, nodes)

        # A failover Sentinel carries out: the driver asks again and follows the new primary, and
        # a reader that read the 20 entries on n1 goes on from the last of them there.
        async def second() -> tuple[str | None, int]:
            stop = asyncio.Event()
            reader = asyncio.create_task(driver.read("r1", QUEUE, stop))
            await until_async(lambda: rec.counts.get(("read", "ok"), 0) >= 20, "r1 to read the 20 entries")
            await asyncio.to_thread(_failover, nodes)
            new = await driver.primary("p2")
            await _publish(driver, "p2", range(1, 11))
            drained = await _drain(driver, "d2")
            stop.set()
            await reader
            return new, drained

        new, drained = asyncio.run(second())
        assert new in ("n2", "n3") and drained == 10
    rec.close()
    ops = list(read_jsonl(tmp_path / "history.jsonl"))
    _assert_publishes_and_the_drain_follow(ops, new)
    _assert_the_reader_went_on_from_where_it_was(ops, new)


def _assert_every_node_holds_the_first_20(plugin: Redis, nodes: Mapping[str, NodeHandle]) -> None:
    """Every node's own copy of the stream holds p1's 20 entries, in order, at rising offsets; none pending."""
    until(
        lambda: all(len(plugin.node_holdings(nodes[n], QUEUE) or []) == 20 for n in nodes),
        "every replica to hold the 20 entries",
        every=0.2,
    )
    copies = {n: plugin.node_holdings(nodes[n], QUEUE) for n in nodes}
    assert copies["n1"] == copies["n2"] == copies["n3"]
    assert [i for _o, i in copies["n1"] or []] == [f"p1:{i}" for i in range(1, 21)]
    offsets = [o for o, _i in copies["n1"] or [] if o is not None]
    assert offsets == sorted(offsets) and len(set(offsets)) == 20
    assert plugin.queue_depth(nodes["n1"], QUEUE, timeout=15) == (0, 0)


def _failover(nodes: Mapping[str, NodeHandle]) -> None:
    """Sentinel moves the primary off n1, and n1 follows the new one."""
    cli(nodes["n2"], "SENTINEL", "FAILOVER", MASTER_NAME, port=SENTINEL_PORT)

    def moved() -> bool:
        out = cli(nodes["n2"], "SENTINEL", "get-master-addr-by-name", MASTER_NAME, port=SENTINEL_PORT)
        return out.split()[0] != "n1"

    until(moved, "Sentinel to name a new primary", every=0.2)
    until(
        lambda: cli(nodes["n1"], "ROLE").split()[0] == "slave",
        "the old primary to follow the new one",
        every=0.2,
    )


def _assert_publishes_and_the_drain_follow(ops: list[dict[str, Any]], new: str | None) -> None:
    """p2 published to the new primary only; the drain saw it as primary and the others as replicas."""
    publishes = [op for op in ops if op["f"] == "publish" and op["type"] == "ok"]
    sent = [op for op in ops if op["f"] == "publish" and op["type"] == "invoke"]
    assert {op["node"] for op in sent if op["process"] == "p2"} == {new} and len(publishes) == 30
    assert all(json.loads(op["detail"])["stream_seq"] > 0 for op in publishes)
    drain = json.loads(
        next(op["value"] for op in ops if op["f"] == "drain" and op["process"] == "d2" and op["type"] == "ok")
    )
    roles = {n: v["role"] for n, v in drain["nodes"].items()}
    assert roles[new] == "primary" and sorted(r for n, r in roles.items() if n != new) == [
        "replica",
        "replica",
    ]
    assert sorted(drain["no_copy"]) == sorted(n for n in roles if n != new)
    assert drain["offsets"] == "sparse"


def _assert_the_reader_went_on_from_where_it_was(ops: list[dict[str, Any]], new: str | None) -> None:
    """The reader: every entry once, in order, the first 20 on n1; Sentinel's failover cut its
    connection, and it went on from where it was on the new primary."""
    steps = [op for op in ops if op["process"] == "r1" and op["type"] == "ok"]
    reads = [
        (op["value"], json.loads(op["detail"])["stream_seq"], op["node"]) for op in steps if op["f"] == "read"
    ]
    assert [v for v, _o, _n in reads] == [f"p1:{i}" for i in range(1, 21)] + [f"p2:{i}" for i in range(1, 11)]
    assert [o for _v, o, _n in reads] == sorted({o for _v, o, _n in reads})
    assert {n for _v, _o, n in reads[:20]} == {"n1"} and {n for _v, _o, n in reads[20:]} == {new}
    seeks = [json.loads(op["detail"])["stream_seq"] for op in steps if op["f"] == "seek"]
    assert seeks and all(s == reads[19][1] + 1 for s in seeks)
