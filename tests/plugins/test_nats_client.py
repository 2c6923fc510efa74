"""The NATS JetStream driver against real ``nats-server`` processes on loopback (no Docker).

Three servers form a JetStream cluster with routes on 127.0.0.1 and the same
accounts as the plugin's nodes (``APP`` for the workload, ``SYS`` for the replica
views). Skipped where ``nats-server`` is not installed (``apt-get install -y
nats-server``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
import pytest

from harness.history import Recorder, read_jsonl
from harness.scenario import ConsumerSection, WorkloadSection
from harness.spec import Endpoint
from harness.spec.client import DrainUnfinished
from harness.spec.history import body_digest, message_body
from harness.workload import drain_queue
from plugins.nats import SYSTEM_USER
from plugins.nats.client import CONSUMER, NatsDriver
from tests.polling import until, until_async
from tests.ports import free_ports

SEED = 23
SIZE = 128
QUEUE = "chaos-1"

pytestmark = pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server is not installed")


class Server:
    def __init__(self, root: Path, name: str, port: int, route: int, monitor: int, routes: list[int]) -> None:
        self.name, self.port, self.monitor = name, port, monitor
        self.dir = root / name
        self.dir.mkdir()
        user, password = SYSTEM_USER
        self.conf = self.dir / "nats.conf"
        self.conf.write_text(
            "\n".join(
                [
                    f"server_name: {name}",
                    f"listen: 127.0.0.1:{port}",
                    f"http: 127.0.0.1:{monitor}",
                    f'jetstream {{ store_dir: "{self.dir / "js"}", max_file_store: 256M, max_memory_store: 16M }}',
                    "accounts {",
                    '  APP: { jetstream: enabled, users: [{user: "guest", password: "guest"}] }',
                    f'  SYS: {{ users: [{{user: "{user}", password: "{password}"}}] }}',
                    "}",
                    "system_account: SYS",
                    f'cluster {{ name: "test", listen: "127.0.0.1:{route}", no_advertise: true,',
                    "  routes: [" + ", ".join(f'"nats-route://127.0.0.1:{r}"' for r in routes) + "] }",
                    "",
                ]
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["nats-server", "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "log", "ab"),
        )  # noqa: SIM115

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def endpoint(self) -> Endpoint:
        return Endpoint(self.name, "127.0.0.1", self.port)

    def healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Server]]:
    ports = free_ports(9)
    routes = ports[3:6]
    servers = [
        Server(
            tmp_path, f"n{i + 1}", ports[i], routes[i], ports[6 + i], [r for r in routes if r != routes[i]]
        )
        for i in range(3)
    ]
    for s in servers:
        s.start()
    try:
        until(
            lambda: all(s.healthy() for s in servers),
            "the local JetStream cluster to be healthy",
            every=0.2,
            gone=lambda: next(
                (f"{s.name} exited" for s in servers if s.proc is None or s.proc.poll() is not None), None
            ),
        )
        yield servers
    finally:
        for s in servers:
            s.stop()


def _driver(servers: list[Server], rec: Recorder, **workload: Any) -> NatsDriver:
    w = WorkloadSection(message_size=SIZE, drain_idle=0.5, drain_timeout=60, confirm_timeout=5, **workload)
    user, password = SYSTEM_USER
    return NatsDriver(
        {s.name: s.endpoint() for s in servers},
        rec,
        workload=w,
        queue_arguments={"replicas": 3, "ack_wait": 3, "system_user": user, "system_password": password},
        seed=SEED,
    )


def _history(path: Path) -> list[dict[str, Any]]:
    return list(read_jsonl(path))


async def _run(driver: NatsDriver, seconds: float, consumers: int = 1) -> int:
    await driver.setup([QUEUE])
    stop_p, stop_c = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(driver.produce("p1", QUEUE, stop_p))]
    tasks += [asyncio.create_task(driver.consume(f"c{i}", QUEUE, stop_c)) for i in range(1, consumers + 1)]
    await asyncio.sleep(seconds)
    stop_p.set()
    await asyncio.sleep(0.5)
    stop_c.set()
    await asyncio.gather(*tasks)
    return await drain_queue(driver, "d1", QUEUE, driver.nodes, driver.w, driver.recorder)


def test_ops_carry_sequences_and_the_drain_sees_every_replica(cluster: list[Server], tmp_path: Path) -> None:
    """Every confirmed publish has its stream sequence; deliveries carry theirs and the body's digest;
    each ack is ok; the drain ends ok with each server's own view of the stream, all equal."""
    rec = Recorder(tmp_path / "h.jsonl")
    driver = _driver(cluster, rec, rate=200, consumer=ConsumerSection(requeue=0.2))
    asyncio.run(_run(driver, 2.0))
    rec.close()
    rows = _history(tmp_path / "h.jsonl")
    published = {
        r["value"]: json.loads(r["detail"])["stream_seq"]
        for r in rows
        if r["f"] == "publish" and r["type"] == "ok"
    }
    assert len(published) > 50
    assert sorted(published.values()) == list(range(1, len(published) + 1))  # one sequence each, no gaps
    deliveries = [r for r in rows if r["f"] == "consume" and r["type"] == "ok"]
    for r in deliveries:
        d = json.loads(r["detail"])
        assert d["stream_seq"] == published[r["value"]]
        assert r["digest"] == body_digest(message_body(r["value"], SEED, SIZE))
        assert r["redelivered"] == (d["delivered"] > 1)
    acked = {r["value"] for r in rows if r["f"] == "ack" and r["type"] == "ok"}
    assert acked == set(published)
    abandons = [r for r in rows if r["f"] == "abandon" and r["type"] != "invoke"]
    assert abandons and all(r["type"] == "ok" for r in abandons)
    assert any(r["redelivered"] for r in deliveries)  # what was nak'd came back flagged
    drain = [r for r in rows if r["f"] == "drain" and r["type"] != "invoke"]
    assert [r["type"] for r in drain] == ["ok"]
    replicas = json.loads(drain[0]["value"])["replicas"]
    assert set(replicas) == {"n1", "n2", "n3"}
    for view in replicas.values():
        assert view["messages"] == len(published) and view["last_seq"] == len(published)


