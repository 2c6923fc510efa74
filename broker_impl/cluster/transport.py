"""Links between nodes: one dialled connection per peer for sending, accepted ones for receiving.

Each node dials every peer at the address it was given (in the harness a
Toxiproxy proxy) and sends on that connection only; it receives on the
connections peers dialled to it. Traffic A -> B and B -> A therefore crosses
two separate proxies, so every partition shape (one-way included) can be made
by cutting proxies, and each direction is FIFO on its own.

Failure detection is RabbitMQ's net_ticktime in small: every ``tick`` seconds a
heartbeat goes out on each dialled link; a peer is *up* while something arrived
from it within ``down_after`` ticks, *down* otherwise. Going down closes both
directions, so a peer that comes back starts new connections, and the HELLO
carries its incarnation (boot id): a peer that restarted in between is seen as
down-then-up even if no tick was missed. Dialling retries with exponential
backoff capped at a few ticks.

The peers change while the node runs (``add_peer``, ``remove_peer``: the
cluster admitted or forgot a node). A connection from a node that is not a peer
is refused, unless its HELLO asks to join and ``on_join`` admits it; a node
dials the member it asks to join with that flag (``add_peer(..., join=True)``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker_impl.cluster.wire import DATA, HEARTBEAT, HELLO, Decoder, Frame, WireError, encode
from broker_impl.errors import cannot_listen

log = logging.getLogger("broker_impl.cluster.transport")

MessageHandler = Callable[[str, dict[str, Any], bytes], None]
PeerHandler = Callable[[str], None]
JoinHandler = Callable[[str], bool]


@dataclass(slots=True)
class _Peer:
    name: str
    host: str
    port: int
    writer: asyncio.StreamWriter | None = None
    readers: set[asyncio.StreamWriter] = field(default_factory=set)
    last_heard: float = 0.0
    incarnation: str = ""
    up: bool = False
    downs: int = 0
    last_change: float = 0.0
    early: list[Frame] = field(default_factory=list)  # arrived before our own link to the peer was up
    out: list[bytes] = field(
        default_factory=list
    )  # frames sent in this turn of the event loop, not written yet
    join: bool = False  # our HELLO asks this peer to admit us to its cluster
    dialled_at: float = 0.0  # when the current dialled link was opened


def resolve_listen(host: str) -> str:
    """The address a node binds: its own host name's address, never the wildcard (proxies share the port)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


