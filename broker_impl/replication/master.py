"""The master's side: RocketMQ's HAService, HAConnection and GroupTransferService in asyncio.

Slaves connect to the master's replication port and report where their replica
ends; the master streams its commit log from there (whole records, byte for
byte, at the same offsets) and the slave reports back how far its copy is safe.
A SYNC master's publish waits for that report to pass the message's end offset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker_impl.backing_queue import StoreError
from broker_impl.cluster.transport import resolve_listen
from broker_impl.errors import cannot_listen
from broker_impl.replication import wire
from broker_impl.replication.config import ReplicationConfig
from broker_impl.replication.link import LINK_ERRORS, Link
from broker_impl.store import Store

log = logging.getLogger("broker_impl.replication")


@dataclass(slots=True, eq=False)
class SlaveConn:
    node: str
    peer: str
    acked: int  # the slave's replica is safe below this offset
    sent: int  # streamed up to here
    new_data: asyncio.Event = field(default_factory=asyncio.Event)
    meta_due: bool = True


class Master:
    def __init__(self, cfg: ReplicationConfig, store: Store, metadata: Callable[[], dict[str, Any]]) -> None:
        self.cfg = cfg
        self.store = store
        self.metadata = metadata
        self.slaves: set[SlaveConn] = set()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._catching_up = False
        self._caught_up = asyncio.Event()
        self.caught_up_bytes = 0

    # -- start / stop ---------------------------------------------------------------------

    async def start(self, catch_up: bool) -> None:
        """Listen for slaves; with ``catch_up`` (the last stop was abnormal) return only once a
        slave has handed back whatever it holds beyond this log's end.

        With ``flush: async`` an abnormal stop can cost the log a tail this master
        confirmed; a slave that pulled it still has it. Serving clients first would
        hand out a shorter log and append new records where the slave holds those.
        """
        self._catching_up = catch_up
        host = resolve_listen(self.cfg.listen)
        try:
            self._server = await asyncio.start_server(self._accepted, host, self.cfg.port, reuse_address=True)
        except OSError as exc:
            raise cannot_listen("slaves", "replication.port", host, self.cfg.port, exc) from exc
        log.info("replication (%s) listening on %s:%d for slaves", self.cfg.role, host, self.cfg.port)
        if not catch_up:
            return
        log.warning(
            "the last stop was abnormal: waiting for a slave to hand back what it holds beyond "
            "offset %d before serving clients",
            self.store.end,
        )
        while True:
            try:
                async with asyncio.timeout(10):
                    await self._caught_up.wait()
                return
            except TimeoutError:
                log.warning(
                    "still waiting for a slave before serving clients (log ends at %d)", self.store.end
                )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._fail_waiters(StoreError("the node is stopping"))

    # -- what the broker and the store call --------------------------------------------------

    def appended(self) -> None:
        for s in self.slaves:
            s.new_data.set()

    def metadata_changed(self) -> None:
        for s in self.slaves:
            s.meta_due = True
            s.new_data.set()

    def acked(self) -> int:
        """How far the best slave's replica is safe (RocketMQ's push2SlaveMaxOffset); -1: no slave."""
        return max((s.acked for s in self.slaves), default=-1)

    async def wait_replicated(self, end: int) -> None:
        """A SYNC master's confirm: wait until a slave has the log up to ``end``.

        RocketMQ answers SLAVE_NOT_AVAILABLE at once when no slave is connected or
        the best one is more than haMaxGapNotInSync behind, and FLUSH_SLAVE_TIMEOUT
        after syncFlushTimeout; the producer still gets its send result. Here both
        raise StoreError, so the publisher gets a nack, never a confirm: the
        message stays in the master's log (and may be delivered), unconfirmed.
        """
        acked = self.acked()
        if acked >= end:
            return
        if acked < 0 or self.store.end - acked > self.cfg.max_lag_bytes:
            why = "no slave connected" if acked < 0 else f"the slave is {self.store.end - acked} bytes behind"
            raise StoreError(f"SLAVE_NOT_AVAILABLE: {why}")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((end, fut))
        try:
            async with asyncio.timeout(self.cfg.sync_timeout_ms / 1000):
                await asyncio.shield(fut)
        except TimeoutError:
            raise StoreError(
                f"FLUSH_SLAVE_TIMEOUT: no slave reported offset {end} within {self.cfg.sync_timeout_ms} ms"
            ) from None
        finally:
            if not fut.done():
                fut.cancel()

    def status(self) -> dict[str, Any]:
        return {
            "role": self.cfg.role,
            "log_end": self.store.end,
            "serving": not self._catching_up,
            "caught_up_bytes": self.caught_up_bytes,
            "slaves": sorted(
                ({"node": s.node, "peer": s.peer, "acked": s.acked, "sent": s.sent} for s in self.slaves),
                key=lambda s: str(s["node"]),
            ),
        }

    # -- one slave ----------------------------------------------------------------------------

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(Link(reader, writer)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, link: Link) -> None:
        conn: SlaveConn | None = None
        try:
            conn = await self._handshake(link)
            if conn is None:
                return
            self.slaves.add(conn)
            log.info(
                "slave %s (%s) attached at offset %d; log ends at %d",
                conn.node,
                conn.peer,
                conn.sent,
                self.store.end,
            )
            stream = asyncio.get_running_loop().create_task(self._stream(link, conn))
            listen = asyncio.get_running_loop().create_task(self._listen(link, conn))
            try:
                done, _ = await asyncio.wait({stream, listen}, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    t.result()
            finally:
                for t in (stream, listen):
                    t.cancel()
                await asyncio.gather(stream, listen, return_exceptions=True)
        except (*LINK_ERRORS, StoreError) as exc:
            who = conn.node if conn is not None else link.peer
            log.warning("slave %s detached: %s", who, exc or type(exc).__name__)
        finally:
            if conn is not None:
                self.slaves.discard(conn)
            link.close()

    async def _handshake(self, link: Link) -> SlaveConn | None:
        dead = self.cfg.dead_after_ms / 1000
        first = await link.recv(dead)
        if first.kind != wire.HELLO:
            raise wire.WireError(f"expected HELLO, got {wire.KINDS[first.kind]}")
        hello = first.json()
        node, end, seg = str(hello.get("node", "?")), hello.get("end"), hello.get("segment_bytes")
        if not isinstance(end, int) or end < 0:
            raise wire.WireError(f"HELLO end {end!r} is not an offset")
        if seg != self.store.config.segment_bytes:
            await self._refuse(
                link,
                node,
                f"segment_bytes {seg} differs from the master's "
                f"{self.store.config.segment_bytes}: set [store] segment_bytes the same",
            )
            return None
        if end > self.store.end and self._catching_up:
            await self._take_back(link, node, end)
        elif end > self.store.end:
            await self._refuse(
                link,
                node,
                f"the replica ends at {end}, beyond the master's log end "
                f"{self.store.end}: it is not a copy of this log; move it away",
            )
            return None
        first_offset = self.store.first_offset()
        if end < first_offset:
            if end != 0:
                await self._refuse(
                    link,
                    node,
                    f"the replica ends at {end} but the master's log now "
                    f"starts at {first_offset}: move the replica away to copy afresh",
                )
                return None
            end = first_offset
        if self._catching_up:
            self._catching_up = False
            self._caught_up.set()
        return SlaveConn(node, link.peer, acked=end, sent=end)

    async def _take_back(self, link: Link, node: str, their_end: int) -> None:
        """Pull the replica's bytes beyond our log end into our store, durably, before serving."""
        mine = self.store.end
        dead = self.cfg.dead_after_ms / 1000
        await link.send(wire.encode_json(wire.SEND, {"from": mine, "to": their_end}), dead)
        while True:
            frame = await link.recv(dead)
            if frame.kind == wire.SENT:
                break
            if frame.kind != wire.DATA:
                raise wire.WireError(f"expected DATA or SENT, got {wire.KINDS[frame.kind]}")
            offset, data = frame.data()
            self.store.append_replicated(offset, data)
        await self.store.flush()
        self.caught_up_bytes += self.store.end - mine
        log.warning(
            "took back %d bytes (offsets %d..%d) from slave %s that this log had lost",
            self.store.end - mine,
            mine,
            self.store.end,
            node,
        )

    async def _refuse(self, link: Link, node: str, reason: str) -> None:
        log.error("refusing slave %s: %s", node, reason)
        await link.send(wire.encode_json(wire.REFUSE, {"reason": reason}), self.cfg.dead_after_ms / 1000)

    async def _stream(self, link: Link, conn: SlaveConn) -> None:
        """RocketMQ's WriteSocketService: whole records from where the slave is, a heartbeat when idle."""
        beat = self.cfg.heartbeat_ms / 1000
        dead = self.cfg.dead_after_ms / 1000
        while True:
            conn.new_data.clear()
            if conn.meta_due:
                conn.meta_due = False
                await link.send(wire.encode_json(wire.META, self.metadata()), dead)
            if conn.sent < self.store.end:
                data, nxt = self.store.read_raw(conn.sent)
                if nxt == conn.sent:
                    raise StoreError(f"no whole record at offset {conn.sent} to send")
                await link.send(wire.encode_offset(wire.DATA, conn.sent, data), dead)
                conn.sent = nxt
                continue
            try:
                async with asyncio.timeout(beat):
                    await conn.new_data.wait()
            except TimeoutError:
                await link.send(wire.encode_offset(wire.DATA, conn.sent), dead)

    async def _listen(self, link: Link, conn: SlaveConn) -> None:
        """RocketMQ's ReadSocketService: the slave's reports; silence for dead_after drops it."""
        dead = self.cfg.dead_after_ms / 1000
        while True:
            try:
                frame = await link.recv(dead)
            except TimeoutError:
                raise TimeoutError(f"silent for {dead:g} s") from None
            if frame.kind != wire.REPORT:
                raise wire.WireError(f"expected REPORT, got {wire.KINDS[frame.kind]}")
            offset = frame.offset()
            if offset > conn.acked:
                conn.acked = offset
                self._wake_waiters()

    def _wake_waiters(self) -> None:
        acked = self.acked()
        keep = []
        for end, fut in self._waiters:
            if fut.done():
                continue
            if end <= acked:
                fut.set_result(None)
            else:
                keep.append((end, fut))
        self._waiters = keep

    def _fail_waiters(self, exc: StoreError) -> None:
        waiters, self._waiters = self._waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(exc)
