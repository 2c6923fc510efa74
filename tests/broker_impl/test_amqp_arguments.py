"""Arguments a client may send are honoured or refused, never silently ignored (pika against a real node).

RabbitMQ behaviours reproduced: ``x-queue-type`` other than classic is refused
with 406 PRECONDITION_FAILED and a reason (this broker has classic queues only);
an exchange's ``alternate-exchange`` takes what it cannot route; ``x-expires``
deletes a queue left unused; a message TTL's deadline counts from when the
message was stored, across a restart too.
"""

from __future__ import annotations

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.broker_impl.conftest import InProcessNode, connect, make_config
from tests.polling import until


def _restart(tmp_path, node: InProcessNode) -> InProcessNode:
    """Stop the node cleanly and start it again on the same data directory and port."""
    port = node.port
    node.stop()
    return InProcessNode(make_config(tmp_path, node__port=port)).start()


@pytest.mark.parametrize("qtype", ["quorum", "stream", "no-such-type"])
def test_a_queue_type_that_is_not_classic_is_refused_with_a_reason(node: InProcessNode, qtype: str) -> None:
    conn = connect(node)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare("typed", durable=True, arguments={"x-queue-type": qtype})
    assert exc.value.reply_code == 406
    assert qtype in exc.value.reply_text and "classic" in exc.value.reply_text
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare("typed", passive=True)  # the refused declare created nothing
    assert exc.value.reply_code == 404
    ch = conn.channel()
    ch.queue_declare("typed", durable=True, arguments={"x-queue-type": "classic"})  # classic is what it is
    conn.close()


def test_unroutable_messages_go_to_the_alternate_exchange(ch: BlockingChannel) -> None:
    ch.confirm_delivery()
    ch.exchange_declare("ae", "fanout")
    ch.queue_declare("ae.catch")
    ch.queue_bind("ae.catch", "ae")
    ch.exchange_declare("main", "direct", arguments={"alternate-exchange": "ae"})
    ch.queue_declare("main.red")
    ch.queue_bind("main.red", "main", "red")
    ch.basic_publish("main", "red", b"routed", mandatory=True)
    ch.basic_publish("main", "blue", b"unroutable", mandatory=True)  # no basic.return: the AE took it
    m, _, body = ch.basic_get("main.red", auto_ack=True)
    assert body == b"routed"
    m, _, body = ch.basic_get("ae.catch", auto_ack=True)
    assert m is not None and body == b"unroutable" and m.routing_key == "blue"
    assert ch.basic_get("ae.catch")[0] is None  # the routed one did not go there too
    # an alternate exchange that routes nowhere: a mandatory publish is returned
    ch.exchange_declare("lonely", "direct", arguments={"alternate-exchange": "missing-ae"})
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("lonely", "x", b"lost", mandatory=True)


def test_an_unused_queue_with_x_expires_is_deleted(node: InProcessNode) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("short-lived", arguments={"x-expires": 300})
    ch.queue_declare("kept", arguments={"x-expires": 300})
    tag = ch.basic_consume("kept", lambda *a: None)  # a consumer keeps it in use
    until(
        lambda: (
            conn.process_data_events(time_limit=0.05)
            or "short-lived" not in node.run(lambda: dict(node.broker.vhosts["/"].queues))
        ),
        "the unused queue to be deleted",
        every=0,
    )
    assert "kept" in node.run(lambda: dict(node.broker.vhosts["/"].queues))
    ch.basic_cancel(tag)
    with pytest.raises(
        pika.exceptions.ChannelClosedByBroker
    ) as exc:  # unused from the cancel on: it goes too
        until(
            lambda: ch.queue_declare("kept", passive=True) and conn.process_data_events(time_limit=0.05),
            "the queue unused since the cancel to be deleted",
            every=0,
        )
    assert exc.value.reply_code == 404
    conn.close()


def test_message_ttl_deadlines_survive_a_restart(tmp_path) -> None:
    first = InProcessNode(make_config(tmp_path)).start()
    conn = connect(first)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("ttl.q", durable=True, arguments={"x-message-ttl": 1500})
    ch.queue_declare("ttl.per", durable=True)
    persistent = pika.BasicProperties(delivery_mode=2)
    ch.basic_publish("", "ttl.per", b"expires too", pika.BasicProperties(delivery_mode=2, expiration="1000"))
    ch.basic_publish("", "ttl.q", b"expires", persistent)
    ch.basic_publish("", "ttl.per", b"stays", persistent)
    conn.close()
    second = _restart(tmp_path, first)
    try:
        conn = connect(second)
        ch = conn.channel()
        until(
            lambda: (
                conn.process_data_events(time_limit=0.1)
                or not ch.queue_declare("ttl.q", passive=True).method.message_count
            ),
            "the recovered message's TTL to end it",
            every=0,
        )
        got = []  # stored before ttl.q's message with a shorter TTL: its deadline has passed too
        while (m := ch.basic_get("ttl.per", auto_ack=True))[0] is not None:
            got.append(m[2])
        assert got == [b"stays"]
        conn.close()
    finally:
        second.stop()


def test_exchange_to_exchange_bindings_route_and_survive_a_restart(tmp_path) -> None:
    first = InProcessNode(make_config(tmp_path)).start()
    conn = connect(first)
    ch = conn.channel()
    ch.exchange_declare("front", "topic", durable=True)
    ch.exchange_declare("back", "fanout", durable=True)
    ch.exchange_declare("loop", "fanout", durable=True)
    ch.queue_declare("e2e.q", durable=True)
    ch.queue_bind("e2e.q", "back")
    ch.exchange_bind("back", "front", "orders.*")  # destination, source, routing key
    ch.exchange_bind("loop", "back")
    ch.exchange_bind("back", "loop")  # a cycle: each exchange is visited once, the queue gets one copy
    ch.confirm_delivery()
    ch.basic_publish(
        "front", "orders.new", b"via front", pika.BasicProperties(delivery_mode=2), mandatory=True
    )
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("front", "invoices.new", b"matches no binding", mandatory=True)
    assert ch.queue_declare("e2e.q", passive=True).method.message_count == 1
    conn.close()
    second = _restart(tmp_path, first)
    try:
        conn = connect(second)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("front", "orders.old", b"after restart", mandatory=True)
        bodies = [ch.basic_get("e2e.q", auto_ack=True)[2] for _ in range(2)]
        assert bodies == [b"via front", b"after restart"]
        ch.exchange_unbind("back", "front", "orders.*")
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("front", "orders.gone", b"unbound", mandatory=True)
        ch.exchange_delete("back")  # bindings to and from it go with it
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("loop", "", b"nowhere", mandatory=True)
        conn.close()
    finally:
        second.stop()
