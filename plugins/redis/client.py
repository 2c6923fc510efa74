"""The Redis Streams workload driver (client plugin ``redis``), on ``redis-py``'s asyncio client.

One stream per workload queue (key = queue name), written with ``XADD`` on the primary and
read through one consumer group (``brokerchaos``) that every consumer process shares, each
under its own consumer name. Entries stay in the stream after their ``XACK``, so every node's
own copy can be read back after the drain.

Where the primary is: with Sentinel, each client asks the Sentinels in turn (starting at its
own node's, through that node's Sentinel client proxy) for the primary's address, which
Sentinel answers with a node's host name (``announce-hostnames``); the client goes through
that node's client proxy. Without Sentinel the primary is the first node. After any failure
(a lost connection, a ``READONLY`` reply from a demoted primary) a client asks again.

What the history records (``harness.spec.history``), in Redis terms:

- ``publish``: ``XADD``; with ``wait_replicas`` n > 0 followed by ``WAIT n timeout``. ``ok``
  = the reply arrived (and ``WAIT`` counted at least n replicas); ``detail``: the entry's
  ``stream_seq`` (the entry id ``ms-seq`` as its sparse offset ms * 1_000_000 + seq:
  ``harness.spec.entry_offset``), the entry id, the replica count. ``fail`` = an error reply (``READONLY``, ``NOREPLICAS``: not written). ``info`` = a
  timeout, a lost connection, or ``WAIT`` counting fewer replicas (written on the primary,
  its survival unknown).
- ``consume``: an entry ``XREADGROUP`` or ``XAUTOCLAIM`` returned (``redelivered``: re-read
  from the consumer's pending list or claimed from another consumer).
- ``ack``: ``XACK`` of a batch; ``ok`` once its reply arrived (Redis answers a command after
  executing it, so the reply is the round trip that proves it processed), ``info`` otherwise.
- ``abandon``: an entry a consumer leaves pending on purpose (``crash``: the connection is
  dropped; ``close``; ``requeue``; ``recover``: re-read from its own pending list). Redis keeps
  it in the group's pending list, where other consumers claim it (``XAUTOCLAIM`` once it has
  been idle ``CLAIM_IDLE_MS``): ``ok`` at once, the broker holds it whatever the client does.
- ``read``, ``seek``: an ordered reader (``workload.readers``) reads the stream from its start
  with ``XREAD`` (``COUNT``, ``BLOCK``) from the last id it read, on the primary; after any
  failure (a lost connection, Sentinel killing its clients when it changes the node's role, an
  error reply) it asks Sentinel again and goes on from that id on the primary it names, recorded
  first as a ``seek`` to the offset after it. It takes nothing from the group.
- ``drain``: one node per visit (``drain_reader``; the harness runs the rounds): a node that
  refuses ``XREADGROUP`` as a replica (``READONLY``) holds no copy to drain (``NoCopy``); on a
  primary the visit claims every pending entry, reads the rest and reports the node empty when
  the group has nothing pending and nothing unread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from harness import ScenarioError, hookimpl
from harness.spec import (
    OFFSETS,
    READ,
    SEEK,
    SPARSE,
    Endpoint,
    Invocation,
    RateLimiter,
    Recorder,
    body_digest,
    entry_offset,
    message_body,
)
from harness.spec.client import (
    Behaviour,
    DriverBase,
    DriverDrain,
    NoCopy,
    StreamEnd,
    close_quietly,
    reason,
    record_event,
    wait_or_stop,
)

GROUP = "brokerchaos"  # the consumer group every consumer process shares
MASTER_NAME = "brokerchaos"  # the name Sentinel monitors the primary under
CONNECT_TIMEOUT = 3.0
OP_TIMEOUT = 5.0
BLOCK_MS = 1000  # how long one XREADGROUP waits for entries
CLAIM_EVERY = 2.0  # how often a consumer claims entries abandoned by others
CLAIM_IDLE_MS = 5000  # an entry pending this long is abandoned: XAUTOCLAIM takes it
RECONNECT_DELAY = 0.5

#: What a broker round trip raises when the broker, the network or the connection fails.
BROKER_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OSError,
    TimeoutError,
    ConnectionError,
)


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class RedisDriver(DriverBase):
    def __init__(self, endpoints: Mapping[str, Endpoint], recorder: Recorder, **options: Any) -> None:
        super().__init__(endpoints, recorder, **options)  # the default user, no password
        workload = self.w
        for field, what in (
            ("delay", "delayed publishes"),
            ("transactions", "AMQP transactions"),
            ("ttl_ms", "message TTL"),
            ("expiration_ms", "message TTL"),
        ):
            if getattr(workload, field, None) is not None:  # no silent ignoring
                raise ScenarioError(
                    f"workload.{field}: Redis Streams have no {what}; remove it from this scenario"
                )
        if workload.dead_letter:
            raise ScenarioError(
                "workload.dead_letter: Redis Streams have no dead-letter exchange; remove it from this scenario"
            )
        args = self.client_settings  # ``Redis.client_settings``
        self.sentinel = bool(args.get("sentinel"))
        self.sentinel_port = int(args.get("sentinel_port") or 26379)
        self.wait_replicas = int(args.get("wait_replicas") or 0)

    # -- connections ----------------------------------------------------------------------

    def _client(self, host: str, port: int, timeout: float = OP_TIMEOUT) -> aioredis.Redis:
        return aioredis.Redis(
            host=host,
            port=port,
            socket_timeout=timeout,
            socket_connect_timeout=CONNECT_TIMEOUT,
            retry=Retry(NoBackoff(), 0),  # no hidden retries: every command is sent once
            single_connection_client=True,
            protocol=2,
        )

    async def connect(self, node: str) -> aioredis.Redis:
        """A connection to ``node``'s server through its client proxy (ping answered)."""
        ep = self.endpoints[node]
        conn = self._client(ep.host, ep.port, timeout=max(OP_TIMEOUT, self.w.confirm_timeout + 2))
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT + 1):
                await conn.ping()
        except BaseException:
            await close(conn)
            raise
        return conn

    async def primary(self, process: str) -> str | None:
        """The node the client should write to: what the first Sentinel that answers names
        (asked in the process's node order), or the first node without Sentinel."""
        if not self.sentinel:
            return self.nodes[0]
        rotation = self.rotation(process)
        for node in [next(rotation) for _ in self.nodes]:
            extra = self.endpoints[node].extra.get(self.sentinel_port)
            if extra is None:
                continue
            s = self._client(*extra)
            try:
                async with asyncio.timeout(OP_TIMEOUT):
                    addr = await s.execute_command("SENTINEL", "get-master-addr-by-name", MASTER_NAME)
            except (*BROKER_ERRORS, redis.exceptions.ResponseError):
                continue
            finally:
                await close(s)
            if addr and _text(addr[0]) in self.endpoints:
                return _text(addr[0])
        return None

    async def _primaries(self, process: str, stop: asyncio.Event) -> Any:
        """One connection at a time to the primary (asked again each time) until ``stop``."""
        rotation = self.rotation(process)
        while not stop.is_set():
            node = await self.primary(process) or next(rotation)
            try:
                conn = await self.connect(node)
            except BROKER_ERRORS:
                await wait_or_stop(stop, RECONNECT_DELAY)
                continue
            try:
                yield node, conn
            finally:
                await close(conn)
            if not stop.is_set():
                await wait_or_stop(stop, RECONNECT_DELAY)

    async def setup(self, queues: Sequence[str]) -> None:
        """Create each queue's stream and the shared consumer group on the primary."""
        last: BaseException | None = None
        for _attempt in range(10):
            node = await self.primary("setup")
            if node is None:
                await asyncio.sleep(1.0)
                continue
            try:
                conn = await self.connect(node)
            except BROKER_ERRORS as exc:
                last = exc
                await asyncio.sleep(1.0)
                continue
            try:
                for q in queues:
                    await create_group(conn, q)
                return
            except (*BROKER_ERRORS, redis.exceptions.ResponseError) as exc:
                last = exc
            finally:
                await close(conn)
            await asyncio.sleep(1.0)
        raise ConnectionError(
            f"no primary created the streams: {reason(last) if last else 'no primary named'}"
        )

    # -- producers ------------------------------------------------------------------------

    async def produce(self, process: str, queue: str, stop: asyncio.Event) -> None:
        """One ``XADD`` (and ``WAIT``) at a time; any outcome but ``ok`` sends the producer
        back to ask where the primary is."""
        limiter = RateLimiter(self.w.rate / max(1, self.w.producers) if self.w.rate else 0)
        seq = itertools.count(1)
        async with contextlib.aclosing(self._primaries(process, stop)) as conns:
            async for node, conn in conns:
                while not stop.is_set():
                    await limiter.wait()
                    msg_id = f"{process}:{next(seq)}"
                    inv = self.recorder.invoke(process, "publish", node=node, queue=queue, value=msg_id)
                    if await self._publish_one(conn, inv, queue, msg_id) != "ok":
                        break

    async def _publish_one(self, conn: aioredis.Redis, inv: Invocation, queue: str, msg_id: str) -> str:
        body = message_body(msg_id, self.seed, self.w.message_size)
        timeout = self.w.confirm_timeout
        try:
            async with asyncio.timeout(timeout):
                entry = _text(await conn.xadd(queue, {"id": msg_id, "body": body}))
            detail: dict[str, Any] = {"stream_seq": entry_offset(entry), "entry": entry}
            if self.wait_replicas:
                # WAIT's own timeout leaves the rest of the confirm timeout for its reply.
                async with asyncio.timeout(timeout + 1):
                    got = int(await conn.wait(self.wait_replicas, max(1, int(timeout * 1000) - 1000)))
                detail["replicas"] = got
                if got < self.wait_replicas:
                    inv.info(f"WAIT {self.wait_replicas} counted {got} replicas", detail=detail)
                    return "info"
        except asyncio.CancelledError:
            if not inv.done:
                inv.info("cancelled before the reply arrived")
            raise
        except redis.exceptions.ResponseError as exc:  # an error reply: not written
            if not inv.done:
                inv.fail(reason(exc))
            return "fail"
        except Exception as exc:  # noqa: BLE001 - a timeout, a lost connection, anything else: unknown
            if not inv.done:
                inv.info(reason(exc))
            return "info"
        inv.ok(detail=detail)
        return "ok"

    # -- consumers ------------------------------------------------------------------------

    async def consume(self, process: str, queue: str, stop: asyncio.Event) -> None:
        behaviour = self.behaviour(process, asyncio.get_running_loop().time())
        async with contextlib.aclosing(self._primaries(process, stop)) as conns:
            async for node, conn in conns:
                await _Session(self, conn, node, process, queue, behaviour).run(stop)

    # -- ordered readers ------------------------------------------------------------------

    async def read(self, process: str, queue: str, stop: asyncio.Event) -> None:
        """An ordered stream reader (``workload.readers``): the stream from its first entry, in
        order, with ``XREAD COUNT n BLOCK ms`` from the last entry id it read, on the primary
        (``ROLE`` checked on each connection; ``XREAD`` joins no group: it takes nothing from
        anyone). Each entry is a ``read`` op (id, digest, offset). Any failure sends it back to Sentinel for the primary, where it goes on
        from the same id, recorded first as a ``seek`` to the offset after it. After ``stop`` it
        reads on until an ``XREAD`` finds nothing for ``drain_idle`` seconds: the stream's end."""
        last = "0-0"
        started = False
        end = StreamEnd(stop, self.w.drain_idle)
        batch = max(1, min(self.w.prefetch or 100, 256))
        async with contextlib.aclosing(self._primaries(process, end.done)) as conns:
            async for node, conn in conns:
                if not await is_primary(conn):
                    continue  # Sentinel named it before it took its new role, or it lost it since
                if started:
                    record_event(
                        self.recorder,
                        process,
                        SEEK,
                        node=node,
                        queue=queue,
                        value=None,
                        detail={"stream_seq": entry_offset(last) + 1},
                    )
                started = True
                while not end.done.is_set():
                    try:
                        async with asyncio.timeout(BLOCK_MS / 1000 + OP_TIMEOUT):
                            got: Any = await conn.xread({queue: last}, count=batch, block=BLOCK_MS)
                    except (*BROKER_ERRORS, redis.exceptions.ResponseError):
                        break  # UNBLOCKED (the node's role changed), LOADING, a lost connection
                    entries = [(_text(i), f) for _s, es in got or () for i, f in es if f is not None]
                    for eid, fields in entries:
                        msg_id, body = entry_message(fields)
                        record_event(
                            self.recorder,
                            process,
                            READ,
                            node=node,
                            queue=queue,
                            value=msg_id,
                            detail={"stream_seq": entry_offset(eid), "entry": eid},
                            digest=body_digest(body),
                        )
                        last = eid
                    end.read(bool(entries))

    # -- drain ----------------------------------------------------------------------------

    def drain_reader(self, process: str, queue: str) -> _Drain:
        """What is left in ``queue``'s stream, read through one node per visit (after every fault
        healed); the harness runs the rounds (``harness.spec.client.DrainReader``)."""
        return _Drain(self, process, queue, NodeView)


