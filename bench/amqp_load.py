"""Load generator for broker benchmarks: publisher and consumer processes on aiormq.

Each client is a process of its own (one event loop, one connection), so on a
small machine the client side can use every core and its CPU is accounted per
process. Publishers keep a fixed window of unconfirmed messages (publisher
confirms), consumers ack manually; everything is counted only inside a
measurement window that starts after a warm-up, the same for every broker.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Latency samples kept per publisher process (uniformly thinned beyond this).
MAX_SAMPLES = 50_000


@dataclass
class Load:
    """One benchmark case's client side."""

    url: str
    queue: str
    persistent: bool
    size: int = 1024
    publishers: int = 0
    consumers: int = 0
    in_flight: int = 100  # unconfirmed messages per publisher
    prefetch: int = 500
    ack_every: int = 1  # 1 = ack each delivery; n > 1 = one multiple-ack per n deliveries
    warmup: float = 3.0
    duration: float = 15.0
    stop_when_idle: float = 0.0  # consumers stop after this long without a delivery (0 = never)
    rate_limit: float = 0.0  # per publisher, messages/s (0 = as fast as confirms allow)
    confirms: bool = True  # False: pre-encoded frames, no confirms, as fast as the socket takes them
    consume_delay: float = 0.0  # seconds a consumer holds each delivery before acking it (a slow consumer)


@dataclass
class Result:
    published: int = 0  # confirmed (acked) inside the window, or written to the socket without confirms
    nacked: int = 0
    consumed: int = 0
    window_seconds: float = 0.0
    client_cpu_seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def publish_rate(self) -> float:
        return self.published / self.window_seconds if self.window_seconds else 0.0

    @property
    def consume_rate(self) -> float:
        return self.consumed / self.window_seconds if self.window_seconds else 0.0

    def percentile(self, q: float) -> float | None:
        if not self.latencies_ms:
            return None
        if len(self.latencies_ms) == 1:
            return self.latencies_ms[0]
        return statistics.quantiles(self.latencies_ms, n=1000, method="inclusive")[int(q * 1000) - 1]


async def declare(url: str, queue: str, durable: bool) -> None:
    """(Re)create an empty queue for one case."""
    import aiormq

    conn = await aiormq.connect(url)
    try:
        ch = await conn.channel()
        await ch.queue_delete(queue)
        await ch.queue_declare(queue, durable=durable)
    finally:
        await conn.close()


async def delete(url: str, queue: str) -> None:
    import aiormq

    conn = await aiormq.connect(url)
    try:
        ch = await conn.channel()
        await ch.queue_delete(queue)
    finally:
        await conn.close()


# -- inside a client process ------------------------------------------------------------------


def _loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a declared extra
        return asyncio.new_event_loop()