def test_no_stream_is_a_failed_publish_and_a_dead_node_is_left(cluster: list[Server], tmp_path: Path) -> None:
    """A publish no stream answers is ``fail`` (nothing stored it); a producer whose server dies
    records what was open as ``info`` and carries on through another node."""
    rec = Recorder(tmp_path / "h.jsonl")
    driver = _driver(cluster, rec, rate=100)

    async def scenario() -> None:
        conn = await driver.connect("n1")
        inv = rec.invoke("p9", "publish", node="n1", queue="nowhere", value="p9:1")
        assert await driver._publish_one(conn, inv, "nowhere", "p9:1") == "fail"
        await conn.close()
        await driver.setup([QUEUE])
        stop = asyncio.Event()
        task = asyncio.create_task(driver.produce("p1", QUEUE, stop))
        await until_async(
            lambda: rec.counts.get(("publish", "ok"), 0) >= 1, "p1's first confirm (through n1)"
        )
        await asyncio.to_thread(cluster[0].stop)  # p1 starts on n1
        before = rec.counts.get(("publish", "ok"), 0)
        # A stream leader on n1 needs an election first.
        await until_async(
            lambda: rec.counts.get(("publish", "ok"), 0) >= before + 20,
            "20 confirms after n1 stopped",
            every=0.2,
        )
        stop.set()
        await task

    asyncio.run(scenario())
    rec.close()
    rows = _history(tmp_path / "h.jsonl")
    assert [r["type"] for r in rows if r["value"] == "p9:1" and r["type"] != "invoke"] == ["fail"]
    after = [r for r in rows if r["process"] == "p1" and r["type"] == "ok" and r["node"] != "n1"]
    assert after, "the producer never moved off the dead node"
    invokes = sum(r["type"] == "invoke" for r in rows)
    assert invokes == sum(r["type"] != "invoke" for r in rows)  # exactly one completion each


def _unfinished_drain(
    cluster: list[Server], tmp_path: Path, before: Callable[[NatsDriver], Awaitable[None]], timeout: float = 8
) -> dict[str, Any]:
    """The drain's completion after ``before`` broke the queue, with a drain of ``timeout``
    seconds that must not end ok."""
    rec = Recorder(tmp_path / "h.jsonl")
    driver = _driver(cluster, rec, rate=100)

    async def scenario() -> None:
        await driver.setup([QUEUE])
        await before(driver)
        with pytest.raises(DrainUnfinished):
            await drain_queue(driver, "d1", QUEUE, driver.nodes, driver.w, driver.recorder)

    driver.w = WorkloadSection(message_size=SIZE, drain_idle=0.5, drain_timeout=timeout)
    asyncio.run(scenario())
    rec.close()
    drain = [r for r in _history(tmp_path / "h.jsonl") if r["f"] == "drain" and r["type"] != "invoke"]
    assert [r["type"] for r in drain] == ["info"]
    return drain[0]


def test_drain_with_a_node_down_ends_info(cluster: list[Server], tmp_path: Path) -> None:
    """A node that cannot be reached keeps the drain from ending ok: it is ``info``, never a false ok."""

    async def stop_n3(driver: NatsDriver) -> None:
        cluster[2].stop()

    assert "n3" in _unfinished_drain(cluster, tmp_path, stop_n3)["error"]


