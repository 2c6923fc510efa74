"""The thin asyncio.Protocol: buffer bytes, hand frames up, pause and resume reading.

This is where back-pressure meets TCP. When the connection says it is blocked
(credit flow or an alarm) the protocol stops decoding what it has buffered and
calls ``transport.pause_reading()``; the kernel's receive window then fills and
the publisher's writes stall. ``pause_writing``/``resume_writing`` from the
transport tell queues to stop pushing deliveries to a client that is not
reading.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from broker_impl.codec import (
    PROTOCOL_HEADER,
    AMQPError,
    BadProtocolHeader,
    ConnectionError_,
    FrameDecoder,
)
from broker_impl.connection import Connection

if TYPE_CHECKING:
    from broker_impl.broker import Broker

log = logging.getLogger("broker_impl.protocol")

MAX_BUFFER = 4 * 1024 * 1024  # never hold more than this of unread input while paused
WRITE_BATCH = 64 * 1024  # output held for the end of the event loop's turn is written once it reaches this


class AMQPProtocol(asyncio.Protocol):
    def __init__(self, broker: Broker, on_close: object = None) -> None:
        self.broker = broker
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(broker.config.frame_max)
        self.conn: Connection | None = None
        self._reading_paused = False
        self._decoding = False
        self._dead = False
        self._out: list[bytes] = []  # written by the end of this turn of the event loop
        self._out_bytes = 0

    # -- asyncio callbacks -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        peername = transport.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        refusal = self.broker.client_refusal()  # paused (pause_minority) or not yet synced after a start
        if refusal is not None:
            log.info("refusing AMQP connection %s: node %s", peer, refusal)
            self._dead = True
            transport.close()
            return
        self.conn = Connection(self.broker, self, peer)
        self.broker.connections.add(self.conn)
        transport.set_write_buffer_limits(high=1024 * 1024, low=256 * 1024)  # type: ignore[attr-defined]
        log.info("accepting AMQP connection %s", peer)

    def data_received(self, data: bytes) -> None:
        if self._dead:
            return
        self.decoder.feed(data)
        self._decode()
        if self.decoder.buffered > MAX_BUFFER and not self._reading_paused:
            self._pause()

    def connection_lost(self, exc: Exception | None) -> None:
        self._dead = True
        if self.conn is not None:
            self.conn.connection_lost()
            self.broker.connections.discard(self.conn)

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.write_paused = True

    def resume_writing(self) -> None:
        if self.conn is None:
            return
        self.conn.write_paused = False
        for ch in list(self.conn.channels.values()):
            for c in ch.consumers.values():
                c.queue.kick()

    # -- decoding ----------------------------------------------------------------------
    def _decode(self) -> None:
        if self._decoding:
            return
        self._decoding = True
        conn = self.conn
        assert conn is not None
        try:
            while not self._dead:
                if conn.reading_blocked:
                    self._pause()
                    return
                try:
                    d = self.decoder.next_frame()
                except ConnectionError_ as exc:
                    self._dead = True  # the byte stream is unusable past a framing error
                    conn.close_with(exc, immediately=True)
                    return
                if d is None:
                    break
                conn.frame_received(d.channel, d.frame)
        except BadProtocolHeader:
            # The spec: answer with the header we do speak, then close.
            self._write_raw(PROTOCOL_HEADER)
            self._dead = True
            self.close()
        except AMQPError as exc:
            if not isinstance(exc, ConnectionError_):
                exc = ConnectionError_(exc.code, exc.text, exc.class_id, exc.method_id)
            conn.close_with(exc)
        except Exception:
            log.exception("internal error on connection %s", conn.peer)
            self._dead = True
            conn.close_with(ConnectionError_(541, "internal error"), immediately=True)
        finally:
            self._decoding = False
        if self._reading_paused and not conn.reading_blocked and self.decoder.buffered <= MAX_BUFFER:
            self._resume()

    def _pause(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self._reading_paused and self.transport is not None and not self.transport.is_closing():
            self._reading_paused = False
            self.transport.resume_reading()

    # -- the Transport interface the connection uses --------------------------------------
    def write(self, data: bytes) -> None:
        """Frames written in one turn of the event loop (deliveries, confirms) leave in one socket write."""
        if self.transport is None or self.transport.is_closing():
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= WRITE_BATCH:
            self._flush()

    def _flush(self) -> None:
        if self._out:
            data = b"".join(self._out)
            self._out.clear()
            self._out_bytes = 0
            self._write_raw(data)

    def _write_raw(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        self._flush()  # what was written before the close goes out first
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def set_frame_max(self, frame_max: int) -> None:
        self.decoder.frame_max = frame_max

    def reading_state_changed(self) -> None:
        """The connection's blocked state may have changed: pause, or resume and decode what is buffered."""
        conn = self.conn
        if conn is None or self._dead:
            return
        if conn.reading_blocked:
            if self._decoding:
                return  # the decode loop checks before the next frame
            self._pause()
        elif self._reading_paused or self.decoder.buffered:
            if self._decoding:
                return
            asyncio.get_running_loop().call_soon(self._resume_and_decode)

    def _resume_and_decode(self) -> None:
        if self._dead or self.conn is None or self.conn.reading_blocked:
            return
        self._decode()
        if not self.conn.reading_blocked:
            self._resume()
