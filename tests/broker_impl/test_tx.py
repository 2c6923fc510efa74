"""AMQP transactions with real clients (pika, aio-pika, kombu): RabbitMQ's semantics for tx.select/commit/rollback."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import kombu
import pika
import pika.exceptions
import pytest

from tests.broker_impl.conftest import InProcessNode, connect
from tests.broker_impl.test_clients import consume_kombu
from tests.broker_impl.test_pika import drain

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _count(node: InProcessNode, queue: str) -> int:
    return node.run(lambda: node.broker.vhosts["/"].queues[queue].message_count())


def _transacting(node: InProcessNode, queue: str, *bodies: bytes) -> tuple[pika.BlockingConnection, Any]:
    """A connection and a channel in tx mode, ``bodies`` published persistent to durable ``queue`` first."""
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    for body in bodies:
        ch.basic_publish("", queue, body, PERSISTENT)
    ch.tx_select()
    return conn, ch


def test_pika_commit_publishes_all_rollback_none(node: InProcessNode) -> None:
    conn, ch = _transacting(node, "txq")
    for i in range(5):
        ch.basic_publish("", "txq", f"c{i}".encode(), PERSISTENT)
    assert _count(node, "txq") == 0  # nothing reaches the queue before the commit
    ch.tx_commit()
    assert _count(node, "txq") == 5
    for i in range(3):
        ch.basic_publish("", "txq", f"r{i}".encode(), PERSISTENT)
    ch.tx_rollback()
    ch.tx_commit()  # an empty transaction commits
    assert _count(node, "txq") == 5
    reader = conn.channel()
    got = drain(reader, "txq", 5)
    assert [b for _m, _p, b in got] == [f"c{i}".encode() for i in range(5)]
    conn.close()


def test_pika_acks_apply_at_commit_and_come_back_on_rollback(node: InProcessNode) -> None:
    conn, ch = _transacting(node, "txa", *(f"m{i}".encode() for i in range(4)))
    got = [ch.basic_get("txa") for _ in range(4)]
    tags = [m.delivery_tag for m, _p, _b in got]
    ch.basic_ack(tags[0])
    ch.basic_ack(tags[1])
    ch.tx_rollback()
    # the rolled-back acks' deliveries are unacked again: acking them once more is legal
    ch.basic_ack(tags[0])
    ch.basic_ack(tags[2])
    ch.tx_commit()
    unacked = node.run(lambda: node.broker.vhosts["/"].queues["txa"].bq.unacked())
    assert len(unacked) == 2  # m1 and m3 still held by the channel
    conn.close()  # closing the channel requeues them
    conn = connect(node)
    got2 = drain(conn.channel(), "txa", 2)
    assert sorted(b for _m, _p, b in got2) == [b"m1", b"m3"]
    conn.close()


def test_pika_tx_errors_are_rabbitmq_406(node: InProcessNode) -> None:
    conn = connect(node)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.tx_commit()
    assert e.value.reply_code == 406 and "not transactional" in e.value.reply_text
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.tx_select()
    assert e.value.reply_code == 406 and "confirm to tx" in e.value.reply_text
    ch = conn.channel()
    ch.tx_select()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.confirm_delivery()
    assert e.value.reply_code == 406 and "tx to confirm" in e.value.reply_text
    ch = conn.channel()
    ch.tx_select()
    ch.basic_ack(99)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.tx_commit()  # the unknown tag closed the channel when the ack arrived
    assert e.value.reply_code == 406 and "unknown delivery tag" in e.value.reply_text
    assert conn.is_open  # channel errors only
    conn.close()


def test_channel_closed_with_open_tx_rolls_back(node: InProcessNode) -> None:
    conn, ch = _transacting(node, "txc", b"kept")
    method, _p, _b = ch.basic_get("txc")
    ch.basic_ack(method.delivery_tag)
    ch.basic_publish("", "txc", b"dropped", PERSISTENT)
    ch.close()
    got = drain(conn.channel(), "txc", 2, timeout=1)
    assert [(m.redelivered, b) for m, _p, b in got] == [(True, b"kept")]
    conn.close()


def test_aio_pika_transaction(node: InProcessNode) -> None:
    async def scenario() -> list[bytes]:
        async with await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{node.port}/") as conn:
            ch = await conn.channel(publisher_confirms=False)
            q = await ch.declare_queue("aiotx", durable=True)
            persistent = aio_pika.DeliveryMode.PERSISTENT
            async with ch.transaction():
                for i in range(3):
                    await ch.default_exchange.publish(
                        aio_pika.Message(f"a{i}".encode(), delivery_mode=persistent), "aiotx"
                    )
            tx = ch.transaction()
            await tx.select()
            await ch.default_exchange.publish(aio_pika.Message(b"never", delivery_mode=persistent), "aiotx")
            await tx.rollback()
            out = []
            for _ in range(3):
                msg = await q.get(timeout=30)
                out.append(msg.body)
                await msg.ack()
            assert await q.get(fail=False) is None
            return out

    assert asyncio.run(scenario()) == [b"a0", b"a1", b"a2"]


def test_kombu_transaction(node: InProcessNode) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{node.port}//"
    queue = kombu.Queue("ktx", durable=True)
    with kombu.Connection(url) as conn:
        ch = conn.channel()
        queue(ch).declare()
        producer = kombu.Producer(ch)
        ch.tx_select()
        for i in range(3):
            producer.publish({"n": i}, routing_key="ktx", serializer="json", delivery_mode=2)
        ch.tx_commit()
        producer.publish({"n": 99}, routing_key="ktx", serializer="json", delivery_mode=2)
        ch.tx_rollback()
        assert consume_kombu(conn, queue, 3) == [0, 1, 2]
        assert _count(node, "ktx") == 0


def test_basic_recover_is_not_part_of_a_transaction(node: InProcessNode) -> None:
    conn, ch = _transacting(node, "txr", b"m")
    assert ch.basic_get("txr")[0] is not None
    ch.basic_recover(requeue=True)  # at once, as RabbitMQ: no commit needed
    assert _count(node, "txr") == 1
    assert (
        node.run(lambda: next(iter(node.broker.connections)).channels[ch.channel_number].unacked_acking) == 0
    )
    conn.close()
