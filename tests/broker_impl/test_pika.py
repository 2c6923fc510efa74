"""pika BlockingConnection against an in-process node: the behaviours clients rely on."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.broker_impl.conftest import InProcessNode, connect
from tests.polling import until


def pump(conn: pika.BlockingConnection, seconds: float) -> None:
    """process_data_events returns after the first batch; keep pumping for the whole period."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def pump_until(conn: pika.BlockingConnection, cond: Callable[[], object], what: str = "the broker") -> None:
    """Pump until cond() holds: a busy machine delivers late, not wrongly (no deadline: tests/polling.py)."""
    until(lambda: conn.process_data_events(time_limit=0.05) or cond(), what, every=0)


def filled(ch: BlockingChannel, queue: str, n: int) -> None:
    """Declare ``queue`` and publish ``n`` messages to it, bodies ``b"0"``, ``b"1"``, ..."""
    ch.queue_declare(queue)
    for i in range(n):
        ch.basic_publish("", queue, str(i).encode())


def drain(ch, queue: str, n: int, ack: bool = True, timeout: float = 30) -> list[tuple]:
    out = []
    for method, props, body in ch.consume(queue, inactivity_timeout=timeout):
        if method is None:
            break
        out.append((method, props, body))
        if ack:
            ch.basic_ack(method.delivery_tag)
        if len(out) == n:
            break
    ch.cancel()
    return out