class Transport:
    """Framed links to the current peers. All callbacks run on the event loop."""

    def __init__(
        self,
        me: str,
        listen: tuple[str, int],
        peers: dict[str, tuple[str, int]],
        *,
        tick: float = 1.0,
        down_after: int = 3,
        on_message: MessageHandler,
        on_up: PeerHandler,
        on_down: PeerHandler,
        on_join: JoinHandler | None = None,
    ) -> None:
        self.me = me
        self.listen = listen
        self.tick = tick
        self.down_after = down_after
        self.incarnation = secrets.token_hex(8)
        self.peers = {n: _Peer(n, h, p) for n, (h, p) in peers.items() if n != me}
        self._on_message = on_message
        self._on_up = on_up
        self._on_down = on_down
        self._on_join = on_join
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._dialers: dict[str, asyncio.Task[None]] = {}
        self.bound: tuple[str, int] = ("", 0)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        host, port = self.listen
        address = resolve_listen(host)  # one name lookup for the bind and for its error
        try:
            self._server = await asyncio.start_server(self._accepted, address, port, reuse_address=True)
        except OSError as exc:
            raise cannot_listen("cluster peers", "cluster.port", address, port, exc) from exc
        self.bound = self._server.sockets[0].getsockname()[:2]
        loop = asyncio.get_running_loop()
        for p in self.peers.values():
            self._dial(p)
        self._tasks.append(loop.create_task(self._ticker(), name="cluster-tick"))
        log.info(
            "cluster link of %s listening on %s:%d; peers %s",
            self.me,
            *self.bound,
            ", ".join(f"{p.name}={p.host}:{p.port}" for p in self.peers.values()) or "none",
        )

    async def stop(self) -> None:
        """Close every link; no peer counts as up afterwards (no callbacks: the node is going away)."""
        for t in [*self._tasks, *self._dialers.values()]:
            t.cancel()
        for p in self.peers.values():
            self._close_links(p)
            p.up = False
        if self._server is not None:
            self._server.close()

    # -- membership ----------------------------------------------------------------------
    def add_peer(self, name: str, host: str, port: int, *, join: bool = False) -> None:
        """Start talking to ``name`` (dialled at host:port); ``join``: our HELLO asks it to admit us."""
        if name == self.me:
            return
        p = self.peers.get(name)
        if p is None:
            p = self.peers[name] = _Peer(name, host, port, join=join)
            if self._server is not None:
                self._dial(p)
        p.join = p.join or join

    def remove_peer(self, name: str) -> None:
        """Stop talking to ``name`` for good (it was forgotten): down if it was up, links closed, no dialling."""
        p = self.peers.get(name)
        if p is None:
            return
        self._mark_down(p, "forgotten by the cluster")
        task = self._dialers.pop(name, None)
        if task is not None:
            task.cancel()
        del self.peers[name]

    def _dial(self, p: _Peer) -> None:
        self._dialers[p.name] = asyncio.get_running_loop().create_task(
            self._dial_loop(p), name=f"cluster-dial:{p.name}"
        )

    # -- sending -------------------------------------------------------------------------
    def send(self, peer: str, header: dict[str, Any], blob: bytes = b"") -> bool:
        """Queue a frame on the link to ``peer``; False when the peer is down (nothing sent).

        The frames sent to a peer in one turn of the event loop are written
        together at its end: one socket write (and one wake-up of the peer)
        for the many frames a burst of publishes makes, in the same order.
        """
        p = self.peers.get(peer)
        if p is None or not p.up or p.writer is None or p.writer.is_closing():
            return False
        if not p.out:
            asyncio.get_running_loop().call_soon(self._write_out, p, p.writer, p.out)
        p.out.append(encode(Frame(DATA, header, blob)))
        return True

    @staticmethod
    def _write_out(p: _Peer, writer: asyncio.StreamWriter, frames: list[bytes]) -> None:
        if p.out is frames:
            p.out = []
        if frames:
            data = b"".join(frames)
            frames.clear()  # written once, whether the close or the end of the turn comes first
            if not writer.is_closing():
                writer.write(data)

    def is_up(self, peer: str) -> bool:
        p = self.peers.get(peer)
        return p is not None and p.up

    def incarnation_of(self, peer: str) -> str:
        """The boot id ``peer`` gave in its last HELLO here ("" if none came)."""
        p = self.peers.get(peer)
        return p.incarnation if p is not None else ""

    def up_peers(self) -> list[str]:
        return sorted(n for n, p in self.peers.items() if p.up)

    def heard_since(self, t: float) -> list[str]:
        """The peers up now that sent something (a heartbeat at least) after ``t`` (``time.monotonic``)."""
        return sorted(n for n, p in self.peers.items() if p.up and p.last_heard > t)

    def status(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [
            {
                "name": p.name,
                "address": f"{p.host}:{p.port}",
                "running": p.up,
                "times_down": p.downs,
                "since_s": round(now - p.last_change, 1) if p.last_change else None,
            }
            for p in self.peers.values()
        ]

    # -- dialling ------------------------------------------------------------------------
    async def _dial_loop(self, p: _Peer) -> None:
        backoff = min(0.1, self.tick)
        while True:
            if p.writer is None or p.writer.is_closing():
                p.writer = None
                try:
                    async with asyncio.timeout(max(self.tick * self.down_after, 1.0)):
                        reader, writer = await asyncio.open_connection(p.host, p.port)
                except (TimeoutError, OSError):
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.tick * 3)
                    continue
                backoff = min(0.1, self.tick)
                hello: dict[str, Any] = {"node": self.me, "inc": self.incarnation}
                if p.join:
                    hello["join"] = True
                writer.write(encode(Frame(HELLO, hello)))
                p.writer = writer
                p.dialled_at = time.monotonic()
                asyncio.get_running_loop().create_task(self._drain_dialled(p, reader, writer))
                self._maybe_up(p)
            await asyncio.sleep(min(self.tick, 0.2))

    async def _drain_dialled(
        self, p: _Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Nothing comes back on a dialled link; reading only notices when the peer hangs up.

        A link that breaks may have lost frames, so the peer counts as down: both
        sides then start over with fresh links and resynchronise.
        """
        try:
            while await reader.read(65536):
                pass
        except (OSError, ConnectionError):
            pass
        writer.close()
        if p.writer is writer:
            self._mark_down(p, "link closed")

    # -- receiving -----------------------------------------------------------------------
    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = Decoder()
        peer: _Peer | None = None
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                for frame in decoder.feed(data):
                    if peer is None:
                        if frame.type != HELLO or not self._admitted(frame.header):
                            log.warning(
                                "cluster link: refused a connection from %s (hello %r): not a member",
                                writer.get_extra_info("peername"),
                                frame.header,
                            )
                            return
                        peer = self.peers[frame.header["node"]]
                        inc = str(frame.header.get("inc", ""))
                        if peer.up:
                            self._mark_down(peer, "reconnected" if inc == peer.incarnation else "restarted")
                        peer.incarnation = inc
                        peer.readers.add(writer)
                        peer.last_heard = time.monotonic()
                        self._maybe_up(peer)
                        continue
                    if writer not in peer.readers:
                        return  # this link was closed when the peer went down
                    peer.last_heard = time.monotonic()
                    if frame.type == DATA:
                        if peer.up:
                            self._deliver(peer, frame)
                        else:
                            peer.early.append(frame)
        except (OSError, ConnectionError, WireError) as exc:
            log.info("cluster link from %s closed: %s", peer.name if peer else "?", exc)
        finally:
            writer.close()
            if peer is not None and writer in peer.readers:
                peer.readers.discard(writer)
                self._mark_down(peer, "link closed")

    def _admitted(self, hello: dict[str, Any]) -> bool:
        node = hello.get("node")
        if node in self.peers:
            return True
        return (
            bool(hello.get("join"))
            and self._on_join is not None
            and self._on_join(str(node))
            and node in self.peers
        )

    def _deliver(self, peer: _Peer, frame: Frame) -> None:
        try:
            self._on_message(peer.name, frame.header, frame.blob)
        except Exception:
            log.exception("cluster link: handling %r from %s failed", frame.header.get("t"), peer.name)

    # -- liveness ------------------------------------------------------------------------
    async def _ticker(self) -> None:
        hb = encode(Frame(HEARTBEAT, {}))
        while True:
            await asyncio.sleep(self.tick)
            now = time.monotonic()
            for p in self.peers.values():
                if p.writer is not None and not p.writer.is_closing():
                    p.writer.write(hb)
                if p.up and now - p.last_heard > self.tick * self.down_after:
                    self._mark_down(p, f"nothing heard for {now - p.last_heard:.1f}s")
                elif not p.up and p.writer is not None:
                    self._start_over_if_unanswered(p, now)

    def _start_over_if_unanswered(self, p: _Peer, now: float) -> None:
        """A dialled link open for ``down_after`` ticks with nothing heard from the peer is
        closed and dialled again, as Erlang's net_ticktime tears down a connection that stays
        silent. The peer may be holding a half-open link to us (its connection accepted but cut,
        say by a proxy that kept an old toxic): it sees ours close, counts us down, closes its
        own and dials again; without this both sides would wait on each other for ever."""
        silent = now - max(p.dialled_at, p.last_heard)
        if silent <= self.tick * self.down_after:
            return
        log.warning(
            "cluster: nothing heard from %s for %.1fs with our link to it open; closing it to start over",
            p.name,
            silent,
        )
        self._close_links(p)

    def _maybe_up(self, p: _Peer) -> None:
        if p.up or p.writer is None or not p.readers:
            return
        if time.monotonic() - p.last_heard > self.tick * self.down_after:
            return
        p.up = True
        p.join = False
        p.last_change = time.monotonic()
        log.warning("cluster: peer %s is up", p.name)
        self._on_up(p.name)
        early, p.early = p.early, []
        for frame in early:
            if p.up:
                self._deliver(p, frame)

    def _mark_down(self, p: _Peer, why: str) -> None:
        self._close_links(p)
        if not p.up:
            return
        p.up = False
        p.downs += 1
        p.last_change = time.monotonic()
        log.warning("cluster: peer %s is down (%s)", p.name, why)
        self._on_down(p.name)

    def _close_links(self, p: _Peer) -> None:
        p.early.clear()
        if p.writer is not None:
            self._write_out(p, p.writer, p.out)  # what was sent before the close goes out first, as before
            p.writer.close()
            p.writer = None
        for w in list(p.readers):
            w.close()
        p.readers.clear()
