"""One AMQP connection of the workload driver, and the socket under it.

A consumer that "crashes" must look to the broker exactly like a killed client
process: the TCP connection drops without a ``connection.close``. aiormq keeps
its socket to itself, so the link opens it through a transport factory that
remembers the stream, and ``abort()`` resets it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq
from aiormq.connection import TCPTransportFactory

from harness.spec.client import reason

CONNECT_TIMEOUT = 5.0
OP_TIMEOUT = 10.0  # any other broker round trip (channel open, qos, consume, declare, recover)

#: What a broker round trip raises when the broker, the network or the channel fails.
BROKER_ERRORS = (TimeoutError, OSError, aiormq.exceptions.AMQPError, RuntimeError)


class _RememberingTcp(TCPTransportFactory):
    def __init__(self) -> None:
        self.writer: asyncio.StreamWriter | None = None

    async def create(self, url: Any, **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await super().create(url, **kwargs)
        self.writer = writer
        return reader, writer


class Link:
    """A connection to one node (through its proxy)."""

    def __init__(self, node: str, conn: aiormq.abc.AbstractConnection, socket: _RememberingTcp) -> None:
        self.node = node
        self.conn = conn
        self._socket = socket
        self.aborted = False

    @classmethod
    async def open(cls, node: str, url: str, timeout: float = CONNECT_TIMEOUT) -> Link:
        socket = _RememberingTcp()
        async with asyncio.timeout(timeout):
            conn = await aiormq.connect(url, transport_factory=socket)
        return cls(node, conn, socket)

    @property
    def closed(self) -> bool:
        return self.aborted or self.conn.is_closed

    def failure(self) -> str:
        """Why the connection is closed, for the records of what was on it."""
        if self.aborted:
            return "connection cut by the client"
        fut = self.conn.closing
        if fut.done() and not fut.cancelled() and fut.exception() is not None:
            return reason(fut.exception())  # type: ignore[arg-type]
        return "connection closed"

    async def channel(self, *, confirms: bool) -> Any:
        async with asyncio.timeout(OP_TIMEOUT):
            return await self.conn.channel(publisher_confirms=confirms)

    def abort(self) -> None:
        """Reset the TCP connection without a close handshake."""
        self.aborted = True
        writer = self._socket.writer
        if writer is not None and writer.transport is not None:
            writer.transport.abort()

    async def close(self, timeout: float = 2.0) -> bool:
        """A clean ``connection.close``; if the broker does not answer in time, abort.

        Returns whether the close completed cleanly.
        """
        if self.conn.is_closed:
            return not self.aborted
        try:
            async with asyncio.timeout(timeout):
                await self.conn.close()
        except asyncio.CancelledError:
            self.abort()
            raise
        except Exception:  # noqa: BLE001 - a close on a dead connection raises all kinds of things
            self.abort()
            await self._reap()
            return False
        return True

    async def _reap(self) -> None:
        """Let aiormq finish its own tasks after an abort (they end on the reset socket)."""
        try:
            async with asyncio.timeout(1.0):
                await self.conn.close()
        except Exception:  # noqa: BLE001
            pass
