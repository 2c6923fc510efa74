"""Delayed messages (``x-delayed-message`` exchange, ``x-delay`` header) through real clients: pika, aio-pika, kombu.

The one timing assertion here is the property itself: a message is never delivered
before its delay has passed since it was sent (a lower bound, which a busy machine
cannot break: it only makes deliveries later).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aio_pika
import kombu
import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.broker_impl.conftest import InProcessNode, connect
from tests.broker_impl.test_pika import pump_until
from tests.polling import until


def acking(got: list[bytes]) -> Callable[..., None]:
    """A pika consumer callback that keeps each body and acks it."""

    def on_message(c: Any, m: Any, _p: Any, b: bytes) -> None:
        got.append(b)
        c.basic_ack(m.delivery_tag)

    return on_message


DELAYED = {"x-delayed-type": "direct"}


def _delayed_setup(ch, exchange: str = "dx", queue: str = "dq") -> None:
    ch.exchange_declare(exchange, "x-delayed-message", durable=True, arguments=DELAYED)
    ch.queue_declare(queue, durable=True)
    ch.queue_bind(queue, exchange, "rk")


def test_pika_delayed_messages_come_due_in_order_never_early(node: InProcessNode) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    _delayed_setup(ch)
    delays = {b"late": 1500, b"soon": 300, b"middle": 800}
    sent: dict[bytes, float] = {}
    due: dict[
        bytes, tuple[float, float]
    ] = {}  # when it can be due: the broker got it between send and confirm
    for body, delay in delays.items():
        sent[body] = time.monotonic()
        ch.basic_publish("dx", "rk", body, pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay}))
        due[body] = (sent[body] + delay / 1000, time.monotonic() + delay / 1000)
    # No header, or one the plugin does not take as a delay: routed at once.
    at_once: list[tuple[bytes, dict[str, object] | None]] = [
        (b"plain", None),
        (b"negative", {"x-delay": -5}),
        (b"word", {"x-delay": "soon"}),
    ]
    for body, header in at_once:
        ch.basic_publish("dx", "rk", body, pika.BasicProperties(delivery_mode=2, headers=header))
    got: list[tuple[bytes, float, object]] = []

    def on_message(c: Any, m: Any, p: Any, b: bytes) -> None:
        got.append((b, time.monotonic(), (p.headers or {}).get("x-delay")))
        c.basic_ack(m.delivery_tag)

    ch.basic_consume("dq", on_message)
    pump_until(conn, lambda: len(got) == 6)
    order = [b for b, _t, _h in got]
    assert sorted(order[:3]) == [b"negative", b"plain", b"word"]
    assert sorted(order[3:]) == sorted(delays)
    # In due order: one delivered after another was not certainly due before it. (A stall between
    # two publishes on a busy machine may move their due times past each other, so the order is
    # checked against what each one's send and confirm allow, not against the delays alone.)
    for i, first in enumerate(order[3:]):
        for later in order[3 + i + 1 :]:
            assert not due[later][1] < due[first][0], f"{later!r} was due before {first!r} yet came after it"
    for body, at, swapped in got[3:]:
        assert at - sent[body] >= delays[body] / 1000, f"{body!r} delivered before its delay"
        assert swapped == -delays[body]  # the plugin's swap_delay_header
    conn.close()


def test_delayed_exchange_needs_an_existing_underlying_type(node: InProcessNode) -> None:
    conn = connect(node)
    for args in ({}, {"x-delayed-type": "nope"}):
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.exchange_declare("bad", "x-delayed-message", arguments=args)
        assert err.value.reply_code == 406
    ch = conn.channel()
    ch.exchange_declare("good", "x-delayed-message", arguments={"x-delayed-type": "topic"})
    ch.exchange_declare("good", "x-delayed-message", arguments={"x-delayed-type": "topic"})  # equivalent
    conn.close()


def test_mandatory_is_not_applied_to_held_back_messages(ch: BlockingChannel) -> None:
    ch.confirm_delivery()
    ch.exchange_declare("dx-unbound", "x-delayed-message", arguments=DELAYED)
    ch.basic_publish(
        "dx-unbound", "nowhere", b"held", pika.BasicProperties(headers={"x-delay": 100}), mandatory=True
    )  # no queue now: still confirmed, no basic.return (as the plugin)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("dx-unbound", "nowhere", b"now", mandatory=True)


def test_binding_added_while_held_back_counts(node: InProcessNode) -> None:
    """Routing happens when due: a queue bound after the publish but before its due time gets it."""
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("dx2", "x-delayed-message", durable=True, arguments=DELAYED)
    ch.queue_declare("late-bound", durable=True)
    ch.basic_publish("dx2", "rk", b"m", pika.BasicProperties(headers={"x-delay": 1000}))
    ch.queue_bind("late-bound", "dx2", "rk")
    got: list[bytes] = []
    ch.basic_consume("late-bound", acking(got))
    pump_until(conn, lambda: got == [b"m"])
    conn.close()


def test_aio_pika_delayed_topic_exchange(node: InProcessNode) -> None:
    async def scenario() -> list[tuple[str, float]]:
        async with await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{node.port}/") as conn:
            ch = await conn.channel()  # confirms on
            ex = await ch.declare_exchange(
                "adx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "topic"}
            )
            q = await ch.declare_queue("adq", durable=True)
            await q.bind(ex, "orders.#")
            sent = time.monotonic()
            for name, delay in (("b", 700), ("a", 200)):
                confirm = await ex.publish(
                    aio_pika.Message(
                        name.encode(),
                        headers={"x-delay": delay},
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    f"orders.{name}",
                )
                assert confirm is not None
            out: list[tuple[str, float]] = []
            async with q.iterator() as it:
                async for msg in it:
                    out.append((msg.body.decode(), time.monotonic() - sent))
                    await msg.ack()
                    if len(out) == 2:
                        break
            return out

    got = asyncio.run(scenario())
    assert [b for b, _ in got] == ["a", "b"]
    assert got[0][1] >= 0.2 and got[1][1] >= 0.7


def test_kombu_delayed_publish(node: InProcessNode) -> None:
    exchange = kombu.Exchange("kdx", type="x-delayed-message", durable=True, arguments=DELAYED)
    queue = kombu.Queue("kdq", exchange, routing_key="k", durable=True)
    got: list[tuple[str, float]] = []
    with kombu.Connection(f"amqp://guest:guest@127.0.0.1:{node.port}//") as conn:
        producer = kombu.Producer(conn.channel(), exchange=exchange)
        queue(conn.channel()).declare()
        sent = time.monotonic()
        producer.publish({"n": 1}, routing_key="k", headers={"x-delay": 500}, declare=[queue])

        def on_message(body, message) -> None:
            got.append((body["n"], time.monotonic() - sent))
            message.ack()

        with kombu.Consumer(conn, queues=[queue], callbacks=[on_message]):

            def drained() -> bool:
                try:
                    conn.drain_events(timeout=0.5)
                except TimeoutError:
                    pass
                return bool(got)

            until(drained, "the delayed message", every=0)
    assert got and got[0][0] == 1 and got[0][1] >= 0.5


def test_nothing_is_routed_while_the_node_turns_clients_away(node: InProcessNode) -> None:
    """A node joining the cluster or paused in a minority holds due messages: routing them then
    could put them in a copy the cluster is about to drop (a restarted node did, before this rule)."""
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    _delayed_setup(ch, "dx3", "held")
    refusal: list[str] = ["joining the cluster"]
    node.broker.client_refusal = lambda: refusal[0] if refusal else None  # as ClusterNode says it
    ch.basic_publish("dx3", "rk", b"m", pika.BasicProperties(delivery_mode=2, headers={"x-delay": 50}))
    sched = node.broker.scheduler
    pump_until(conn, lambda: node.run(lambda: sched.stats["held_for_cluster"]) >= 3)
    assert node.run(lambda: node.broker.vhosts["/"].queues["held"].message_count()) == 0
    refusal.clear()
    got: list[bytes] = []
    ch.basic_consume("held", acking(got))
    pump_until(conn, lambda: got == [b"m"])
    conn.close()


def test_a_due_message_that_finds_no_queue_is_tried_again_before_it_is_dropped(node: InProcessNode) -> None:
    """A node taking the cluster's records replaces its copy of a queue; a message due in that step
    finds no queue for a moment. It is tried again (UNROUTED_TRIES, a second apart), not dropped."""
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("dx4", "x-delayed-message", durable=True, arguments=DELAYED)
    ch.queue_declare("gap", durable=True)
    ch.basic_publish("dx4", "rk", b"m", pika.BasicProperties(delivery_mode=2, headers={"x-delay": 50}))
    sched = node.broker.scheduler
    pump_until(conn, lambda: node.run(lambda: sched.stats["retried"]) >= 1)
    ch.queue_bind("gap", "dx4", "rk")
    got: list[bytes] = []
    ch.basic_consume("gap", acking(got))
    pump_until(conn, lambda: got == [b"m"])
    assert node.run(lambda: sched.stats["dropped"]) == 0
    conn.close()


def test_a_routing_during_which_a_peer_went_down_is_routed_again(node: InProcessNode) -> None:
    """A master cut off in a minority confirms alone before it pauses; its copy is dropped at the heal.
    So a routing that saw a peer go down keeps the schedule entry and routes it again (a duplicate, not a loss)."""
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    _delayed_setup(ch, "dx5", "flappy")
    losses = iter(range(1_000_000))
    real = node.broker.peer_losses
    node.broker.peer_losses = lambda: next(losses)  # a peer goes down during every routing
    ch.basic_publish("dx5", "rk", b"m", pika.BasicProperties(delivery_mode=2, headers={"x-delay": 50}))
    sched = node.broker.scheduler
    queue = node.broker.vhosts["/"].queues["flappy"]
    pump_until(conn, lambda: node.run(lambda: queue.message_count()) >= 2)
    assert node.run(lambda: sched.pending) == 1  # still scheduled: not acked
    node.broker.peer_losses = real
    pump_until(conn, lambda: node.run(lambda: sched.pending) == 0)
    assert node.run(lambda: sched.stats["routed"]) == 1
    conn.close()


def test_a_routing_whose_queue_copy_is_replaced_is_routed_again(node: InProcessNode, monkeypatch) -> None:
    """A node taking the cluster's records after a partition drops its copy of a queue, and that copy
    never confirms what was routed to it. The routing sees its queue replaced and routes again at once,
    not after the confirm timeout (set out of reach here)."""
    from broker_impl import schedule

    monkeypatch.setattr(schedule, "CONFIRM_TIMEOUT_S", 600.0)
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    _delayed_setup(ch, "dx6", "swap")
    old = node.broker.vhosts["/"].queues["swap"]
    swallowed: list[bytes] = []
    old.enqueue = lambda m, sender, cb: swallowed.append(m.body)  # a copy about to be dropped: never answers
    ch.basic_publish("dx6", "rk", b"m", pika.BasicProperties(delivery_mode=2, headers={"x-delay": 50}))
    pump_until(conn, lambda: swallowed == [b"m"])
    ch.queue_delete("swap")
    _delayed_setup(ch, "dx6", "swap")  # the cluster's queue takes its place
    got: list[bytes] = []
    ch.basic_consume("swap", acking(got))
    pump_until(conn, lambda: got == [b"m"])
    conn.close()