def test_confirmed_publish_consume_ack(ch: BlockingChannel) -> None:
    ch.confirm_delivery()
    ch.queue_declare("work", durable=True)
    for i in range(50):
        ch.basic_publish("", "work", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    got = drain(ch, "work", 50)
    assert [b for _m, _p, b in got] == [f"m{i}".encode() for i in range(50)]
    assert all(not m.redelivered for m, _p, _b in got)
    assert ch.queue_declare("work", passive=True).method.message_count == 0


def test_mandatory_unroutable_raises(ch: BlockingChannel) -> None:
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("amq.direct", "nowhere", b"x", mandatory=True)
    ch.basic_publish("amq.direct", "nowhere", b"x")  # not mandatory: just confirmed


def test_basic_get_nack_requeue_and_reject_without_requeue(ch: BlockingChannel) -> None:
    ch.queue_declare("g")
    ch.basic_publish("", "g", b"one")
    ch.basic_publish("", "g", b"two")
    m, _p, body = ch.basic_get("g")
    assert body == b"one" and m.message_count == 1 and not m.redelivered
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, _p, body = ch.basic_get("g")
    assert body == b"one" and m.redelivered  # back at its original position
    ch.basic_reject(m.delivery_tag, requeue=False)
    m, _p, body = ch.basic_get("g", auto_ack=True)
    assert body == b"two"
    assert ch.basic_get("g") == (None, None, None)


def test_unacked_requeued_redelivered_on_channel_close(node: InProcessNode) -> None:
    conn = connect(node)
    ch = conn.channel()
    filled(ch, "r", 3)
    got = drain(ch, "r", 3, ack=False)
    assert len(got) == 3
    ch.close()
    ch2 = conn.channel()
    again = drain(ch2, "r", 3)
    assert [b for _m, _p, b in again] == [b"0", b"1", b"2"]
    assert all(m.redelivered for m, _p, _b in again)
    conn.close()


def test_prefetch_limits_unacked_per_consumer(node: InProcessNode) -> None:
    conn = connect(node)
    ch = conn.channel()
    filled(ch, "p", 10)
    ch.basic_qos(prefetch_count=3)
    seen = []
    ch.basic_consume("p", lambda c, m, p, b: seen.append(m.delivery_tag))
    pump_until(conn, lambda: len(seen) >= 3)
    pump(conn, 0.3)  # room for a fourth to (wrongly) arrive
    assert len(seen) == 3
    ch.basic_ack(seen[-1], multiple=True)
    pump_until(conn, lambda: len(seen) >= 6)
    pump(conn, 0.3)
    assert len(seen) == 6
    conn.close()


def test_round_robin_between_consumers(node: InProcessNode) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("rr")
    got: dict[str, int] = {"a": 0, "b": 0}

    def cb(tag):
        def f(c, m, p, b):
            got[tag] += 1
            c.basic_ack(m.delivery_tag)

        return f

    ch.basic_consume("rr", cb("a"), consumer_tag="a")
    ch.basic_consume("rr", cb("b"), consumer_tag="b")
    for i in range(20):
        ch.basic_publish("", "rr", str(i).encode())
    pump_until(conn, lambda: sum(got.values()) >= 20, "20 deliveries")
    assert got == {"a": 10, "b": 10}
    conn.close()


def test_large_and_empty_bodies(node: InProcessNode) -> None:
    conn = connect(node, frame_max=8192)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("big")
    big = bytes(range(256)) * 2000  # 512000 bytes: many frames each way
    ch.basic_publish("", "big", big)
    ch.basic_publish("", "big", b"")
    assert ch.basic_get("big", auto_ack=True)[2] == big
    assert ch.basic_get("big", auto_ack=True)[2] == b""
    conn.close()


def test_exchange_types_route(ch: BlockingChannel) -> None:
    ch.exchange_declare("t", "topic")
    ch.exchange_declare("f", "fanout")
    for q in ("t1", "t2", "f1", "f2"):
        ch.queue_declare(q)
    ch.queue_bind("t1", "t", "a.*.c")
    ch.queue_bind("t2", "t", "a.#")
    ch.queue_bind("f1", "f")
    ch.queue_bind("f2", "f")
    ch.basic_publish("t", "a.b.c", b"abc")
    ch.basic_publish("t", "a", b"a")
    ch.basic_publish("f", "whatever", b"fan")
    counts = {q: ch.queue_declare(q, passive=True).method.message_count for q in ("t1", "t2", "f1", "f2")}
    assert counts == {"t1": 1, "t2": 2, "f1": 1, "f2": 1}
    ch.queue_unbind("t2", "t", "a.#")
    ch.basic_publish("t", "a.x", b"ax")
    assert ch.queue_declare("t2", passive=True).method.message_count == 2


def test_server_named_queue_and_exclusive_cleanup(node: InProcessNode) -> None:
    conn = connect(node)
    ch = conn.channel()
    name = ch.queue_declare("", exclusive=True).method.queue
    assert name.startswith("amq.gen-")
    other = connect(node)
    och = other.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        och.basic_consume(name, lambda *a: None)
    assert err.value.reply_code == 405
    conn.close()

    def gone() -> bool:
        try:
            other.channel().queue_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            return exc.reply_code == 404
        return False

    pump_until(other, gone)
    och = other.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        och.queue_declare(name, passive=True)
    assert err.value.reply_code == 404
    other.close()


def test_channel_error_codes(node: InProcessNode) -> None:
    conn = connect(node)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare("missing", passive=True)
    assert err.value.reply_code == 404
    ch = conn.channel()
    ch.queue_declare("d", durable=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare("d", durable=False)
    assert err.value.reply_code == 406
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_ack(99)
        ch.queue_declare("d", durable=True)  # a round trip to see the close
    assert err.value.reply_code == 406
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_publish("no-such-exchange", "x", b"x")
        ch.queue_declare("d", durable=True)
    assert err.value.reply_code == 404
    ch = conn.channel()
    ch.exchange_declare("ex1", "direct")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.exchange_declare("ex1", "fanout")
    assert err.value.reply_code == 406
    assert conn.is_open  # channel errors never close the connection
    conn.close()


def test_a_passive_exchange_declare_answers_for_an_existing_exchange_and_refuses_a_missing_one(
    ch: BlockingChannel,
) -> None:
    ch.exchange_declare("present", "fanout")
    ch.exchange_declare("present", "direct", passive=True)  # passive: the type asked is not compared
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.exchange_declare("absent", "direct", passive=True)
    assert err.value.reply_code == 404
    assert err.value.reply_text == "NOT_FOUND - no exchange 'absent' in vhost '/'"


def test_bad_login_is_access_refused(node: InProcessNode) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as err:
        connect(node, password="wrong")
    assert "403" in str(err.value) or "ACCESS_REFUSED" in str(err.value)


def test_permissions_and_vhost_access(node: InProcessNode) -> None:
    b = node.broker
    node.run(lambda: b.add_user("limited", "pw", []))
    node.run(lambda: b.set_permissions("limited", "/", "^own-.*", "^own-.*", "^own-.*"))
    node.run(lambda: b.add_vhost("other"))
    conn = connect(node, "limited", "pw")
    ch = conn.channel()
    ch.queue_declare("own-1")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare("theirs")
    assert err.value.reply_code == 403
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_publish("", "own-1", b"x")  # write on amq.default is not granted
        ch.queue_declare("own-1")
    assert err.value.reply_code == 403
    conn.close()
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as cerr:
        connect(node, "limited", "pw", vhost="other")
    assert "530" in str(cerr.value)


def test_dead_letter_on_reject_and_ttl(node: InProcessNode) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.exchange_declare("dlx", "fanout")
    ch.queue_declare("dead")
    ch.queue_bind("dead", "dlx")
    ch.queue_declare("live", arguments={"x-dead-letter-exchange": "dlx"})
    ch.queue_declare("ttl", arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 100})
    ch.basic_publish("", "live", b"rejected")
    m, _p, _b = ch.basic_get("live")
    ch.basic_reject(m.delivery_tag, requeue=False)
    ch.basic_publish("", "ttl", b"expired")
    pump_until(conn, lambda: ch.queue_declare("dead", passive=True).method.message_count == 2)
    bodies = {}
    for _ in range(2):
        m, p, body = ch.basic_get("dead", auto_ack=True)
        assert m is not None
        bodies[body] = p.headers["x-death"][0]["reason"]
    assert bodies == {b"rejected": "rejected", b"expired": "expired"}
    assert ch.queue_declare("ttl", passive=True).method.message_count == 0
    conn.close()


def test_consumer_cancel_notify_on_queue_delete(node: InProcessNode) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("gone")
    cancelled = []
    ch.basic_consume("gone", lambda *a: None, consumer_tag="c1")
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    other = conn.channel()
    other.queue_delete("gone")
    pump_until(conn, lambda: cancelled)
    assert cancelled == ["c1"]
    conn.close()


def test_basic_recover_redelivers(ch: BlockingChannel) -> None:
    ch.queue_declare("rec")
    ch.basic_publish("", "rec", b"x")
    m, _p, _b = ch.basic_get("rec")
    assert not m.redelivered
    ch.basic_recover(requeue=True)
    m, _p, _b = ch.basic_get("rec", auto_ack=True)
    assert m.redelivered


def test_purge_and_delete_counts(ch: BlockingChannel) -> None:
    ch.queue_declare("pd")
    for _ in range(4):
        ch.basic_publish("", "pd", b"x")
    assert ch.queue_purge("pd").method.message_count == 4
    ch.basic_publish("", "pd", b"x")
    assert ch.queue_delete("pd").method.message_count == 1


def test_expiry_timer_does_not_mark_survivors_redelivered(node: InProcessNode) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("mixed-ttl")
    ch.basic_publish("", "mixed-ttl", b"short", pika.BasicProperties(expiration="50"))
    ch.basic_publish("", "mixed-ttl", b"keeps")
    pump_until(
        conn, lambda: ch.queue_declare("mixed-ttl", passive=True).method.message_count == 1
    )  # the timer ran
    m, _p, body = ch.basic_get("mixed-ttl", auto_ack=True)
    assert body == b"keeps" and not m.redelivered
    assert ch.basic_get("mixed-ttl") == (None, None, None)
    conn.close()


def test_max_length_drops_head(ch: BlockingChannel) -> None:
    ch.confirm_delivery()
    ch.queue_declare("capped", arguments={"x-max-length": 2})
    for i in range(5):
        ch.basic_publish("", "capped", str(i).encode())
    bodies = [ch.basic_get("capped", auto_ack=True)[2] for _ in range(2)]
    assert bodies == [b"3", b"4"]


def test_durable_queue_delete_and_redeclare_starts_empty(ch: BlockingChannel) -> None:
    ch.confirm_delivery()
    ch.queue_declare("again", durable=True)
    ch.basic_publish("", "again", b"old", pika.BasicProperties(delivery_mode=2))
    ch.queue_delete("again")
    assert ch.queue_declare("again", durable=True).method.message_count == 0
    ch.basic_publish("", "again", b"new", pika.BasicProperties(delivery_mode=2))
    assert ch.basic_get("again", auto_ack=True)[2] == b"new"


def test_oversize_message_fails_its_channel_only(node_factory) -> None:
    node = node_factory(limits__max_message_size=4096)
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("sized")
    ch.basic_publish("", "sized", b"a" * 4096)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_publish("", "sized", b"b" * 10000)
        ch.queue_declare("sized")
    assert err.value.reply_code == 406
    ch = conn.channel()
    assert ch.queue_declare("sized").method.message_count == 1
    conn.close()


def test_policy_max_length_and_dead_letter_apply(node: InProcessNode) -> None:
    b = node.broker
    node.run(
        lambda: b.set_policy("/", "cap", "^pol\\.", {"max-length": 1, "dead-letter-exchange": "amq.fanout"})
    )
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("pol.q")
    ch.queue_declare("pol-dead")
    ch.queue_bind("pol-dead", "amq.fanout")
    ch.basic_publish("", "pol.q", b"first")
    ch.basic_publish("", "pol.q", b"second")
    assert ch.basic_get("pol.q", auto_ack=True)[2] == b"second"
    m, p, body = ch.basic_get("pol-dead", auto_ack=True)
    assert body == b"first" and p.headers["x-death"][0]["reason"] == "maxlen"
    conn.close()