async def _delete_stream(driver: NatsDriver) -> None:
    conn = await driver.connect("n1")
    await conn.js.delete_stream(QUEUE)
    await conn.close()


NO_STREAM = "the cluster holds no such stream (JetStream: stream not found)"


def test_a_drain_that_finds_no_stream_anywhere_ends_with_the_stream_gone(
    cluster: list[Server], tmp_path: Path
) -> None:
    """A stream the cluster no longer holds (a power cut of every replica can take it whole) is
    no empty stream: JetStream answers "stream not found" through every node, so the drain ends
    ``ok`` with ``gone`` naming every node (its confirmed, unconsumed messages are lost, and the
    checkers do not take the drain for the stream answering), not ``no_copy``."""
    rec = Recorder(tmp_path / "h.jsonl")
    driver = _driver(cluster, rec, rate=100)

    async def scenario() -> int:
        await driver.setup([QUEUE])
        await _delete_stream(driver)
        return await drain_queue(driver, "d1", QUEUE, driver.nodes, driver.w, driver.recorder)

    driver.w = WorkloadSection(message_size=SIZE, drain_idle=0.5, drain_timeout=8)
    assert asyncio.run(scenario()) == 0
    rec.close()
    drain = [r for r in _history(tmp_path / "h.jsonl") if r["f"] == "drain" and r["type"] != "invoke"]
    assert [r["type"] for r in drain] == ["ok"]
    value = json.loads(drain[0]["value"])
    assert value["gone"] == dict.fromkeys(("n1", "n2", "n3"), NO_STREAM) and "no_copy" not in value
    assert {n: (v["missing"], v["error"]) for n, v in value["nodes"].items()} == dict.fromkeys(
        ("n1", "n2", "n3"), ("stream", None)
    )


def test_no_stream_on_some_nodes_and_a_node_down_is_unfinished(cluster: list[Server], tmp_path: Path) -> None:
    """The same with n3 down: what n3 would answer is not known, so the drain does not end."""

    async def deleted(driver: NatsDriver) -> bool:
        """The stream deleted through n1 (the delete needs a meta leader among n1 and n2)."""
        try:
            conn = await driver.connect("n1")
        except OSError:
            return False
        try:
            await conn.js.delete_stream(QUEUE)
            return True
        except nats.js.errors.NotFoundError:
            return True  # an earlier try that timed out here was applied
        except (nats.errors.Error, TimeoutError):
            return False
        finally:
            await conn.close()

    async def stop_n3_and_delete_stream(driver: NatsDriver) -> None:
        await asyncio.to_thread(cluster[2].stop)
        await until_async(lambda: deleted(driver), "the stream deleted through n1 without n3")

    drain = _unfinished_drain(cluster, tmp_path, stop_n3_and_delete_stream)
    assert "n3: connect:" in drain["error"]
    rounds = json.loads(drain["value"])["rounds"]
    assert any(r.get("gone") == ["n1", "n2"] and set(r["errors"]) == {"n3"} for r in rounds), rounds
    assert all(r["empty"] == [] for r in rounds)


def test_a_visit_that_makes_no_progress_ends_and_the_drain_goes_on_to_the_next_node(
    cluster: list[Server], tmp_path: Path
) -> None:
    """The stream is there and its consumer is gone again at every look (made again, lost
    again): the visit used to make it again for good, without the patience rule, and spent the
    whole drain_timeout on the first node, never reaching the others. It ends after the patience
    (no new ack for that long) with an error saying why, and the drain visits the next node."""

    async def made_and_lost_at_each_look(driver: NatsDriver) -> None:
        conn = await driver.connect("n1")
        await conn.js.delete_consumer(QUEUE, CONSUMER)
        await conn.close()
        made = driver.create_consumer

        async def made_and_lost(conn: Any, queue: str) -> None:
            await made(conn, queue)
            await conn.js.delete_consumer(queue, CONSUMER)

        driver.create_consumer = made_and_lost  # type: ignore[method-assign]

    # The patience is 10 s here (max(10, 4 * drain_idle, ack_wait + 5)): time for two visits.
    drain = _unfinished_drain(cluster, tmp_path, made_and_lost_at_each_look, timeout=25)
    value = json.loads(drain["value"])
    first = value["rounds"][0]["errors"]
    assert first["n1"].startswith("no new ack for 10s: the consumer was gone at each look (made again")
    assert value["nodes"]["n1"]["consumers_created"] > 1
    assert first["n2"].startswith("no new ack for 10s") or "drain_timeout" in first["n2"]  # n2 was reached
