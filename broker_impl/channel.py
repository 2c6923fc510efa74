"""One AMQP channel: its methods, deliveries, acks and publisher confirms.

A channel is a stage of credit flow between the reader and the queues: the
connection ``send``s it every publish, and it processes its inbox in its own
task so that a slow channel (or a slow queue behind it) is what blocks the
reader, as in RabbitMQ where the channel is a process of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pamqp import commands
from pamqp.base import Frame as MethodFrame

from broker_impl.backing_queue import Fetched, StoreError
from broker_impl.codec import (
    ACCESS_REFUSED,
    NO_ROUTE,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    AMQPError,
    ChannelError,
    ConnectionError_,
    encode_content,
)
from broker_impl.delayed import DELAYED_TYPE, delay_ms
from broker_impl.flow import Actor
from broker_impl.message import Message
from broker_impl.queue import CONFIRM_RECHECK_S, Consumer, Queue
from broker_impl.tx import Transaction

if TYPE_CHECKING:
    from broker_impl.backing import Store
    from broker_impl.broker import Broker
    from broker_impl.vhost import VHost

log = logging.getLogger("broker_impl.channel")


@dataclass(slots=True)
class Delivery:
    queue: Queue
    seq: int
    consumer: Consumer | None
    message: Message


class ChannelHost(Protocol):
    """What a channel uses of its connection (``broker_impl.connection.Connection``), as
    ``cluster/`` takes its broker as ``ClusterHost``: the broker and the vhost and user it serves,
    the frames it writes, the reader its publishes take credit from, and the close it asks for."""

    broker: Broker
    vhost: VHost
    user: str
    peer: str
    frame_max: int
    write_paused: bool

    @property
    def reader(self) -> Actor:
        """The stage before the channel in credit flow (the connection's reader)."""
        ...

    def write(self, data: bytes) -> None: ...

    def send_method(self, channel: int, method: MethodFrame) -> None: ...

    def capability(self, name: str) -> bool: ...

    def close_with(self, exc: AMQPError, immediately: bool = False) -> None: ...

    def channel_closed(self, channel: Channel) -> None: ...


class Channel(Actor):
    def __init__(self, conn: ChannelHost, number: int) -> None:
        super().__init__(conn.broker.flow_enabled, f"channel {number}")
        self.conn = conn
        self.number = number
        self.state = "open"  # open | closing (we sent close) | closed
        self._inbox: deque[tuple[MethodFrame, commands.Basic.Properties | None, bytes]] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # set whenever the inbox has been fully processed
        self._idle.set()
        self.confirm = False
        self.tx: Transaction | None = None  # set by tx.select: the channel is transactional from then on
        self._publish_seq = 0
        self._pending: dict[int, int] = {}  # confirm seq -> queues still to report
        self._failed: set[int] = set()
        self._done_ack: list[int] = []
        self._done_nack: list[int] = []
        self._flush_scheduled = False
        self._delivery_tag = 0
        self.unacked: dict[int, Delivery] = {}
        self.consumers: dict[str, Consumer] = {}
        self.prefetch_consumer = 0  # applied to consumers created after basic.qos(global=false)
        self.prefetch_channel = 0  # basic.qos(global=true)
        self.unacked_acking = 0  # deliveries that expect an ack
        self.flow_active = True
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"channel:{number}")

    # -- inbox ----------------------------------------------------------------------
    def submit(
        self, method: MethodFrame, props: commands.Basic.Properties | None = None, body: bytes = b""
    ) -> None:
        """Called by the reader; publishes cost one credit on the reader -> channel link."""
        if props is not None:
            self.conn.reader.flow_send(self, self.conn.broker.link_spec)
        self._inbox.append((method, props, body))
        self._idle.clear()
        self._wake.set()

    def submit_error(self, exc: ChannelError) -> None:
        """Fail on this channel in order with the methods before it (an oversize publish)."""
        self._inbox.append((exc, None, b""))  # type: ignore[arg-type]
        self._idle.clear()
        self._wake.set()

    @property
    def inbox_len(self) -> int:
        return len(self._inbox)

    async def drained(self) -> None:
        """Wait until every method already received has been handled (connection.close does)."""
        if self._idle.is_set() or self._task.done():
            return
        waiter = asyncio.ensure_future(self._idle.wait())
        try:
            await asyncio.wait([waiter, self._task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    async def _run(self) -> None:
        try:
            while self.state != "closed":
                await self._wake.wait()
                self._wake.clear()
                handled = 0
                while self._inbox and self.state != "closed":
                    handled += 1
                    if handled % 256 == 0:
                        await asyncio.sleep(0)  # a long inbox must not starve the loop
                        if not self._inbox or self.state == "closed":
                            break
                    method, props, body = self._inbox.popleft()
                    if props is not None:
                        self.flow_ack(self.conn.reader, self.conn.broker.link_spec)
                    if self.state == "closing":
                        continue
                    try:
                        if isinstance(method, AMQPError):
                            raise method
                        await self._handle(method, props, body)
                    except ChannelError as exc:
                        if not exc.class_id:
                            exc.class_id, exc.method_id = _ids(method)
                        self.close_with(exc)
                    except ConnectionError_ as exc:
                        if not exc.class_id:
                            exc.class_id, exc.method_id = _ids(method)
                        self.conn.close_with(exc)
                        return
                    if self.state == "closed":
                        return
                if not self._inbox:
                    self._idle.set()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("channel %d crashed", self.number)
            self.conn.close_with(ConnectionError_(541, "internal error in channel"))

    # -- errors and closing ------------------------------------------------------------
    def close_with(self, exc: AMQPError) -> None:
        """Soft error: close only this channel (RabbitMQ requeues its unacked at once)."""
        log.warning("closing channel %d on %s: %d %s", self.number, self.conn.peer, exc.code, exc.text)
        self.conn.send_method(
            self.number, commands.Channel.Close(exc.code, exc.reply_text, exc.class_id, exc.method_id)
        )
        self.state = "closing"
        self._release_resources()

    def finish_close(self, reply: bool) -> None:
        if reply:
            self.conn.send_method(self.number, commands.Channel.CloseOk())
        self.state = "closed"
        self._inbox.clear()
        self._wake.set()
        self._release_resources()
        self.conn.channel_closed(self)

    def _release_resources(self) -> None:
        """Requeue every unacked delivery (marked redelivered) and drop consumers; idempotent."""
        if self.tx is not None:  # an open transaction rolls back: what its acks took is unacked again
            self._give_back(self.tx)
            self.tx.rollback(self.store)
            self.tx = Transaction()
        for c in list(self.consumers.values()):
            c.queue.remove_consumer(c)
        self.consumers.clear()
        by_queue: dict[Queue, tuple[list[int], list[Consumer | None]]] = {}
        for d in self.unacked.values():
            seqs, cons = by_queue.setdefault(d.queue, ([], []))
            seqs.append(d.seq)
            cons.append(d.consumer)
        self.unacked.clear()
        self.unacked_acking = 0
        for q, (seqs, cons) in by_queue.items():
            for owner in set(cons):
                if owner is not None:
                    owner.unacked = 0
            q.requeue(seqs, None)
        self.flow_terminate()

    def shutdown(self) -> None:
        """The connection is gone: release everything without talking to the client."""
        self.state = "closed"
        self._task.cancel()
        self._inbox.clear()
        self._release_resources()

    # -- delivery (called by queues) -----------------------------------------------------
    def can_deliver(self, consumer: Consumer) -> bool:
        if self.state != "open" or not self.flow_active or self.conn.write_paused:
            return False
        if not consumer.no_ack and self.prefetch_channel and self.unacked_acking >= self.prefetch_channel:
            return False
        return True

    def deliver(self, consumer: Consumer, queue: Queue, fetched: Fetched) -> None:
        self._delivery_tag += 1
        tag = self._delivery_tag
        if not consumer.no_ack:
            self.unacked[tag] = Delivery(queue, fetched.seq, consumer, fetched.message)
            self.unacked_acking += 1
        m = fetched.message
        method = commands.Basic.Deliver(consumer.tag, tag, fetched.redelivered, m.exchange, m.routing_key)
        self.write_content(method, m.properties, m.body)

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The queue went away under the consumer: tell clients that asked (consumer_cancel_notify)."""
        if self.consumers.pop(consumer.tag, None) is None:
            return
        if self.state == "open" and self.conn.capability("consumer_cancel_notify"):
            self.conn.send_method(self.number, commands.Basic.Cancel(consumer.tag, nowait=True))

    # -- confirms ----------------------------------------------------------------------------
    def _confirm_cb(self, seq: int):
        def done(ok: bool) -> None:
            if seq not in self._pending:
                return
            if not ok:
                self._failed.add(seq)
            self._pending[seq] -= 1
            if self._pending[seq] <= 0:
                del self._pending[seq]
                (self._done_nack if seq in self._failed else self._done_ack).append(seq)
                self._failed.discard(seq)
                self._schedule_flush()

        return done

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_confirms)

    def _flush_confirms(self) -> None:
        """Coalesce confirms: one multiple=true ack for everything below the oldest pending seq."""
        self._flush_scheduled = False
        if self.state != "open":
            self._done_ack.clear()
            self._done_nack.clear()
            return
        if self._done_ack and self.conn.broker.confirms_held():
            # A cluster peer was lost and a majority has not been heard from since: the messages may be on
            # the minority's side only (``broker_impl.cluster.partitions``). Asked again shortly; if the node
            # pauses, the connection closes with them unconfirmed.
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(CONFIRM_RECHECK_S, self._flush_confirms)
            return
        oldest = next(iter(self._pending), None)
        for seq in sorted(self._done_nack):
            self.conn.send_method(self.number, commands.Basic.Nack(seq, multiple=False, requeue=False))
        acks = sorted(self._done_ack)
        self._done_ack.clear()
        self._done_nack.clear()
        below = [s for s in acks if oldest is None or s < oldest]
        if len(below) > 1:
            self.conn.send_method(self.number, commands.Basic.Ack(below[-1], multiple=True))
        elif below:
            self.conn.send_method(self.number, commands.Basic.Ack(below[0], multiple=False))
        for s in acks[len(below) :]:
            self.conn.send_method(self.number, commands.Basic.Ack(s, multiple=False))

    # -- method dispatch ----------------------------------------------------------------------
    async def _handle(self, m: MethodFrame, props: commands.Basic.Properties | None, body: bytes) -> None:
        handler = _HANDLERS.get(type(m))
        if handler is None:
            raise ConnectionError_(NOT_IMPLEMENTED, f"method {m.name} not implemented")
        await handler(self, m, props, body)

    @property
    def broker(self) -> Broker:
        return self.conn.broker

    @property
    def vhost(self) -> VHost:
        return self.conn.vhost

    @property
    def store(self) -> Store | None:
        return self.conn.broker.store

    @property
    def sender(self) -> Actor:
        """The channel as the stage that sends to its queues (credit flow)."""
        return self

    def write_content(self, method: MethodFrame, properties: commands.Basic.Properties, body: bytes) -> None:
        """A method with content (a delivery, a get-ok, a return) on this channel."""
        self.conn.write(encode_content(self.number, method, properties, body, self.conn.frame_max))

    def return_unroutable(self, m: Message) -> None:
        """A mandatory publish no queue took goes back to the publisher (``basic.return``, 312)."""
        self.write_content(
            commands.Basic.Return(NO_ROUTE, "NO_ROUTE", m.exchange, m.routing_key), m.properties, m.body
        )

    def _perm(self, kind: str, name: str, what: str = "queue") -> None:
        self.broker.check_permission(self.conn.user, self.conn.vhost.name, kind, name, what)

    def _reply(self, m: MethodFrame) -> None:
        self.conn.send_method(self.number, m)

    # channel class
    async def _channel_close(self, m: commands.Channel.Close, *_: Any) -> None:
        self.finish_close(reply=True)

    async def _channel_close_ok(self, m: commands.Channel.CloseOk, *_: Any) -> None:
        self.finish_close(reply=False)

    async def _channel_flow(self, m: commands.Channel.Flow, *_: Any) -> None:
        self.flow_active = bool(m.active)
        self._reply(commands.Channel.FlowOk(self.flow_active))
        if m.active:
            for c in self.consumers.values():
                c.queue.kick()

    async def _channel_open(self, m: commands.Channel.Open, *_: Any) -> None:
        raise ConnectionError_(504, f"second 'channel.open' seen on channel {self.number}")

    # exchange class
    async def _exchange_declare(self, m: commands.Exchange.Declare, *_: Any) -> None:
        if not m.passive:
            self._perm("configure", m.exchange, "exchange")
        self.conn.vhost.declare_exchange(
            m.exchange,
            m.exchange_type,
            passive=m.passive,
            durable=m.durable,
            auto_delete=m.auto_delete,
            internal=m.internal,
            arguments=m.arguments,
        )
        if not m.nowait:
            self._reply(commands.Exchange.DeclareOk())

    def _exchange_binding_perms(self, m: commands.Exchange.Bind | commands.Exchange.Unbind) -> None:
        # RabbitMQ's checks: write on the destination, read on the source
        self._perm("write", m.destination, "exchange")
        self._perm("read", m.source, "exchange")

    async def _exchange_bind(self, m: commands.Exchange.Bind, *_: Any) -> None:
        self._exchange_binding_perms(m)
        self.conn.vhost.bind_exchange(m.destination, m.source, m.routing_key, m.arguments)
        if not m.nowait:
            self._reply(commands.Exchange.BindOk())

    async def _exchange_unbind(self, m: commands.Exchange.Unbind, *_: Any) -> None:
        self._exchange_binding_perms(m)
        self.conn.vhost.unbind_exchange(m.destination, m.source, m.routing_key, m.arguments)
        if not m.nowait:
            self._reply(commands.Exchange.UnbindOk())

    async def _exchange_delete(self, m: commands.Exchange.Delete, *_: Any) -> None:
        self._perm("configure", m.exchange, "exchange")
        self.conn.vhost.delete_exchange(m.exchange, m.if_unused)
        if not m.nowait:
            self._reply(commands.Exchange.DeleteOk())

    # queue class
    async def _queue_declare(self, m: commands.Queue.Declare, *_: Any) -> None:
        vh = self.conn.vhost
        if m.passive:
            q = vh.get_queue(m.queue, self.conn)
        else:
            name = m.queue
            if name:
                self._perm("configure", name)
            dlx = (m.arguments or {}).get("x-dead-letter-exchange")
            if isinstance(dlx, str):
                # RabbitMQ's check_dlx: dead-lettering publishes on the declarer's behalf
                self._perm("write", dlx, "exchange")
                if name:
                    self._perm("read", name)
            q = await vh.declare_queue(
                name,
                owner=self.conn,
                durable=m.durable,
                exclusive=m.exclusive,
                auto_delete=m.auto_delete,
                arguments=m.arguments,
            )
        if not m.nowait:
            await q.settled()
            self._reply(commands.Queue.DeclareOk(q.name, q.message_count(), q.consumer_count()))

    def _bound_queue(self, m: commands.Queue.Bind | commands.Queue.Unbind) -> Queue:
        """The queue a (un)bind names, once the user may write it and read the exchange."""
        q = self.conn.vhost.get_queue(m.queue, self.conn)
        self._perm("write", q.name)
        self._perm("read", m.exchange, "exchange")
        return q

    async def _queue_bind(self, m: commands.Queue.Bind, *_: Any) -> None:
        q = self._bound_queue(m)
        self.conn.vhost.bind(q, m.exchange, m.routing_key, m.arguments)
        if not m.nowait:
            self._reply(commands.Queue.BindOk())

    async def _queue_unbind(self, m: commands.Queue.Unbind, *_: Any) -> None:
        q = self._bound_queue(m)
        self.conn.vhost.unbind(q, m.exchange, m.routing_key, m.arguments)
        self._reply(commands.Queue.UnbindOk())

    async def _queue_purge(self, m: commands.Queue.Purge, *_: Any) -> None:
        q = self.conn.vhost.get_queue(m.queue, self.conn)
        self._perm("read", q.name)
        await q.settled()
        n = await q.purge()
        if not m.nowait:
            self._reply(commands.Queue.PurgeOk(n))

    async def _queue_delete(self, m: commands.Queue.Delete, *_: Any) -> None:
        vh = self.conn.vhost
        q = vh.queues.get(m.queue)
        if q is None:
            if not m.nowait:  # RabbitMQ >= 3.2: deleting a missing queue succeeds
                self._reply(commands.Queue.DeleteOk(0))
            return
        q = vh.get_queue(m.queue, self.conn)
        self._perm("configure", q.name)
        await q.settled()
        n = await vh.delete_queue(q, m.if_unused, m.if_empty)
        if not m.nowait:
            self._reply(commands.Queue.DeleteOk(n))

    # basic class
    async def _basic_qos(self, m: commands.Basic.Qos, *_: Any) -> None:
        if m.prefetch_size:
            raise ConnectionError_(NOT_IMPLEMENTED, "prefetch_size!=0")
        if m.global_:
            self.prefetch_channel = m.prefetch_count
        else:
            self.prefetch_consumer = m.prefetch_count
        self._reply(commands.Basic.QosOk())
        for c in self.consumers.values():
            c.queue.kick()

    async def _basic_consume(self, m: commands.Basic.Consume, *_: Any) -> None:
        q = self.conn.vhost.get_queue(m.queue, self.conn)
        self._perm("read", q.name)
        tag = m.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
        if tag in self.consumers:
            raise ConnectionError_(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        if any(c.exclusive for c in q.consumers):
            raise ChannelError(ACCESS_REFUSED, f"queue '{q.name}' in vhost '{q.vhost.name}' in exclusive use")
        if m.exclusive and q.consumers:
            raise ChannelError(
                ACCESS_REFUSED, f"cannot obtain exclusive access to queue '{q.name}', it has consumers"
            )
        c = Consumer(
            tag, self, q, m.no_ack, m.exclusive, self.prefetch_consumer, arguments=dict(m.arguments or {})
        )
        self.consumers[tag] = c
        if not m.nowait:
            self._reply(commands.Basic.ConsumeOk(tag))
        q.add_consumer(c)

    async def _basic_cancel(self, m: commands.Basic.Cancel, *_: Any) -> None:
        c = self.consumers.pop(m.consumer_tag or "", None)
        if c is not None:
            c.queue.remove_consumer(c)
        if not m.nowait:
            self._reply(commands.Basic.CancelOk(m.consumer_tag))

    async def _basic_publish(
        self, m: commands.Basic.Publish, props: commands.Basic.Properties | None, body: bytes
    ) -> None:
        vh = self.conn.vhost
        ex = vh.get_exchange(m.exchange)
        self._perm("write", m.exchange, "exchange")
        if ex.internal:
            raise ChannelError(ACCESS_REFUSED, f"cannot publish to internal exchange '{m.exchange}'")
        refusal = self.conn.broker.publish_refusal()
        if refusal is not None:
            raise ChannelError(ACCESS_REFUSED, refusal)
        if m.immediate:
            raise ConnectionError_(NOT_IMPLEMENTED, "immediate=true")
        assert props is not None
        seq = 0
        if self.confirm:
            self._publish_seq += 1
            seq = self._publish_seq
        delay = delay_ms(props) if ex.type == DELAYED_TYPE else None
        if delay is not None:
            self._hold_back(vh.name, Message(m.exchange, m.routing_key, props, body), delay, seq)
            return
        queues = vh.route(ex, m.routing_key, props)
        if self.tx is not None:
            self.tx.publish(self.store, Message(m.exchange, m.routing_key, props, body), queues, m.mandatory)
            return
        if not queues:
            if m.mandatory:
                self.return_unroutable(Message(m.exchange, m.routing_key, props, body))
            if seq:
                self._done_ack.append(seq)
                self._schedule_flush()
            return
        cb = None
        if seq:
            self._pending[seq] = len(queues)
            cb = self._confirm_cb(seq)
        for q in queues:
            q.enqueue(Message(m.exchange, m.routing_key, props, body), self, cb)

    def _hold_back(self, vhost: str, message: Message, delay: int, seq: int) -> None:
        """A delayed exchange's publish goes to the schedule; its confirm waits for the schedule's flush."""
        cb = None
        if seq:
            self._pending[seq] = 1
            cb = self._confirm_cb(seq)
        try:
            durable = self.conn.broker.scheduler.schedule(vhost, message, delay)
        except StoreError:
            if cb is not None:
                cb(False)
            return

        async def confirm() -> None:
            ok = True
            try:
                await durable
            except StoreError:
                ok = False
            if cb is not None:
                cb(ok)

        self.conn.broker.spawn(confirm())

    async def _basic_get(self, m: commands.Basic.Get, *_: Any) -> None:
        q = self.conn.vhost.get_queue(m.queue, self.conn)
        self._perm("read", q.name)
        await q.settled()
        f = q.get(m.no_ack)
        if inspect.isawaitable(f):  # a queue mastered on another node answers over the cluster link
            f = await f
        if f is None:
            self._reply(commands.Basic.GetEmpty())
            return
        self._delivery_tag += 1
        tag = self._delivery_tag
        if not m.no_ack:
            self.unacked[tag] = Delivery(q, f.seq, None, f.message)
            self.unacked_acking += 1
        msg = f.message
        self.write_content(
            commands.Basic.GetOk(tag, f.redelivered, msg.exchange, msg.routing_key, q.message_count()),
            msg.properties,
            msg.body,
        )

    def _take(self, tag: int, multiple: bool) -> list[Delivery]:
        out = [d for _, d in self._take_tagged(tag, multiple)]
        self.unacked_acking -= len(out)
        return out

    def _take_tagged(self, tag: int, multiple: bool) -> list[tuple[int, Delivery]]:
        """Take deliveries off the channel; they still count against prefetch (a transaction's until its commit)."""
        if multiple:
            tags = [t for t in self.unacked if t <= tag] if tag else list(self.unacked)
        else:
            tags = [tag] if tag in self.unacked else []
        if not tags and not (multiple and tag == 0):
            raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        return [(t, self.unacked.pop(t)) for t in tags]

    def _give_back(self, tx: Transaction) -> None:
        """Deliveries a transaction's acks took are unacked again (rollback, or the channel closing)."""
        for tag, d in tx.held():
            self.unacked[tag] = d
        self.unacked = dict(sorted(self.unacked.items()))

    @staticmethod
    def _group(ds: list[Delivery]) -> dict[tuple[Queue, Consumer | None], list[Delivery]]:
        g: dict[tuple[Queue, Consumer | None], list[Delivery]] = {}
        for d in ds:
            g.setdefault((d.queue, d.consumer), []).append(d)
        return g

    async def _basic_ack(self, m: commands.Basic.Ack, *_: Any) -> None:
        if self.tx is not None:
            self.tx.settle(self._take_tagged(m.delivery_tag, m.multiple), None)
            return
        for (q, c), ds in self._group(self._take(m.delivery_tag, m.multiple)).items():
            await q.ack([d.seq for d in ds], c)

    async def _settle(self, tag: int, multiple: bool, requeue: bool, transactional: bool = True) -> None:
        if self.tx is not None and transactional:
            self.tx.settle(self._take_tagged(tag, multiple), requeue)
            return
        for (q, c), ds in self._group(self._take(tag, multiple)).items():
            if requeue:
                q.requeue([d.seq for d in ds], c)
            else:
                await q.reject_messages([(d.seq, d.message) for d in ds], c)

    async def _basic_reject(self, m: commands.Basic.Reject, *_: Any) -> None:
        await self._settle(m.delivery_tag or 0, False, bool(m.requeue))

    async def _basic_nack(self, m: commands.Basic.Nack, *_: Any) -> None:
        await self._settle(m.delivery_tag, m.multiple, m.requeue)

    async def _basic_recover(self, m: commands.Basic.Recover, *_: Any) -> None:
        if self.unacked:
            await self._settle(0, True, True, transactional=False)  # basic.recover is not part of a tx
        self._reply(commands.Basic.RecoverOk())

    async def _basic_recover_async(self, m: commands.Basic.RecoverAsync, *_: Any) -> None:
        if self.unacked:
            await self._settle(0, True, True, transactional=False)  # basic.recover is not part of a tx

    async def _confirm_select(self, m: commands.Confirm.Select, *_: Any) -> None:
        if self.tx is not None:
            raise ChannelError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        self.confirm = True
        if not m.nowait:
            self._reply(commands.Confirm.SelectOk())

    # tx class (broker_impl.tx)
    async def _tx_select(self, m: commands.Tx.Select, *_: Any) -> None:
        if self.confirm:
            raise ChannelError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = Transaction()
        self._reply(commands.Tx.SelectOk())

    def _open_tx(self) -> Transaction:
        if self.tx is None:
            raise ChannelError(PRECONDITION_FAILED, "channel is not transactional")
        tx, self.tx = self.tx, Transaction()
        return tx

    async def _tx_commit(self, m: commands.Tx.Commit, *_: Any) -> None:
        await self._open_tx().commit(self)
        self._reply(commands.Tx.CommitOk())

    async def _tx_rollback(self, m: commands.Tx.Rollback, *_: Any) -> None:
        tx = self._open_tx()
        self._give_back(tx)
        tx.rollback(self.store)
        self._reply(commands.Tx.RollbackOk())


def _ids(m: MethodFrame) -> tuple[int, int]:
    idx = getattr(m, "index", 0) or 0
    return idx >> 16, idx & 0xFFFF


_HANDLERS: dict[type, Any] = {
    commands.Channel.Close: Channel._channel_close,
    commands.Channel.CloseOk: Channel._channel_close_ok,
    commands.Channel.Flow: Channel._channel_flow,
    commands.Channel.Open: Channel._channel_open,
    commands.Exchange.Declare: Channel._exchange_declare,
    commands.Exchange.Delete: Channel._exchange_delete,
    commands.Exchange.Bind: Channel._exchange_bind,
    commands.Exchange.Unbind: Channel._exchange_unbind,
    commands.Queue.Declare: Channel._queue_declare,
    commands.Queue.Bind: Channel._queue_bind,
    commands.Queue.Unbind: Channel._queue_unbind,
    commands.Queue.Purge: Channel._queue_purge,
    commands.Queue.Delete: Channel._queue_delete,
    commands.Basic.Qos: Channel._basic_qos,
    commands.Basic.Consume: Channel._basic_consume,
    commands.Basic.Cancel: Channel._basic_cancel,
    commands.Basic.Publish: Channel._basic_publish,
    commands.Basic.Get: Channel._basic_get,
    commands.Basic.Ack: Channel._basic_ack,
    commands.Basic.Reject: Channel._basic_reject,
    commands.Basic.Nack: Channel._basic_nack,
    commands.Basic.Recover: Channel._basic_recover,
    commands.Basic.RecoverAsync: Channel._basic_recover_async,
    commands.Confirm.Select: Channel._confirm_select,
    commands.Tx.Select: Channel._tx_select,
    commands.Tx.Commit: Channel._tx_commit,
    commands.Tx.Rollback: Channel._tx_rollback,
}
