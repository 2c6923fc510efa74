"""The slave's side: RocketMQ's HAClient. Pull the master's commit log into a replica and report.

The replica is a store of its own (``<data_dir>/replica``) holding the master's
log byte for byte at the same offsets, with consume queues built as records
arrive. After each batch the slave reports the offset up to which the replica is
as safe as its own ``[store] flush`` makes it (RocketMQ reports what it wrote:
with ``flush = "async"`` on the slave that is the same thing).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from broker_impl.backing_queue import StoreError
from broker_impl.replication import wire
from broker_impl.replication.config import ReplicationConfig
from broker_impl.replication.link import LINK_ERRORS, Link
from broker_impl.store import Store

log = logging.getLogger("broker_impl.replication")

RETRY = 0.5  # seconds between connection attempts
REFUSED_RETRY = 5.0  # after the master refused this replica


class Slave:
    def __init__(
        self,
        cfg: ReplicationConfig,
        replica: Store,
        apply_metadata: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        assert cfg.master is not None
        self.cfg = cfg
        self.replica = replica
        self.apply_metadata = apply_metadata
        self.connected = False
        self.reported = -1
        self.refused: str | None = None
        self.sent_back = 0  # bytes handed back to a master that had lost them
        self._task: asyncio.Task[None] | None = None
        self._reports: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._reports) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.replica.close()

    def status(self) -> dict[str, Any]:
        host, port = self.cfg.master or ("", 0)
        return {
            "role": "slave",
            "master": f"{host}:{port}",
            "connected": self.connected,
            "replica_end": self.replica.end,
            "reported": self.reported,
            "sent_back": self.sent_back,
            "refused": self.refused,
        }

    async def _run(self) -> None:
        host, port = self.cfg.master or ("", 0)
        last_error = ""
        while True:
            delay = RETRY
            try:
                async with asyncio.timeout(self.cfg.dead_after_ms / 1000):
                    reader, writer = await asyncio.open_connection(host, port)
            except LINK_ERRORS as exc:
                if str(exc) != last_error:
                    log.warning("cannot reach master %s:%d: %s", host, port, exc or type(exc).__name__)
                    last_error = str(exc)
                await asyncio.sleep(delay)
                continue
            link = Link(reader, writer)
            try:
                await self._session(link)
            except (*LINK_ERRORS, StoreError) as exc:
                why = str(exc) or type(exc).__name__
                if self.connected:  # a proxy in between accepts even while the master is down: quiet then
                    log.warning("link to master %s:%d lost: %s", host, port, why)
                elif why != last_error:
                    log.warning("master %s:%d not answering: %s", host, port, why)
                last_error = why
                if self.refused is not None:
                    delay = REFUSED_RETRY
            finally:
                self.connected = False
                link.close()
            await asyncio.sleep(delay)

    async def _session(self, link: Link) -> None:
        dead = self.cfg.dead_after_ms / 1000
        hello = {
            "node": self.cfg.node,
            "segment_bytes": self.replica.config.segment_bytes,
            "end": self.replica.end,
        }
        await link.send(wire.encode_json(wire.HELLO, hello), dead)
        beat = asyncio.get_running_loop().create_task(self._heartbeat(link))
        try:
            while True:
                try:
                    frame = await link.recv(dead)
                except TimeoutError:
                    raise TimeoutError(f"master silent for {dead:g} s") from None
                if not self.connected:
                    self.connected, self.refused = True, None
                    log.info("attached to master %s; the replica ended at %d", link.peer, hello["end"])
                await self._handle(link, frame)
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)

    async def _handle(self, link: Link, frame: wire.Frame) -> None:
        if frame.kind == wire.DATA:
            offset, data = frame.data()
            if data:
                end = self.replica.append_replicated(offset, data)
                task = asyncio.get_running_loop().create_task(self._report_when_safe(link, end))
                self._reports.add(task)
                task.add_done_callback(self._reports.discard)
        elif frame.kind == wire.META:
            await self.apply_metadata(frame.json())
        elif frame.kind == wire.SEND:
            await self._send_back(link, frame.json())
        elif frame.kind == wire.REFUSE:
            self.refused = str(frame.json().get("reason", "?"))
            log.error("master refused this replica: %s", self.refused)
            raise ConnectionResetError("refused by the master")
        else:
            raise wire.WireError(f"unexpected {wire.KINDS[frame.kind]} from the master")

    async def _report_when_safe(self, link: Link, end: int) -> None:
        try:
            await self.replica.wait_durable(end)
            if end > self.reported:
                self.reported = end
                await link.send(wire.encode_offset(wire.REPORT, end), self.cfg.dead_after_ms / 1000)
        except (*LINK_ERRORS, StoreError):
            pass  # the session notices a dead link itself; a failed replica stops the node

    async def _heartbeat(self, link: Link) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat_ms / 1000)
            await link.send(
                wire.encode_offset(wire.REPORT, max(self.reported, 0)), self.cfg.dead_after_ms / 1000
            )

    async def _send_back(self, link: Link, ask: dict[str, Any]) -> None:
        """A master back from an abnormal stop lost its log's tail: give it what this replica has."""
        pos, to = ask.get("from"), ask.get("to")
        if not isinstance(pos, int) or not isinstance(to, int):
            raise wire.WireError(f"SEND needs offsets, got {ask!r}")
        start = pos
        dead = self.cfg.dead_after_ms / 1000
        while pos < min(to, self.replica.end):
            data, nxt = self.replica.read_raw(pos)
            if nxt == pos:
                raise StoreError(f"no whole record at replica offset {pos}")
            await link.send(wire.encode_offset(wire.DATA, pos, data), dead)
            pos = nxt
        await link.send(wire.encode_json(wire.SENT, {"end": pos}), dead)
        self.sent_back += pos - start
        log.warning("handed back %d bytes (offsets %d..%d) to the master", pos - start, start, pos)