async def close(conn: aioredis.Redis) -> None:
    await close_quietly(conn.aclose(), 2.0)


def entry_message(fields: Mapping[Any, Any] | None) -> tuple[str, bytes]:
    """The message id and body an entry's fields carry (the id read from the body if missing)."""
    f = {_text(k): v for k, v in (fields or {}).items()}
    body = f.get("body") or b""
    body = body if isinstance(body, bytes) else str(body).encode()
    return _text(f.get("id") or body.split(b"|", 1)[0]), body


async def is_primary(conn: aioredis.Redis) -> bool:
    """``ROLE`` says ``master`` (False too when it cannot be asked)."""
    try:
        async with asyncio.timeout(OP_TIMEOUT):
            role: Any = await conn.execute_command("ROLE")
    except (*BROKER_ERRORS, redis.exceptions.ResponseError):
        return False
    return bool(role) and _text(role[0]) == "master"


async def create_group(conn: aioredis.Redis, queue: str) -> bool:
    """The shared consumer group, reading the stream from its start; False if it was there."""
    try:
        async with asyncio.timeout(OP_TIMEOUT):
            await conn.xgroup_create(queue, GROUP, id="0", mkstream=True)
    except redis.exceptions.ResponseError as exc:
        if "BUSYGROUP" in str(exc):
            return False
        raise
    return True