async def _publisher(load: Load, start: Any, out: dict[str, Any]) -> None:
    import aiormq
    from pamqp import commands as spec

    conn = await aiormq.connect(load.url)
    ch = await conn.channel(publisher_confirms=True)
    props = spec.Basic.Properties(delivery_mode=2 if load.persistent else 1)
    body = b"x" * load.size
    window = asyncio.Semaphore(load.in_flight)
    t_start, t_from, t_stop = await _wait_start(start, load, out)
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    counts = {"ok": 0, "nack": 0, "seen": 0}
    pending: set[asyncio.Task[None]] = set()

    async def one() -> None:
        t0 = time.perf_counter()
        try:
            confirm = await ch.basic_publish(body, routing_key=load.queue, properties=props)
        except Exception as exc:  # noqa: BLE001 - a benchmark records errors, never hides them
            if len(out["errors"]) < 5:
                out["errors"].append(f"{type(exc).__name__}: {exc}")
            return
        finally:
            window.release()
        t1 = time.perf_counter()
        if t_from <= loop.time() < t_stop:
            if isinstance(confirm, spec.Basic.Ack):
                counts["ok"] += 1
                counts["seen"] += 1
                # Reservoir-free thinning: keep every k-th sample once the cap is reached.
                if len(lat) < MAX_SAMPLES:
                    lat.append((t1 - t0) * 1000)
                elif counts["seen"] % (counts["seen"] // MAX_SAMPLES + 1) == 0:
                    lat[counts["seen"] % MAX_SAMPLES] = (t1 - t0) * 1000
            else:
                counts["nack"] += 1

    interval = 1.0 / load.rate_limit if load.rate_limit else 0.0
    next_at = loop.time()
    cpu0 = None
    while loop.time() < t_stop:
        if cpu0 is None and loop.time() >= t_from:
            cpu0 = time.process_time()
        if interval:
            next_at += interval
            delay = next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        await window.acquire()
        task = asyncio.create_task(one())
        pending.add(task)
        task.add_done_callback(pending.discard)
    cpu1 = time.process_time()
    if pending:
        await asyncio.wait(pending, timeout=10)
    await conn.close()
    out.update(
        published=counts["ok"],
        nacked=counts["nack"],
        latencies_ms=lat,
        client_cpu_seconds=cpu1 - (cpu0 if cpu0 is not None else cpu1),
    )


def _raw_handshake(url: str) -> Any:
    """A socket with an open connection and channel 1, heartbeats off: the AMQP handshake by hand."""
    import socket
    import urllib.parse

    from pamqp import commands as spec
    from pamqp import frame, header
    from pamqp.exceptions import UnmarshalingException

    u = urllib.parse.urlparse(url)
    sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 5672), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the asyncio clients have it
    buf = b""

    def expect(kind: type) -> Any:
        nonlocal buf
        while True:
            try:
                n, _, value = frame.unmarshal(buf)
            except UnmarshalingException:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the broker closed the connection during the handshake") from None
                buf += chunk
                continue
            buf = buf[n:]
            if not isinstance(value, kind):
                raise ConnectionError(f"expected {kind.__name__}, got {value!r}")
            return value

    sock.sendall(frame.marshal(header.ProtocolHeader(), 0))
    expect(spec.Connection.Start)
    creds = f"\0{urllib.parse.unquote(u.username or 'guest')}\0{urllib.parse.unquote(u.password or 'guest')}"
    sock.sendall(
        frame.marshal(
            spec.Connection.StartOk(
                client_properties={"product": "brokerchaos bench"}, mechanism="PLAIN", response=creds
            ),
            0,
        )
    )
    tune = expect(spec.Connection.Tune)
    sock.sendall(
        frame.marshal(
            spec.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0), 0
        )
    )
    sock.sendall(frame.marshal(spec.Connection.Open(virtual_host="/"), 0))
    expect(spec.Connection.OpenOk)
    sock.sendall(frame.marshal(spec.Channel.Open(), 1))
    expect(spec.Channel.OpenOk)
    return sock, tune.frame_max


