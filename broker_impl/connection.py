"""The connection state machine: handshake, channel 0, content assembly, heartbeats, blocking.

It is the *reader* of RabbitMQ's credit-flow chain: it spends credit on each
channel it hands a publish to, and when any channel (transitively, a queue or
the store) has run it out of credit it asks the protocol to stop reading the
socket. It only does so after the client has published, so consumers never
stall. Resource alarms block it the same way and, for clients that advertise
the capability, say so with connection.blocked/unblocked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from pamqp import body as pbody
from pamqp import commands, decode, header, heartbeat
from pamqp.base import Frame as MethodFrame

from broker_impl.channel import Channel
from broker_impl.codec import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
    AMQPError,
    ChannelError,
    ConnectionError_,
    encode_heartbeat,
    encode_method,
)
from broker_impl.flow import Actor

if TYPE_CHECKING:
    from broker_impl.broker import Broker
    from broker_impl.vhost import VHost

log = logging.getLogger("broker_impl.connection")

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": False,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": False,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": False,
}

CLOSE_OK_TIMEOUT = 3.0


class Transport(Protocol):
    """What the connection needs from the protocol layer below it."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def set_frame_max(self, frame_max: int) -> None: ...

    def reading_state_changed(self) -> None: ...


class Connection(Actor):
    def __init__(self, broker: Broker, transport: Transport, peer: str) -> None:
        super().__init__(broker.flow_enabled, f"connection {peer}")
        self.broker = broker
        self.transport = transport
        self.peer = peer
        cfg = broker.config
        self.frame_max = cfg.frame_max
        self.channel_max = cfg.channel_max
        self.heartbeat = cfg.heartbeat
        self.state = "handshake"  # handshake -> start -> tune -> open -> running -> closing -> closed
        self.user = ""
        self.vhost: VHost = None  # type: ignore[assignment]
        self.client_properties: dict[str, Any] = {}
        self.channels: dict[int, Channel] = {}
        self._assembly: dict[int, list[Any]] = {}  # channel -> [method, props, size, chunks, got]
        self.has_published = False
        self._published_since_alarm = False
        self.write_paused = False
        self._blocked_sent = False
        self._last_recv = time.monotonic()
        self._last_send = time.monotonic()
        self._hb_task: asyncio.Task[None] | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self.close_reason = ""
        self.opened_at = time.time()
        self.counters = {"published": 0, "delivered": 0}

    # -- outbound ----------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.state == "closed":
            return
        self._last_send = time.monotonic()
        self.transport.write(data)

    @property
    def reader(self) -> Actor:
        """The reader as a stage of credit flow: each publish it hands a channel costs a credit."""
        return self

    def send_method(self, channel: int, method: MethodFrame) -> None:
        self.write(encode_method(channel, method))

    def capability(self, name: str) -> bool:
        caps = self.client_properties.get("capabilities") or {}
        return bool(isinstance(caps, dict) and caps.get(name))

    # -- inbound -----------------------------------------------------------------------
    def frame_received(self, channel: int, frame: Any) -> None:
        self._last_recv = time.monotonic()
        if self.state == "closed":
            return
        if isinstance(frame, heartbeat.Heartbeat):
            return
        if isinstance(frame, header.ProtocolHeader):
            self._send_start()
            return
        if self.state == "closing":
            if channel == 0 and isinstance(frame, commands.Connection.CloseOk | commands.Connection.Close):
                if isinstance(frame, commands.Connection.Close):
                    self.send_method(0, commands.Connection.CloseOk())
                self.terminate()
            return
        if channel == 0:
            self._channel0(frame)
            return
        if self.state != "running":
            raise ConnectionError_(COMMAND_INVALID, f"frame on channel {channel} before connection.open")
        self._channel_frame(channel, frame)

    def _channel0(self, frame: Any) -> None:
        if not isinstance(frame, MethodFrame):
            raise ConnectionError_(UNEXPECTED_FRAME, f"unexpected {type(frame).__name__} frame on channel 0")
        if not frame.name.startswith("Connection."):
            raise ConnectionError_(COMMAND_INVALID, f"{frame.name} on channel 0")
        expected = {
            "start": commands.Connection.StartOk,
            "secure": commands.Connection.SecureOk,
            "tune": commands.Connection.TuneOk,
            "open": commands.Connection.Open,
        }.get(self.state)
        if isinstance(frame, commands.Connection.Close):
            self._client_close(frame)
            return
        if expected is not None and not isinstance(frame, expected):
            raise ConnectionError_(COMMAND_INVALID, f"expected {expected.__name__}, got {frame.name}")
        if isinstance(frame, commands.Connection.StartOk):
            self._start_ok(frame)
        elif isinstance(frame, commands.Connection.TuneOk):
            self._tune_ok(frame)
        elif isinstance(frame, commands.Connection.Open):
            self._open(frame)
        elif isinstance(frame, commands.Connection.CloseOk):
            self.terminate()
        elif isinstance(frame, commands.Connection.Blocked | commands.Connection.Unblocked):
            pass  # clients may tell us they are blocked; nothing to do
        else:
            raise ConnectionError_(COMMAND_INVALID, f"unexpected {frame.name}")

    def _send_start(self) -> None:
        if self.state != "handshake":
            raise ConnectionError_(COMMAND_INVALID, "second protocol header")
        self.state = "start"
        props: dict[str, Any] = {
            "product": "brokerchaos reference broker",
            "version": "0.1.0",
            "platform": "Python/asyncio",
            "cluster_name": self.broker.config.name,
            "capabilities": dict(SERVER_CAPABILITIES),
            "information": "AMQP 0-9-1 reference broker",
        }
        self.send_method(0, commands.Connection.Start(0, 9, props, "PLAIN AMQPLAIN", "en_US"))

    def _start_ok(self, f: commands.Connection.StartOk) -> None:
        self.client_properties = f.client_properties or {}
        user, password = _credentials(f.mechanism, f.response)
        if user is None or not self.broker.authenticate(user, password):
            log.warning("%s: authentication failed for user %r (%s)", self.peer, user, f.mechanism)
            err = ConnectionError_(
                ACCESS_REFUSED,
                f"Login was refused using authentication mechanism {f.mechanism}. For details see the broker logfile.",
            )
            raise err
        self.user = user
        self.state = "tune"
        self.send_method(0, commands.Connection.Tune(self.channel_max, self.frame_max, self.heartbeat))

    def _tune_ok(self, f: commands.Connection.TuneOk) -> None:
        if f.frame_max and (f.frame_max < 4096 or f.frame_max > self.frame_max):
            raise ConnectionError_(NOT_ALLOWED, f"frame_max={f.frame_max} outside 4096..{self.frame_max}")
        if f.frame_max:
            self.frame_max = f.frame_max
        if f.channel_max and f.channel_max > self.channel_max:
            raise ConnectionError_(NOT_ALLOWED, f"channel_max={f.channel_max} > {self.channel_max}")
        if f.channel_max:
            self.channel_max = f.channel_max
        self.heartbeat = f.heartbeat
        self.transport.set_frame_max(self.frame_max)
        self.state = "open"
        if self.heartbeat:
            self._hb_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    def _open(self, f: commands.Connection.Open) -> None:
        vh = self.broker.vhosts.get(f.virtual_host)
        if vh is None:
            raise ConnectionError_(NOT_ALLOWED, f"vhost {f.virtual_host} not found")
        if not self.broker.can_access_vhost(self.user, f.virtual_host):
            raise ConnectionError_(
                NOT_ALLOWED, f"access to vhost '{f.virtual_host}' refused for user '{self.user}'"
            )
        self.vhost = vh
        self.state = "running"
        self.send_method(0, commands.Connection.OpenOk())
        log.info(
            "connection %s opened: user %r vhost %r client %s",
            self.peer,
            self.user,
            vh.name,
            self.client_properties.get("product", "?"),
        )
        if self.broker.alarms:
            self.alarms_changed()

    def _channel_frame(self, ch: int, frame: Any) -> None:
        asm = self._assembly.get(ch)
        if asm is not None:
            self._content_frame(ch, asm, frame)
            return
        if not isinstance(frame, MethodFrame):
            raise ConnectionError_(
                UNEXPECTED_FRAME, f"{type(frame).__name__} frame on channel {ch} without a method"
            )
        if frame.name.startswith("Connection."):
            raise ConnectionError_(COMMAND_INVALID, f"{frame.name} on channel {ch}")
        channel = self.channels.get(ch)
        if channel is None:
            if isinstance(frame, commands.Channel.Open):
                if ch > self.channel_max:
                    raise ConnectionError_(
                        NOT_ALLOWED,
                        f"channel number {ch} exceeds the negotiated channel_max ({self.channel_max})",
                    )
                self.channels[ch] = Channel(self, ch)
                self.send_method(ch, commands.Channel.OpenOk())
                return
            if isinstance(frame, commands.Channel.CloseOk):
                return
            raise ConnectionError_(
                CHANNEL_ERROR, f"expected 'channel.open' on channel {ch}, got {frame.name}"
            )
        if channel.state == "closing":
            # We closed it: drop everything until the client's close-ok (or its own close).
            if isinstance(frame, commands.Channel.CloseOk | commands.Channel.Close):
                channel.finish_close(reply=isinstance(frame, commands.Channel.Close))
            return
        if isinstance(frame, commands.Basic.Publish):
            self._assembly[ch] = [frame, None, 0, [], 0]
            return
        channel.submit(frame)

    def _content_frame(self, ch: int, asm: list[Any], frame: Any) -> None:
        method, props, size, chunks, got = asm
        if props is None:
            if not isinstance(frame, header.ContentHeader):
                raise ConnectionError_(
                    UNEXPECTED_FRAME, f"expected content header on channel {ch}, got {type(frame).__name__}"
                )
            if frame.class_id != 60:
                raise ConnectionError_(UNEXPECTED_FRAME, f"content header for class {frame.class_id}")
            asm[1] = frame.properties
            asm[2] = frame.body_size
            if frame.body_size > self.broker.config.max_message_size:
                asm[3] = None  # read and discard the body, then fail the publish on its channel
            if frame.body_size == 0:
                self._content_done(ch, method, frame.properties, b"")
            return
        if not isinstance(frame, pbody.ContentBody):
            raise ConnectionError_(
                UNEXPECTED_FRAME, f"expected content body on channel {ch}, got {type(frame).__name__}"
            )
        if chunks is not None:
            chunks.append(frame.value)
        got += len(frame.value)
        asm[4] = got
        if got > size:
            raise ConnectionError_(
                UNEXPECTED_FRAME, f"content body exceeds declared size {size} on channel {ch}"
            )
        if got == size:
            if chunks is None:
                del self._assembly[ch]
                channel = self.channels.get(ch)
                if channel is not None:
                    channel.submit_error(
                        ChannelError(
                            PRECONDITION_FAILED,
                            f"message size {size} is larger than max size {self.broker.config.max_message_size}",
                            60,
                            40,
                        )
                    )
                return
            self._content_done(ch, method, props, b"".join(chunks))

    def _content_done(self, ch: int, method: MethodFrame, props: Any, data: bytes) -> None:
        del self._assembly[ch]
        self.has_published = True
        self._published_since_alarm = True
        self.counters["published"] += 1
        channel = self.channels.get(ch)
        if channel is not None:
            channel.submit(method, props, data)
        self.transport.reading_state_changed()

    # -- closing -------------------------------------------------------------------------
    def _client_close(self, f: commands.Connection.Close) -> None:
        """Handle what the channels already received (publishes included), then close-ok."""
        self.close_reason = f"client closed: {f.reply_code} {f.reply_text}"
        self.state = "closing"
        self._close_timer = asyncio.get_running_loop().call_later(CLOSE_OK_TIMEOUT * 10, self.terminate)
        self._drain_task = asyncio.get_running_loop().create_task(self._close_after_drain())

    async def _close_after_drain(self) -> None:
        for ch in list(self.channels.values()):
            await ch.drained()
        if self.state == "closing":
            self._shutdown_channels()
            self.send_method(0, commands.Connection.CloseOk())
            self.terminate()

    def close_with(self, exc: AMQPError, immediately: bool = False) -> None:
        """Hard error: send connection.close and wait (briefly) for close-ok."""
        if self.state in ("closing", "closed"):
            return
        self.close_reason = f"{exc.code} {exc.reply_text}"
        log.error("closing connection %s: %d %s", self.peer, exc.code, exc.reply_text)
        if self.state != "handshake":
            self.send_method(
                0, commands.Connection.Close(exc.code, exc.reply_text, exc.class_id, exc.method_id)
            )
        self.state = "closing"
        self._shutdown_channels()
        if immediately:
            self.terminate()
        else:
            self._close_timer = asyncio.get_running_loop().call_later(CLOSE_OK_TIMEOUT, self.terminate)

    def force_close(self, reason: str = "broker shutdown") -> None:
        self.close_with(ConnectionError_(CONNECTION_FORCED, reason))

    def channel_closed(self, channel: Channel) -> None:
        if self.channels.get(channel.number) is channel:
            del self.channels[channel.number]
        self._assembly.pop(channel.number, None)
        self.transport.reading_state_changed()

    def _shutdown_channels(self) -> None:
        for ch in list(self.channels.values()):
            ch.shutdown()
        self.channels.clear()
        self._assembly.clear()
        for q in self.vhost.owned_by(self) if self.vhost is not None else []:
            self.vhost.delete_queue_soon(q)

    def terminate(self) -> None:
        if self.state == "closed":
            return
        if self.channels or self.vhost is not None:
            self._shutdown_channels()
        self.state = "closed"
        if self._close_timer:
            self._close_timer.cancel()
        if self._hb_task:
            self._hb_task.cancel()
        self.flow_terminate()
        self.transport.close()

    def connection_lost(self) -> None:
        if self.state != "closed":
            if not self.close_reason:
                self.close_reason = "client unexpectedly closed TCP connection"
            self.terminate()
        log.info("connection %s closed: %s", self.peer, self.close_reason or "normal")

    # -- blocking ---------------------------------------------------------------------------
    @property
    def reading_blocked(self) -> bool:
        """Stop reading the socket: credit exhausted or an alarm, but only once the client published."""
        if self.state == "closed":
            return False
        if self.flow_blocked and self.has_published:
            return True
        return self._alarm_blocks and self._published_since_alarm

    @property
    def _alarm_blocks(self) -> bool:
        """Alarms block publishers unless flow control is switched off (they are still raised and logged)."""
        return bool(self.broker.alarms) and self.broker.flow_enabled

    def on_flow_unblocked(self) -> None:
        self.transport.reading_state_changed()

    def alarms_changed(self) -> None:
        if self.state != "running":
            return
        if self._alarm_blocks:
            self._published_since_alarm = False
            if not self._blocked_sent and self.capability("connection.blocked"):
                reason = "low on " + " and ".join(sorted(self.broker.alarms))
                self.send_method(0, commands.Connection.Blocked(reason))
                self._blocked_sent = True
        else:
            if self._blocked_sent:
                self.send_method(0, commands.Connection.Unblocked())
                self._blocked_sent = False
        self.transport.reading_state_changed()

    def operator_state(self) -> str:
        """running | flow | blocking | blocked, as rabbitmqctl list_connections shows them."""
        if self._alarm_blocks:
            return "blocked" if self._published_since_alarm else "blocking"
        return self.flow_state() if self.has_published else "running"

    # -- heartbeats -------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        interval = self.heartbeat / 2
        while self.state not in ("closing", "closed"):
            await asyncio.sleep(interval)
            now = time.monotonic()
            if now - self._last_send >= interval:
                self.write(encode_heartbeat())
            if self.reading_blocked:
                self._last_recv = now  # the silence is ours: we stopped reading
                continue
            if now - self._last_recv > self.heartbeat * 2:
                log.warning("%s: missed heartbeats from client, timeout: %ds", self.peer, self.heartbeat)
                self.close_reason = f"missed heartbeats from client, timeout: {self.heartbeat}s"
                self.terminate()
                return

    def info(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "user": self.user,
            "vhost": self.vhost.name if self.vhost is not None else None,
            "state": self.operator_state(),
            "channels": len(self.channels),
            "client": self.client_properties.get("product", ""),
            "published": self.counters["published"],
        }


def _credentials(mechanism: str, response: Any) -> tuple[str | None, str]:
    raw = response.encode("latin-1") if isinstance(response, str) else bytes(response or b"")
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            return None, ""
        return parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
    if mechanism == "AMQPLAIN":
        try:
            import struct

            _n, table = decode.field_table(struct.pack(">I", len(raw)) + raw)
        except Exception:
            raise ConnectionError_(SYNTAX_ERROR, "malformed AMQPLAIN response") from None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if not isinstance(login, str) or not isinstance(password, str):
            return None, ""
        return login, password
    return None, ""