@dataclass(eq=False)
class _Session:
    """One consumer on one connection: read, record, acknowledge, act out the behaviours."""

    d: RedisDriver
    conn: aioredis.Redis
    node: str
    process: str
    queue: str
    behaviour: Behaviour

    def __post_init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.acked = 0
        self.reread = False  # the next read takes this consumer's own pending entries again
        self.next_claim = self.loop.time() + CLAIM_EVERY

    async def read(self, *, claim_idle_ms: int | None) -> list[tuple[str, dict[Any, Any] | None, bool]]:
        """The next entries: claimed ones when a claim is due (``claim_idle_ms``), else this
        consumer's own pending ones after a recover, else new ones."""
        if claim_idle_ms is not None:
            got: list[tuple[str, dict[Any, Any] | None, bool]] = []
            cursor = "0-0"
            while True:
                async with asyncio.timeout(OP_TIMEOUT):
                    reply = await self.conn.xautoclaim(
                        self.queue, GROUP, self.process, claim_idle_ms, cursor, count=256
                    )
                cursor = _text(reply[0])
                got += [(_text(i), f, True) for i, f in reply[1] if f is not None]
                if cursor == "0-0" or len(got) >= 1024:
                    return got
        start = "0" if self.reread else ">"
        self.reread = False
        batch = max(1, min(self.d.w.prefetch or 64, 256))
        async with asyncio.timeout(BLOCK_MS / 1000 + OP_TIMEOUT):
            read: Any = await self.conn.xreadgroup(
                GROUP, self.process, {self.queue: start}, count=batch, block=BLOCK_MS
            )
        return [
            (_text(i), f, start == "0") for _s, entries in read or () for i, f in entries if f is not None
        ]

    async def run(self, stop: asyncio.Event | None, *, claim_idle_ms: int = CLAIM_IDLE_MS) -> str:
        """Read and settle until ``stop`` (or, with ``stop`` None, one read that got nothing).

        Returns ``stop``, ``idle``, ``crashed``, ``closed``, ``lost`` (a failure) or ``replica``
        (the node refused ``XREADGROUP`` as a replica)."""
        while stop is None or not stop.is_set():
            claim = self.loop.time() >= self.next_claim
            if claim:
                self.next_claim = self.loop.time() + CLAIM_EVERY
            try:
                entries = await self.read(claim_idle_ms=claim_idle_ms if claim else None)
            except redis.exceptions.ReadOnlyError:
                return "replica"
            except redis.exceptions.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    return "lost"
                try:  # the group (or the stream) is not on this primary: read it from the start
                    await create_group(self.conn, self.queue)
                except redis.exceptions.ReadOnlyError:
                    return "replica"
                except (*BROKER_ERRORS, redis.exceptions.ResponseError):
                    return "lost"
                continue
            except BROKER_ERRORS:
                return "lost"
            if not entries:
                if stop is None and not claim:
                    return "idle"
                continue
            held = [self.deliver(entry_id, fields, again) for entry_id, fields, again in entries]
            action, at = self.behaviour.next()
            if action is not None and self.loop.time() >= at:
                self.behaviour.done(action, self.loop.time())
                for entry_id, msg_id in held:
                    self._abandon(msg_id, entry_id, action).ok()
                if action == "recover":
                    self.reread = True
                    continue
                return "crashed" if action == "crash" else "closed"
            if not await self.settle(held):
                return "lost"
        return "stop"

    def deliver(self, entry_id: str, fields: Mapping[Any, Any] | None, redelivered: bool) -> tuple[str, str]:
        msg_id, body = entry_message(fields)
        digest = body_digest(body)
        detail: dict[str, Any] = {"stream_seq": entry_offset(entry_id), "entry": entry_id}
        if digest != body_digest(message_body(msg_id, self.d.seed, self.d.w.message_size)):
            detail.update(body=body[:200].decode(errors="backslashreplace"), length=len(body))
        self.d.recorder.invoke(self.process, "consume", node=self.node, queue=self.queue).ok(
            msg_id, redelivered=redelivered, digest=digest, detail=detail
        )
        return entry_id, msg_id

    async def settle(self, held: list[tuple[str, str]]) -> bool:
        """Acknowledge the batch with one ``XACK`` (each entry its own ``ack`` op); a requeue
        leaves an entry pending for a claim. False when the connection failed."""
        b = self.behaviour
        if b.slow_ack:
            await asyncio.sleep(b.slow_ack)
        acks = []
        for entry_id, msg_id in held:
            if b.requeue and b.rng.random() < b.requeue:
                self._abandon(msg_id, entry_id, "requeue").ok()
                continue
            op = self.d.recorder.invoke(self.process, "ack", node=self.node, queue=self.queue, value=msg_id)
            acks.append((entry_id, op))
        if not acks:
            return True
        try:
            async with asyncio.timeout(OP_TIMEOUT):
                n = await self.conn.xack(self.queue, GROUP, *(e for e, _ in acks))
        except asyncio.CancelledError:
            for _e, op in acks:
                op.info("cancelled before the XACK reply arrived")
            raise
        except Exception as exc:  # noqa: BLE001 - the server may or may not have executed it
            for _e, op in acks:
                op.info(reason(exc))
            return not isinstance(exc, BROKER_ERRORS)
        for entry_id, op in acks:
            op.ok(detail={"entry": entry_id, "xack": int(n), "batch": len(acks)})
        self.acked += len(acks)
        return True

    def _abandon(self, msg_id: str, entry_id: str, cause: str) -> Invocation:
        cause = cause if cause in ("requeue", "recover", "crash") else "close"
        return self.d.recorder.invoke(
            self.process,
            "abandon",
            node=self.node,
            queue=self.queue,
            value=msg_id,
            detail={"cause": cause, "entry": entry_id},
        )