def _blaster(load: Load, start: Any, out: dict[str, Any]) -> None:
    """Publish without confirms from pre-encoded frames: no per-message client work, so the
    publisher outruns any broker and only TCP back-pressure (a broker that stops reading)
    slows it down. Messages count as sent once all their bytes are in the socket."""
    import select

    from pamqp import body, frame, header
    from pamqp import commands as spec

    sock, frame_max = _raw_handshake(load.url)
    props = spec.Basic.Properties(delivery_mode=2 if load.persistent else 1)
    payload = b"x" * load.size
    one = frame.marshal(spec.Basic.Publish(routing_key=load.queue), 1)
    one += frame.marshal(header.ContentHeader(0, len(payload), props), 1)
    step = frame_max - 8
    for i in range(0, len(payload), step):
        one += frame.marshal(body.ContentBody(payload[i : i + step]), 1)
    batch = one * max(1, (256 * 1024) // len(one))
    sock.setblocking(False)
    ready, value, connected = start
    _set_up(out, connected)
    ready.wait()
    t_from = value.value + load.warmup
    t_stop = t_from + load.duration
    total = 0  # bytes written
    at_from: int | None = None
    cpu0 = 0.0
    offset = 0
    while (now := time.monotonic()) < t_stop:
        if at_from is None and now >= t_from:
            at_from, cpu0 = total, time.process_time()
        _, writable, _ = select.select([], [sock], [], 0.2)
        if not writable:
            continue
        try:
            n = sock.send(memoryview(batch)[offset:])
        except BlockingIOError:
            continue
        total += n
        offset = (offset + n) % len(batch)
    cpu1 = time.process_time()
    sock.close()
    out.update(
        published=(total - (at_from or 0)) // len(one), client_cpu_seconds=cpu1 - cpu0 if at_from else 0.0
    )


async def _consumer(load: Load, start: Any, out: dict[str, Any]) -> None:
    import aiormq

    conn = await aiormq.connect(load.url)
    ch = await conn.channel()
    await ch.basic_qos(prefetch_count=load.prefetch)
    loop = asyncio.get_running_loop()
    state = {"n": 0, "unacked": 0, "last": loop.time(), "t_from": float("inf"), "t_stop": float("inf")}

    async def on_message(msg: Any) -> None:
        now = loop.time()
        state["last"] = now
        if state["t_from"] <= now < state["t_stop"]:
            state["n"] += 1
        if load.consume_delay:
            await asyncio.sleep(load.consume_delay)
        state["unacked"] += 1
        if state["unacked"] >= load.ack_every:
            state["unacked"] = 0
            await ch.basic_ack(msg.delivery.delivery_tag, multiple=load.ack_every > 1)

    await ch.basic_consume(load.queue, on_message, no_ack=False)
    t_start, t_from, t_stop = await _wait_start(start, load, out)
    state["t_from"], state["t_stop"] = t_from, t_stop
    await asyncio.sleep(max(0.0, t_from - loop.time()))
    cpu0 = time.process_time()
    state["last"] = loop.time()
    ended = t_stop
    while loop.time() < t_stop:
        await asyncio.sleep(0.05)
        if load.stop_when_idle and loop.time() - state["last"] > load.stop_when_idle:
            ended = state["last"]
            break
    cpu1 = time.process_time()
    await conn.close()
    out.update(consumed=state["n"], client_cpu_seconds=cpu1 - cpu0, ended=ended, t_from=t_from)


async def _wait_start(start: Any, load: Load, out: dict[str, Any]) -> tuple[float, float, float]:
    """Tell the parent this client is set up, then block (off the loop) until it sets the common start time."""
    ready, value, connected = start
    _set_up(out, connected)
    await asyncio.get_running_loop().run_in_executor(None, ready.wait)
    t_start = value.value
    return t_start, t_start + load.warmup, t_start + load.warmup + load.duration


def _set_up(out: dict[str, Any], connected: Any) -> None:
    """Release the parent's wait exactly once per client, whether set-up worked or failed."""
    if not out.get("_set_up"):
        out["_set_up"] = True
        connected.release()


def _client_main(role: str, load: Load, start: Any, results: Any) -> None:
    connected = start[2]
    out: dict[str, Any] = {"role": role, "errors": []}
    if role == "publisher" and not load.confirms:
        try:
            _blaster(load, start, out)
        except Exception as exc:  # noqa: BLE001 - reported to the parent as an error
            out["errors"].append(f"{type(exc).__name__}: {exc}")
            _set_up(out, connected)
        results.put(out)
        return
    loop = _loop()
    asyncio.set_event_loop(loop)
    body = _publisher if role == "publisher" else _consumer
    try:
        loop.run_until_complete(body(load, start, out))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as an error
        out["errors"].append(f"{type(exc).__name__}: {exc}")
        _set_up(out, connected)
    finally:
        loop.close()
        out.pop("_set_up", None)
        results.put(out)


def run_load(
    load: Load,
    on_window: Callable[[float, float, Callable[[], bool]], Any] | None = None,
) -> tuple[Result, Any]:
    """Run the case's client processes. ``on_window(t_from, t_stop, finished)`` runs in a thread
    of this process during the measurement window (broker sampling; ``finished()`` turns true
    once every client has reported, which a backlog case may do early) and its return value
    is passed back."""
    ctx = mp.get_context("fork")
    start = (ctx.Event(), ctx.Value("d", 0.0), ctx.Semaphore(0))
    ready, value, connected = start
    results = ctx.Queue()
    roles = ["consumer"] * load.consumers + ["publisher"] * load.publishers
    procs = [ctx.Process(target=_client_main, args=(r, load, start, results), daemon=True) for r in roles]
    for p in procs:
        p.start()
    outs: list[dict[str, Any]] = []
    window: list[Any] = [None]
    finished = threading.Event()
    watcher: threading.Thread | None = None
    try:
        for _ in procs:
            if not connected.acquire(timeout=60):
                raise RuntimeError("a client process did not set up within 60 s")
        value.value = time.monotonic() + 0.2
        ready.set()
        t_from = value.value + load.warmup
        t_stop = t_from + load.duration
        if on_window is not None:

            def watch() -> None:
                try:
                    window[0] = on_window(t_from, t_stop, finished.is_set)
                except Exception as exc:  # noqa: BLE001 - re-raised in the caller's thread below
                    window[0] = exc

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
        for _ in procs:
            outs.append(results.get(timeout=load.warmup + load.duration + 60))
    finally:
        finished.set()
        if watcher is not None:
            watcher.join()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if isinstance(window[0], Exception):
        raise window[0]
    res = Result(window_seconds=load.duration)
    ended = []
    for o in outs:
        res.errors += o.get("errors", [])
        res.published += o.get("published", 0)
        res.nacked += o.get("nacked", 0)
        res.consumed += o.get("consumed", 0)
        res.client_cpu_seconds += o.get("client_cpu_seconds", 0.0)
        res.latencies_ms += o.get("latencies_ms", [])
        if o.get("role") == "consumer" and "ended" in o:
            ended.append(o["ended"] - o["t_from"])
    if load.stop_when_idle and ended and not load.publishers:
        res.window_seconds = max(1e-3, max(ended))
    return res, window[0]
