"""aio-pika (robust connection, confirms, consume, reject) and kombu (Producer/Consumer, SimpleQueue)."""

from __future__ import annotations

import asyncio

import aio_pika
import kombu

from tests.broker_impl.conftest import InProcessNode
from tests.polling import until_async


def test_aio_pika_confirms_consume_reject(node: InProcessNode) -> None:
    async def scenario() -> tuple[list[bytes], list[bool | None], int]:
        conn = await aio_pika.connect_robust(f"amqp://guest:guest@127.0.0.1:{node.port}/")
        async with conn:
            ch = await conn.channel()  # publisher confirms on by default
            await ch.set_qos(prefetch_count=5)
            q = await ch.declare_queue("aio", durable=True)
            for i in range(20):
                confirm = await ch.default_exchange.publish(
                    aio_pika.Message(f"m{i}".encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "aio"
                )
                assert confirm is not None
            bodies: list[bytes] = []
            redelivered: list[bool | None] = []
            rejected_once = False
            async with q.iterator() as it:
                async for msg in it:
                    if msg.body == b"m3" and not rejected_once:
                        rejected_once = True
                        await msg.reject(requeue=True)
                        continue
                    bodies.append(msg.body)
                    redelivered.append(msg.redelivered)
                    await msg.ack()
                    if len(bodies) == 20:
                        break
            dq = await ch.declare_queue("aio", durable=True, passive=True)
            left = dq.declaration_result.message_count
            assert left is not None
            return bodies, redelivered, left

    bodies, redelivered, left = asyncio.run(scenario())
    assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(20))
    assert redelivered[bodies.index(b"m3")] is True
    assert left == 0


def test_aio_pika_reject_without_requeue_drops(node: InProcessNode) -> None:
    async def scenario() -> int:
        async with await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{node.port}/") as conn:
            ch = await conn.channel()
            q = await ch.declare_queue("aio-rej")
            await ch.default_exchange.publish(aio_pika.Message(b"x"), "aio-rej")
            msg = await q.get(timeout=30)
            await msg.reject(requeue=False)
            left = (await ch.declare_queue("aio-rej", passive=True)).declaration_result.message_count
            assert left is not None
            return left

    assert asyncio.run(scenario()) == 0


def consume_kombu(conn: kombu.Connection, queue: kombu.Queue, n: int) -> list[int]:
    """The ``n`` field of the first ``n`` JSON messages a kombu consumer of ``queue`` gets, each acked."""
    got: list[int] = []

    def on_message(body, message) -> None:
        got.append(body["n"])
        message.ack()

    with kombu.Consumer(conn, queues=[queue], callbacks=[on_message]):
        while len(got) < n:
            conn.drain_events(timeout=30)
    return got


def test_kombu_producer_consumer_and_simple_queue(node: InProcessNode) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{node.port}//"
    exchange = kombu.Exchange("kx", type="direct", durable=True)
    queue = kombu.Queue("kq", exchange, routing_key="k", durable=True)
    with kombu.Connection(url) as conn:
        producer = kombu.Producer(conn.channel(), exchange=exchange)
        for i in range(5):
            producer.publish({"n": i}, routing_key="k", declare=[queue], serializer="json")
        assert consume_kombu(conn, queue, 5) == [0, 1, 2, 3, 4]

        sq = conn.SimpleQueue("simple")
        sq.put({"hello": "world"})
        msg = sq.get(block=True, timeout=30)
        assert msg.payload == {"hello": "world"}
        msg.ack()
        assert sq.qsize() == 0
        sq.close()


def test_aio_pika_robust_connection_survives_restart(tmp_path) -> None:
    from tests.broker_impl.conftest import make_config

    first = InProcessNode(make_config(tmp_path)).start()
    port = first.port

    async def phase1() -> None:
        conn = await aio_pika.connect_robust(f"amqp://guest:guest@127.0.0.1:{port}/", reconnect_interval=0.2)
        ch = await conn.channel()
        q = await ch.declare_queue("robust", durable=True)
        persistent = aio_pika.DeliveryMode.PERSISTENT
        await ch.default_exchange.publish(aio_pika.Message(b"before", delivery_mode=persistent), "robust")
        await asyncio.to_thread(first.stop)
        second = InProcessNode(make_config(tmp_path, node__port=port)).start()
        try:

            async def published_after() -> bool:
                try:
                    await ch.default_exchange.publish(
                        aio_pika.Message(b"after", delivery_mode=persistent), "robust"
                    )
                except (aio_pika.exceptions.AMQPError, ConnectionError, RuntimeError):
                    return False
                return True

            # the robust connection reconnects and restores its channel
            await until_async(published_after, "a publish through the restored channel", every=0.1)
            bodies = []
            for _ in range(2):
                msg = await q.get(timeout=30)
                bodies.append(msg.body)
                await msg.ack()
            assert bodies == [b"before", b"after"]
            await conn.close()
        finally:
            await asyncio.to_thread(second.stop)

    asyncio.run(phase1())