@dataclass
class NodeView:
    role: str | None = None  # "primary", or "replica" when it refused XREADGROUP
    consumed: int = 0
    lag: int | None = None  # the group's entries not yet delivered, as this node's copy says
    pending: int | None = None  # delivered and not acknowledged
    length: int | None = None  # XLEN of this node's copy
    last_entry: str | None = None
    empty_at_ns: int | None = None
    error: str | None = None


class _Drain(DriverDrain[RedisDriver, NodeView]):
    """One stream's drain, one node per visit (``DrainReader``)."""

    async def extra(self) -> dict[str, Any]:
        return {OFFSETS: SPARSE}  # entry ids: ordered, far apart (harness.spec.history)

    async def visit(self, node: str, left: Callable[[], float]) -> bool | NoCopy:
        """The protocol's read of one node: claim every pending entry and read every unread one
        until the group on this node has neither (True), or ``NoCopy`` when the node refuses
        ``XREADGROUP`` as a replica: it holds no copy to drain (``node_holdings`` still reads it)."""
        view = self.node_views[node]
        return await self.visit_with(
            view,
            left,
            connect=lambda: self.d.connect(node),
            session=lambda conn: _Session(self.d, conn, node, self.process, self.queue, Behaviour.none()),
            read=lambda conn, session: self._until_empty(conn, session, view),
            close=close,
            errors=BROKER_ERRORS,
            read_errors=(*BROKER_ERRORS, redis.exceptions.ResponseError),
            drain_timeout=self.d.w.drain_timeout,
        )

    async def _until_empty(self, conn: aioredis.Redis, session: _Session, view: NodeView) -> bool | NoCopy:
        while True:
            idle_from = self.loop.time()
            while self.loop.time() - idle_from < self.d.w.drain_idle:
                before = session.acked
                session.next_claim = 0.0  # every read claims first: pending entries of anyone, idle or not
                outcome = await session.run(None, claim_idle_ms=0)
                if outcome == "replica":
                    view.role, view.error = "replica", None
                    return NoCopy("READONLY: a replica refuses XREADGROUP")
                if outcome == "lost":
                    view.error = "connection lost while draining"
                    return False
                if session.acked > before:
                    idle_from = self.loop.time()
            view.role = "primary"
            async with asyncio.timeout(OP_TIMEOUT):
                groups = await conn.xinfo_groups(self.queue)
            group = next((g for g in groups if _text(g.get("name")) == GROUP), None)
            if group is None:
                continue  # the next read creates it
            lag = group.get("lag")
            view.lag, view.pending = (None if lag is None else int(lag)), int(group.get("pending") or 0)
            async with asyncio.timeout(OP_TIMEOUT):
                view.length = int(await conn.xlen(self.queue))
            async with asyncio.timeout(OP_TIMEOUT):
                last: Any = await conn.xrevrange(self.queue, count=1)
            view.last_entry = _text(last[0][0]) if last else None
            if view.pending == 0 and view.lag in (0, None):
                return self.emptied(view, self.d.recorder.now_ns())


@hookimpl
def brokerchaos_register_clients(register: Any) -> None:
    register.add_client("redis", RedisDriver)
