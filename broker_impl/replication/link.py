"""One master-slave TCP connection carrying ``wire`` frames, every read bounded by a deadline."""

from __future__ import annotations

import asyncio

from broker_impl.replication.wire import Decoder, Frame, WireError


class Link:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._decoder = Decoder()
        self._frames: list[Frame] = []

    @property
    def peer(self) -> str:
        peer = self.writer.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"

    async def recv(self, timeout: float) -> Frame:
        """The next frame; TimeoutError when the peer said nothing for ``timeout`` seconds
        (a partition that drops packets keeps the socket open: only silence shows it)."""
        while not self._frames:
            async with asyncio.timeout(timeout):
                data = await self.reader.read(256 * 1024)
            if not data:
                raise ConnectionResetError("the peer closed the connection")
            self._frames.extend(self._decoder.feed(data))
        return self._frames.pop(0)

    async def send(self, frame: bytes, timeout: float) -> None:
        """Write a frame; TimeoutError when the peer stopped reading for ``timeout`` seconds."""
        self.writer.write(frame)
        async with asyncio.timeout(timeout):
            await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


LINK_ERRORS = (OSError, WireError, TimeoutError, asyncio.IncompleteReadError)
