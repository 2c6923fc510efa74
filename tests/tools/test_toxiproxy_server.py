"""The Toxiproxy-API server (`tools/toxiproxy-server`) driven by the unmodified `toxiproxy-python`.

The harness's network faults are only as good as this server's behaviour, so
these tests measure real bytes on loopback sockets rather than trusting the
API's own answers.
"""

from __future__ import annotations

import json
import shutil
import socket
import socketserver
import statistics
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound

from bench.proxy_round_trip import TwoWriteServer, alternate
from tests.polling import until
from tests.ports import free_port

CRATE = Path(__file__).resolve().parents[2] / "tools" / "toxiproxy-server"
BINARY = CRATE / "target" / "release" / "brokerchaos-toxiproxy"
GREETING = b"hi\n"
HANG_UP = b"bye"


@pytest.fixture(scope="session")
def binary() -> Path:
    """Build once per session from the committed lock file, as a deployment would."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("cargo is not installed: cannot build tools/toxiproxy-server")
    subprocess.run(
        [cargo, "build", "--release", "--locked", "--quiet"],
        cwd=CRATE,
        check=True,
        timeout=900,
    )
    return BINARY


class Upstream(socketserver.ThreadingTCPServer):
    """Greets each client, then echoes until it hears HANG_UP; records what it received."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _UpstreamHandler)
        self.received = bytearray()
        self.lock = threading.Lock()

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return f"{host!s}:{port}"


class _UpstreamHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: Upstream = self.server  # type: ignore[assignment]
        try:
            self.request.sendall(GREETING)
            while chunk := self.request.recv(65536):
                if chunk == HANG_UP:
                    break
                with server.lock:
                    server.received += chunk
                self.request.sendall(chunk)
        except OSError:
            pass


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


class Server:
    """A running server process and the base URL of its API."""

    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}"
        self.port = port


def start_server(binary: Path, *args: str) -> Server:
    port = free_port()
    process = subprocess.Popen(
        [str(binary), "--host", "127.0.0.1", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def listening() -> bool:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True

    def gone() -> str | None:
        if process.poll() is None:
            return None
        assert process.stderr is not None
        return f"server exited: {process.stderr.read().decode()}"

    until(listening, "the server to listen", every=0.02, ignore=(OSError,), gone=gone)
    return Server(process, port)


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
    if server.process.stderr is not None:
        server.process.stderr.close()


@pytest.fixture
def server(binary: Path) -> Iterator[Server]:
    running = start_server(binary, "--seed", "7")
    yield running
    stop_server(running)
    assert running.process.returncode == 0


@pytest.fixture
def toxiproxy(server: Server) -> Toxiproxy:
    client = Toxiproxy()
    client.update_api_consumer("127.0.0.1", server.port)
    return client


def split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def connect(address: str) -> socket.socket:
    """Reads wait up to 10 s: a stall, not a busy machine, is what would exceed that."""
    sock = socket.create_connection(split(address), timeout=10)
    sock.settimeout(10)
    return sock


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    return data


def greeted(address: str) -> socket.socket:
    sock = connect(address)
    assert read_exactly(sock, len(GREETING)) == GREETING
    return sock


def round_trip(sock: socket.socket, payload: bytes = b"ping") -> float:
    started = time.monotonic()
    sock.sendall(payload)
    assert read_exactly(sock, len(payload)) == payload
    return time.monotonic() - started


def assert_stalled(sock: socket.socket, wait: float = 0.5) -> None:
    sock.settimeout(wait)
    with pytest.raises(TimeoutError):
        data = sock.recv(1)
        raise AssertionError(f"expected no data, got {data!r}")


def assert_closed(sock: socket.socket) -> None:
    sock.settimeout(10)
    try:
        assert sock.recv(1) == b""
    except ConnectionResetError:
        pass


def test_traffic_passes_and_listen_port_zero_is_resolved(toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="echo")
    assert proxy.listen.startswith("127.0.0.1:") and not proxy.listen.endswith(":0")
    assert toxiproxy.version() == b"2.1.4"
    with greeted(proxy.listen) as sock:
        round_trip(sock, b"hello through the proxy")
    assert bytes(upstream.received) == b"hello through the proxy"
    assert set(toxiproxy.proxies()) == {"echo"}


def test_latency_delays_new_and_existing_connections(toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="slow")
    existing = greeted(proxy.listen)
    round_trip(existing)
    # 2 s against a local echo: with the toxic at least that, without it far less even on a busy machine.
    proxy.add_toxic(type="latency", attributes={"latency": 2000})
    assert proxy.toxics()["latency_downstream"].attributes == {"latency": 2000, "jitter": 0}
    with existing, greeted(proxy.listen) as fresh:
        assert round_trip(existing) >= 1.95
        assert round_trip(fresh) >= 1.95
        proxy.destroy_toxic("latency_downstream")
        assert_closed(fresh)  # what the toxic held would be lost: see the mid-stream test below
    with greeted(proxy.listen) as after:
        assert round_trip(after) < 1.0


RECORD = struct.Struct(">Q")
END = RECORD.pack(2**64 - 1)


class Pump:
    """Numbered records from ``sender`` to ``receiver`` on threads, each side stopping at its first error.

    The receiver reads until the end of the stream: the end record followed by EOF,
    or an EOF or reset anywhere (the proxy closed the connection).
    """

    def __init__(self, sender: socket.socket, receiver: socket.socket) -> None:
        self.sent = bytearray()
        self.received = bytearray()
        self.finished = threading.Event()  # the sender wrote the end record and shut its side down
        self.ended = threading.Event()  # the receiver saw the end of the stream (EOF or reset)
        self._sender, self._receiver = sender, receiver
        self._stop = threading.Event()
        receiver.settimeout(30)  # a stall, not a slow machine, is what would exceed it
        self._threads = [
            threading.Thread(target=self._send, daemon=True),
            threading.Thread(target=self._receive, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _send(self) -> None:
        i = 0
        try:
            while not self._stop.is_set():
                record = RECORD.pack(i)
                self._sender.sendall(record)
                self.sent += record
                i += 1
                time.sleep(0.001)
            self._sender.sendall(END)
            self.sent += END
            self._sender.shutdown(socket.SHUT_WR)
            self.finished.set()
        except OSError:
            pass

    def _receive(self) -> None:
        try:
            while chunk := self._receiver.recv(65536):
                self.received += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
        finally:
            self.ended.set()

    def wait_for(self, size: int) -> None:
        """Until ``size`` bytes arrived or the stream ended."""
        until(
            lambda: len(self.received) >= size or self.ended.is_set(), f"{size} bytes to arrive", every=0.01
        )

    def finish(self) -> None:
        """Stop sending; wait until the receiver saw the end of the stream."""
        self._stop.set()
        for t in self._threads:
            t.join(40)
            assert not t.is_alive(), "the stream neither completed nor closed: it stalled"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        sock.settimeout(5)
        yield sock


def toxic_change(server: Server, proxy: Any, change: str, stream: str) -> None:
    other = "downstream" if stream == "upstream" else "upstream"
    if change == "remove":
        proxy.destroy_toxic("slow")
    elif change == "update":
        url = f"{server.url}/proxies/{proxy.name}/toxics/slow"
        assert requests.post(url, json={"attributes": {"latency": 10}}, timeout=30).status_code == 200
    else:
        proxy.add_toxic(name="other", type="latency", stream=other, attributes={"latency": 10})


@pytest.mark.parametrize("change", ["remove", "update", "add"])
@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_toxic_change_mid_stream_never_truncates_or_garbles_it(
    server: Server, toxiproxy: Toxiproxy, listener: socket.socket, change: str, stream: str
) -> None:
    """What a latency toxic holds when it is changed must arrive, in order, or the connection must close.

    TCP never loses bytes from the middle of a stream: a proxy that drops what a
    toxic held and goes on forwarding (an AMQP client then sees frames vanish, or a
    frame cut in two) is a fault no real network produces.
    """
    host, port = listener.getsockname()[:2]
    proxy = toxiproxy.create(upstream=f"{host}:{port}", name="midstream")
    proxy.add_toxic(name="slow", type="latency", stream=stream, attributes={"latency": 200})
    client = connect(proxy.listen)
    server_side, _ = listener.accept()
    with client, server_side:
        sender, receiver = (client, server_side) if stream == "upstream" else (server_side, client)
        pump = Pump(sender, receiver)
        pump.wait_for(RECORD.size)  # the toxic is passing bytes and holds about 200 ms of them
        assert not pump.ended.is_set()
        toxic_change(server, proxy, change, stream)
        pump.wait_for(len(pump.received) + RECORD.size)
        pump.finish()
    received, sent = bytes(pump.received), bytes(pump.sent)
    assert sent.startswith(received), "bytes were lost from the middle of the stream or reordered"
    if pump.finished.is_set() and received == sent:
        return  # complete
    assert not received.endswith(END), "the stream ended early yet looked complete"


def test_a_change_behind_a_cut_keeps_the_connection_open(toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    """A partition's toxics discard by design: adding the reverse cut must not turn silence into a close."""
    proxy = toxiproxy.create(upstream=upstream.address, name="silent")
    with greeted(proxy.listen) as sock:
        proxy.add_toxic(name="cut_up", type="timeout", stream="upstream", attributes={"timeout": 0})
        proxy.add_toxic(name="cut_down", type="timeout", stream="downstream", attributes={"timeout": 0})
        sock.sendall(b"into the void")
        assert_stalled(sock)


def test_toxic_update_changes_attributes_and_toxicity(
    server: Server, toxiproxy: Toxiproxy, upstream: Upstream
) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="p")
    proxy.add_toxic(name="lat", type="latency", stream="upstream", attributes={"latency": 10, "jitter": 5})
    reply = requests.post(
        f"{server.url}/proxies/p/toxics/lat", json={"attributes": {"latency": 20}, "toxicity": 0.3}, timeout=5
    )
    assert reply.status_code == 200
    assert reply.json() == {
        "name": "lat",
        "type": "latency",
        "stream": "upstream",
        "toxicity": 0.3,
        "attributes": {"latency": 20, "jitter": 5},
    }
    assert requests.get(f"{server.url}/proxies/p/toxics/lat", timeout=5).json() == reply.json()


def test_timeout_zero_stalls_data_but_accepts_connections(toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="stall")
    proxy.add_toxic(name="cut", type="timeout", attributes={"timeout": 0})
    with connect(proxy.listen) as sock:
        assert_stalled(sock)
        sock.sendall(b"still writable")
        assert_stalled(sock, 0.3)
    proxy.destroy_toxic("cut")
    with greeted(proxy.listen) as sock:
        round_trip(sock)


def test_an_update_that_could_let_a_cut_connection_pass_closes_it(
    server: Server, toxiproxy: Toxiproxy, upstream: Upstream
) -> None:
    """A cut updated but still discarding everywhere keeps its silent connections; one whose
    toxicity drops below 1 closes them, since they lost bytes and might now pass again."""
    proxy = toxiproxy.create(upstream=upstream.address, name="partial")
    proxy.add_toxic(name="cut", type="timeout", stream="upstream", attributes={"timeout": 0})
    url = f"{server.url}/proxies/partial/toxics/cut"
    with greeted(proxy.listen) as sock:
        sock.sendall(b"discarded")
        assert requests.post(url, json={"attributes": {"timeout": 0}}, timeout=30).status_code == 200
        assert_stalled(sock)
        assert requests.post(url, json={"toxicity": 0.0}, timeout=30).status_code == 200
        assert_closed(sock)
    assert bytes(upstream.received) == b""
    with greeted(proxy.listen) as sock:
        round_trip(sock)  # toxicity 0: new connections pass


def test_timeout_with_delay_closes_the_connection(toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="expire")
    proxy.add_toxic(type="timeout", attributes={"timeout": 200})
    with connect(proxy.listen) as sock:
        started = time.monotonic()
        assert_closed(sock)
        assert time.monotonic() - started >= 0.15


def assert_reset(sock: socket.socket) -> None:
    """The peer sent an RST: a read fails with ECONNRESET (a FIN would read as b"")."""
    sock.settimeout(10)
    with pytest.raises(ConnectionResetError):
        data = sock.recv(1)
        raise AssertionError(f"expected a reset, got {data!r}")


def test_reset_peer_resets_open_and_new_connections_after_its_timeout(
    toxiproxy: Toxiproxy, upstream: Upstream
) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="rst")
    open_before = greeted(proxy.listen)
    proxy.add_toxic(name="rst", type="reset_peer", attributes={"timeout": 0})
    toxic = proxy.get_toxic("rst")
    assert (toxic.type, toxic.stream, toxic.attributes, toxic.toxicity) == (
        "reset_peer",
        "downstream",
        {"timeout": 0},
        1.0,
    )
    assert_reset(open_before)
    # With a timeout the stream is held (nothing passes) until the reset.
    proxy.destroy_toxic("rst")
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 400})
    assert sorted(proxy.toxics()) == ["reset_peer_downstream"]
    started = time.monotonic()
    sock = connect(proxy.listen)
    assert_stalled(sock, wait=0.1)
    assert_reset(sock)
    assert time.monotonic() - started >= 0.35
    proxy.destroy_toxic("reset_peer_downstream")
    assert round_trip(greeted(proxy.listen)) >= 0


def test_reset_peer_upstream_resets_the_upstream_side(toxiproxy: Toxiproxy, listener: socket.socket) -> None:
    host, port = listener.getsockname()[:2]
    proxy = toxiproxy.create(upstream=f"{host}:{port}", name="rst_up")
    proxy.add_toxic(type="reset_peer", stream="upstream", attributes={"timeout": 0})
    client = connect(proxy.listen)
    server_side, _ = listener.accept()
    with server_side:
        client.sendall(b"never forwarded")
        assert_reset(server_side)
    assert_closed(client)  # the library closes the other side once the upstream socket failed


def test_reset_peer_is_refused_below_full_toxicity(toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="rst_half")
    with pytest.raises(InvalidToxic, match="toxicity 1 only"):
        proxy.add_toxic(type="reset_peer", toxicity=0.5, attributes={"timeout": 0})
    assert proxy.toxics() == {}


@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_one_way_toxic_cuts_only_its_direction(toxiproxy: Toxiproxy, upstream: Upstream, stream: str) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="oneway")
    proxy.add_toxic(type="timeout", stream=stream, attributes={"timeout": 0})
    with connect(proxy.listen) as sock:
        sock.sendall(b"client bytes")
        if stream == "upstream":
            assert read_exactly(sock, len(GREETING)) == GREETING
            assert_stalled(sock)
            assert bytes(upstream.received) == b""
        else:
            assert_stalled(sock)
            assert bytes(upstream.received) == b"client bytes"


@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_a_one_way_cut_added_on_an_open_connection_cuts_its_own_direction(
    toxiproxy: Toxiproxy, upstream: Upstream, stream: str
) -> None:
    """noxious 1.0.4's rebuild swapped an open connection's two streams (the patched copy in
    ``vendor/noxious`` keeps them): an upstream cut then held the replies and let the client's
    bytes through."""
    proxy = toxiproxy.create(upstream=upstream.address, name="live")
    with greeted(proxy.listen) as sock:
        round_trip(sock, b"before")
        proxy.add_toxic(type="timeout", stream=stream, attributes={"timeout": 0}, name="cut")
        sock.sendall(b"while cut")
        assert_stalled(sock)
        if stream == "upstream":
            assert bytes(upstream.received) == b"before"
        else:  # the request crossed; its echo is what the cut holds
            until(lambda: bytes(upstream.received) == b"beforewhile cut", "the request to cross")


@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_a_cut_direction_holds_its_senders_hang_up_too(
    server: Server, toxiproxy: Toxiproxy, listener: socket.socket, stream: str
) -> None:
    """A partition drops a FIN or an RST as it drops bytes: the end a cut direction feeds hears
    nothing of the other end hanging up, neither through the cut stream (its sender's close) nor
    through the stream that still passes (writes into the closed end failing), until the heal
    closes the connection. The library closed the whole connection on either, so a probe across a
    one-way cut "passed" when the far end hung up on it."""
    host, port = listener.getsockname()[:2]
    proxy = toxiproxy.create(upstream=f"{host}:{port}", name="hangup")
    proxy.add_toxic(name="cut", type="timeout", stream=stream, attributes={"timeout": 0})
    client = connect(proxy.listen)
    server_side, _ = listener.accept()
    sender, receiver = (client, server_side) if stream == "upstream" else (server_side, client)
    passing = "downstream" if stream == "upstream" else "upstream"

    def closed() -> str | None:
        try:
            return (
                "the hang-up crossed the cut"
                if receiver.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
                else None
            )
        except BlockingIOError:
            return None
        except ConnectionResetError:
            return "the hang-up crossed the cut (a reset)"

    def write(n: int) -> None:
        receiver.sendall(b"x")
        until(
            lambda: counted(server, "hangup")[passing]["read"] == n,
            f"write {n} to reach the proxy",
            gone=closed,
        )

    with client, server_side:
        sender.close()
        assert_stalled(receiver)
        receiver.settimeout(10)
        write(1)  # meets the closed end, whose RST answers
        write(2)  # fails
        assert_stalled(receiver)
        proxy.destroy_toxic("cut")
        assert_closed(receiver)


def extra_field(server: Server, name: str, field: str) -> dict[str, Any]:
    """A field of ``GET /proxies/{name}`` that Toxiproxy lacks."""
    reply = requests.get(f"{server.url}/proxies/{name}", timeout=10)
    reply.raise_for_status()
    return dict(reply.json()[field])


def counted(server: Server, name: str) -> dict[str, dict[str, int]]:
    """The proxy's byte counters."""
    return extra_field(server, name, "bytes")


def test_byte_counters_count_each_direction_over_closed_connections_too(
    server: Server, toxiproxy: Toxiproxy, upstream: Upstream
) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="counted")
    zero = {"read": 0, "written": 0}
    assert counted(server, "counted") == {"upstream": zero, "downstream": zero}
    for _ in range(3):
        with greeted(proxy.listen) as sock:
            round_trip(sock, b"12345")
    want = {"upstream": {"read": 15, "written": 15}, "downstream": {"read": 24, "written": 24}}
    until(lambda: counted(server, "counted") == want, "the closed connections' bytes to stay counted")
    assert toxiproxy.get_proxy("counted").listen == proxy.listen  # the client ignores the extra field
    proxy.disable()
    proxy.enable()
    assert counted(server, "counted") == want  # a restart keeps the proxy's totals


def connections(server: Server, name: str) -> dict[str, int]:
    """The proxy's connection counts."""
    return extra_field(server, name, "connections")


def test_connection_counts_tell_an_upstream_with_no_listener(
    server: Server, toxiproxy: Toxiproxy, upstream: Upstream
) -> None:
    """What the partition evidence reads to tell a probe closed because nothing listens behind the
    proxy from one the far end answered: ``upstream_failed`` grows only for the former."""
    served = toxiproxy.create(upstream=upstream.address, name="served")
    nobody = toxiproxy.create(upstream=f"127.0.0.1:{free_port()}", name="nobody")
    assert (
        connections(server, "served")
        == connections(server, "nobody")
        == {"accepted": 0, "upstream_failed": 0}
    )
    for _ in range(2):
        with greeted(served.listen) as sock:
            round_trip(sock, b"12345")
    host, port = nobody.listen.rsplit(":", 1)
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.settimeout(10)
            try:
                assert sock.recv(64) == b""  # closed at once: nothing to connect to upstream
            except ConnectionResetError:
                pass
    until(
        lambda: connections(server, "nobody") == {"accepted": 3, "upstream_failed": 3},
        "three failed connects",
    )
    assert connections(server, "served") == {"accepted": 2, "upstream_failed": 0}
    assert counted(server, "nobody")["upstream"] == {"read": 0, "written": 0}
    assert toxiproxy.get_proxy("nobody").upstream == nobody.upstream  # the client ignores the extra field
    nobody.disable()
    nobody.enable()
    assert connections(server, "nobody") == {"accepted": 3, "upstream_failed": 3}  # kept across a restart


@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_a_cut_direction_reads_but_writes_nothing_on_open_and_new_connections(
    server: Server, toxiproxy: Toxiproxy, upstream: Upstream, stream: str
) -> None:
    """What the partition evidence reads: while a direction is cut, its ``written`` counter stands
    still however many bytes arrive (they are ``read`` and discarded); the other direction goes on."""
    proxy = toxiproxy.create(upstream=upstream.address, name="cutcount")
    other = "downstream" if stream == "upstream" else "upstream"
    # Bytes each direction meets while cut: two requests of 9 bytes up; down, a new greeting,
    # and the two echoes when the requests cross.
    meets = {"upstream": {"upstream": 18, "downstream": 3}, "downstream": {"upstream": 18, "downstream": 21}}
    with greeted(proxy.listen) as old:
        round_trip(old, b"before")
        until(lambda: counted(server, "cutcount")["downstream"]["written"] == 9, "the echo to be counted")
        proxy.add_toxic(type="timeout", stream=stream, attributes={"timeout": 0}, name="cut")
        at_cut = counted(server, "cutcount")
        with greeted(proxy.listen) if stream == "upstream" else connect(proxy.listen) as new:
            for sock in (old, new):
                sock.sendall(b"while cut")

            def arrived() -> dict[str, dict[str, int]] | None:
                now = counted(server, "cutcount")
                done = all(now[d]["read"] - at_cut[d]["read"] == n for d, n in meets[stream].items())
                return (
                    now
                    if done and now[other]["written"] - at_cut[other]["written"] == meets[stream][other]
                    else None
                )

            held = until(arrived, "the bytes sent while cut to reach the proxy")
            assert_stalled(old)
    assert held[stream]["written"] == at_cut[stream]["written"]


def test_disable_closes_connections_and_refuses_then_enable_listens_again(
    toxiproxy: Toxiproxy, upstream: Upstream
) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="flap")
    plain = greeted(proxy.listen)
    proxy.add_toxic(name="hold", type="timeout", stream="upstream", attributes={"timeout": 0})
    stalled = greeted(proxy.listen)
    stalled.sendall(b"never arrives")
    with plain, stalled:
        proxy.disable()
        assert_closed(plain)
        assert_closed(stalled)
    assert bytes(upstream.received) == b"", "the upstream toxic held the bytes until the close"
    with pytest.raises(ConnectionRefusedError):
        connect(proxy.listen)
    assert toxiproxy.get_proxy("flap").enabled is False
    proxy.destroy_toxic("hold")
    proxy.enable()
    with greeted(proxy.listen) as sock:
        round_trip(sock)


class StderrLines:
    """The server's stderr lines as they come (read on a thread: a pipe nobody reads fills up)."""

    def __init__(self, server: Server) -> None:
        assert server.process.stderr is not None
        self.lines: list[str] = []
        self._stream = server.process.stderr
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self._stream:
                self.lines.append(line.decode())
        except (OSError, ValueError):  # the fixture closed the pipe at the end of the test
            pass

    def seen(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))


def test_a_connection_accepted_as_the_proxy_stops_closes_with_it(
    server: Server, toxiproxy: Toxiproxy
) -> None:
    """A toxic change that closes the open connections (here the end of a discarding cut) stops
    the proxy and listens again. A connection accepted just before, whose upstream connect was
    still pending when the stop came, must close too: left running, it keeps the toxics it was
    accepted under, so a partition's heal leaves one link cut for good. The upstream's accept
    queue is kept full so that its connect waits across the stop (Linux drops the SYN of a
    connection that finds the accept queue full, and the client sends it again a second later)."""
    stderr = StderrLines(server)
    with socket.socket() as behind:
        behind.bind(("127.0.0.1", 0))
        behind.listen(0)  # room for one connection that is not yet accepted
        host, port = behind.getsockname()[:2]
        filler = socket.create_connection((host, port), timeout=10)
        proxy = toxiproxy.create(upstream=f"{host}:{port}", name="stopping")
        proxy.add_toxic(name="cut", type="timeout", stream="downstream", attributes={"timeout": 0})
        with filler, connect(proxy.listen) as client:
            until(lambda: connections(server, "stopping")["accepted"] == 1, "the proxy to accept the client")
            change = threading.Thread(target=proxy.destroy_toxic, args=("cut",))
            change.start()
            # The server runs on one thread: once it has said this, the stop has gone out
            # before the pending connect can complete.
            until(
                lambda: stderr.seen("stopping: closing open connections"),
                "the toxic change to stop the proxy",
            )
            behind.accept()[0].close()  # room in the accept queue: the proxy's connect completes
            upstream_side, _ = behind.accept()
            change.join()
            with upstream_side:
                upstream_side.settimeout(10)
                client.sendall(b"x")  # a connection left running forwards it (no toxic upstream)
                assert_closed(upstream_side)


def test_toxics_added_while_disabled_apply_on_enable(toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="later", enabled=False)
    proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 300})
    proxy.enable()
    listen = toxiproxy.get_proxy("later").listen  # the port is chosen when the proxy first listens
    with greeted(listen) as sock:
        assert round_trip(sock) >= 0.25


def test_limit_data_closes_after_the_byte_budget(toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="budget")
    proxy.add_toxic(type="limit_data", attributes={"bytes": len(GREETING) + 2})
    with greeted(proxy.listen) as sock:
        sock.sendall(b"hello")
        assert read_exactly(sock, 2) == b"he"
        assert_closed(sock)


def seconds_until_upstream_hangs_up(address: str) -> float:
    with greeted(address) as sock:
        started = time.monotonic()
        sock.sendall(HANG_UP)
        assert_closed(sock)
        return time.monotonic() - started


def test_slow_close_delays_the_close(toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="lingering")
    assert seconds_until_upstream_hangs_up(proxy.listen) < 1.0  # far below the delay, even on a busy machine
    proxy.add_toxic(type="slow_close", attributes={"delay": 2000})
    assert seconds_until_upstream_hangs_up(proxy.listen) >= 1.95


def test_bandwidth_and_slicer_pass_every_byte_at_the_limited_rate(
    toxiproxy: Toxiproxy, upstream: Upstream
) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="narrow")
    proxy.add_toxic(type="slicer", stream="upstream", attributes={"average_size": 100, "size_variation": 50})
    proxy.add_toxic(type="bandwidth", attributes={"rate": 100})
    payload = bytes(range(256)) * 200
    with greeted(proxy.listen) as sock:
        assert round_trip(sock, payload) >= 0.3
    assert bytes(upstream.received) == payload


def test_update_listen_moves_the_proxy(server: Server, toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    proxy = toxiproxy.create(upstream=upstream.address, name="mover")
    new_listen = f"127.0.0.1:{free_port()}"
    reply = requests.post(f"{server.url}/proxies/mover", json={"listen": new_listen}, timeout=5)
    assert reply.status_code == 200 and reply.json()["listen"] == new_listen
    with pytest.raises(ConnectionRefusedError):
        connect(proxy.listen)
    with greeted(new_listen) as sock:
        round_trip(sock)


def test_reset_removes_toxics_and_enables_every_proxy(toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    kept = toxiproxy.create(upstream=upstream.address, name="kept")
    kept.add_toxic(type="latency", attributes={"latency": 10_000})  # costs nothing unless reset fails
    down = toxiproxy.create(upstream=upstream.address, name="down")
    down.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    down.disable()
    assert toxiproxy.reset() is True
    for name in ("kept", "down"):
        proxy = toxiproxy.get_proxy(name)
        assert proxy.enabled is True and proxy.toxics() == {}
        with greeted(proxy.listen) as sock:
            assert round_trip(sock) < 5.0


def test_populate_creates_keeps_and_replaces(server: Server, upstream: Upstream) -> None:
    listen_a, listen_b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    spec: list[dict[str, Any]] = [
        {"name": "a", "listen": listen_a, "upstream": upstream.address},
        {"name": "b", "listen": listen_b, "upstream": upstream.address, "enabled": False},
    ]
    reply = requests.post(f"{server.url}/populate", json=spec, timeout=5)
    assert reply.status_code == 201
    assert [(p["name"], p["enabled"]) for p in reply.json()["proxies"]] == [("a", True), ("b", False)]
    toxic: dict[str, Any] = {"type": "latency", "attributes": {"latency": 5}}
    assert requests.post(f"{server.url}/proxies/a/toxics", json=toxic, timeout=5).status_code == 200

    again = requests.post(f"{server.url}/populate", json=spec[:1], timeout=5).json()["proxies"]
    assert len(again[0]["toxics"]) == 1, "an unchanged proxy keeps its toxics"

    moved = [{"name": "a", "listen": listen_a, "upstream": "127.0.0.1:9"}]
    replaced = requests.post(f"{server.url}/populate", json=moved, timeout=5).json()["proxies"]
    assert replaced[0]["upstream"] == "127.0.0.1:9" and replaced[0]["toxics"] == []

    bad = requests.post(f"{server.url}/populate", json=[{"name": "c"}], timeout=5)
    assert bad.status_code == 400
    assert bad.json() == {"error": "missing required field: upstream at proxy 1", "status": 400}


def test_config_file_creates_proxies_at_start(binary: Path, upstream: Upstream, tmp_path: Path) -> None:
    listen = f"127.0.0.1:{free_port()}"
    config = tmp_path / "toxiproxy.json"
    config.write_text(json.dumps([{"name": "from_config", "listen": listen, "upstream": upstream.address}]))
    running = start_server(binary, "--config", str(config))
    try:
        proxies = requests.get(f"{running.url}/proxies", timeout=5).json()
        assert proxies["from_config"]["listen"] == listen
        with greeted(listen) as sock:
            round_trip(sock)
    finally:
        stop_server(running)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "/nonexistent/proxies.json"], "cannot read config file"),
        (["--port", "notaport"], "--port must be a port number"),
    ],
)
def test_user_errors_end_in_one_line(binary: Path, args: list[str], message: str) -> None:
    result = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=10)
    assert result.returncode != 0
    first = result.stderr.splitlines()[0]
    assert message in first and "panicked" not in result.stderr


def test_error_responses(server: Server, toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    body = {"name": "dup", "upstream": upstream.address, "listen": "127.0.0.1:0"}
    assert requests.post(f"{server.url}/proxies", json=body, timeout=5).status_code == 201
    conflict = requests.post(f"{server.url}/proxies", json=body, timeout=5)
    assert (conflict.status_code, conflict.json()) == (409, {"error": "proxy already exists", "status": 409})

    missing = requests.get(f"{server.url}/proxies/nope", timeout=5)
    assert (missing.status_code, missing.json()) == (404, {"error": "proxy not found", "status": 404})
    with pytest.raises(NotFound):
        toxiproxy.get_proxy("dup").destroy_toxic("nope")

    proxy = toxiproxy.get_proxy("dup")
    proxy.add_toxic(type="slicer", attributes={"average_size": 8})
    dup_toxic = requests.post(
        f"{server.url}/proxies/dup/toxics",
        json={"type": "slicer", "attributes": {"average_size": 8}},
        timeout=5,
    )
    assert (dup_toxic.status_code, dup_toxic.json()["error"]) == (409, "toxic already exists")

    for bad in ('{"name": ', '{"upstream": "x:1"}', '{"name": "x", "upstream": 5}'):
        reply = requests.post(f"{server.url}/proxies", data=bad, timeout=5)
        assert reply.status_code == 400 and reply.json()["status"] == 400
    with pytest.raises(InvalidToxic, match="stream was invalid"):
        proxy.add_toxic(type="latency", stream="sideways")

    assert requests.delete(f"{server.url}/proxies/dup", timeout=5).status_code == 204
    assert requests.delete(f"{server.url}/proxies/dup", timeout=5).status_code == 404


class _Sidecar:
    """One proxy ``n1_to_n2_7000`` in n1's sidecar (the server under test), as the faults see a cluster."""

    def __init__(self, server: Server, upstream: str) -> None:
        from types import SimpleNamespace

        from harness.proxies import ProxySpec, ToxiproxyServer

        self.listen = f"127.0.0.1:{free_port()}"
        spec = ProxySpec(
            name="n1_to_n2_7000", listen=self.listen, upstream=upstream, src="n1", dst="n2", port=7000
        )
        sidecar = ToxiproxyServer("n1", "127.0.0.1", server.port)
        sidecar.populate([spec])
        self.cluster = SimpleNamespace(
            topology=SimpleNamespace(nodes=["n1", "n2"], proxies={"n1": [spec], "n2": []}),
            nodes={"n1": SimpleNamespace(toxiproxy=sidecar), "n2": SimpleNamespace(toxiproxy=None)},
        )


def test_overlapping_partitions_each_heal_only_their_own_cut(server: Server, upstream: Upstream) -> None:
    """Two partition faults holding the same link at once: healing the first leaves the second's cut in place."""
    from faults.network import Partition
    from harness.spec import FaultContext

    sidecar = _Sidecar(server, upstream.address)
    listen, cluster = sidecar.listen, sidecar.cluster
    params = {"shape": "custom", "mode": "drop", "cuts": [["n1", "n2"], ["n2", "n1"]]}
    first, second = (Partition(FaultContext(cluster), params, fid) for fid in ("f1", "f2"))
    first.apply()
    second.apply()
    assert_stalled(connect(listen))
    first.heal()
    assert_stalled(connect(listen))  # f2 still holds the link
    second.heal()
    sock = greeted(listen)
    round_trip(sock)
    sock.close()


def test_a_reply_in_two_writes_crosses_the_proxy_as_it_would_a_cable(toxiproxy: Toxiproxy) -> None:
    """Both sockets of a proxied connection have TCP_NODELAY, as in Toxiproxy (Go's default).

    The server answers in two writes 1 ms apart. A proxy socket with Nagle's algorithm
    holds the second write until the client's delayed ACK (about 40 ms on Linux, some 30
    times the direct round trip); without it the proxy adds only its own hops. Medians of
    round trips taking turns with direct ones, so both see the same load.
    """
    with TwoWriteServer() as upstream:
        proxy = toxiproxy.create(upstream=upstream.address, name="cable")
        times = alternate({"direct": upstream.address, "proxied": proxy.listen}, 60)
    direct, proxied = (statistics.median(times[path]) for path in ("direct", "proxied"))
    assert proxied < 5 * direct, f"proxied p50 {proxied * 1000:.1f} ms, direct p50 {direct * 1000:.1f} ms"


DISCARDING_FAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "partition both ways": ("partition", {"shape": "custom", "cuts": [["n1", "n2"], ["n2", "n1"]]}),
    "partition n1->n2": ("partition", {"shape": "one-way", "from": "n1", "to": "n2"}),
    "partition n2->n1": ("partition", {"shape": "one-way", "from": "n2", "to": "n1"}),
    "degrade reset_peer (healed before the reset)": (
        "degrade",
        {"type": "reset_peer", "node": "n1", "attributes": {"timeout": 600_000}},
    ),
}


@pytest.mark.parametrize("fault", list(DISCARDING_FAULTS))
def test_no_heal_lets_a_stream_with_a_hole_through(
    server: Server, listener: socket.socket, fault: str
) -> None:
    """Numbered records both ways on two connections; the harness's own fault cuts and heals them.

    The fault's toxics discard the bytes they receive while the connections stay open (a
    real network would have retransmitted them). After the heal every connection's
    received stream must be a prefix of what was sent, complete or closed: never a stream
    that goes on past a hole.
    """
    import random

    from faults.network import LinkToxic, Partition
    from harness.spec import FaultContext

    kind, params = DISCARDING_FAULTS[fault]
    cls = Partition if kind == "partition" else LinkToxic
    host, port = listener.getsockname()[:2]
    sidecar = _Sidecar(server, f"{host}:{port}")
    pumps: list[Pump] = []
    socks: list[socket.socket] = []
    for _ in range(2):
        client = connect(sidecar.listen)
        server_side, _ = listener.accept()
        socks += [client, server_side]
        pumps += [Pump(client, server_side), Pump(server_side, client)]
    try:
        for pump in pumps:
            pump.wait_for(RECORD.size)
        resolved = cls.resolve(params, ["n1", "n2"], random.Random(0))
        step = cls(FaultContext(sidecar.cluster), resolved, "f1")
        step.apply()
        at_cut = [len(p.sent) for p in pumps]
        # Every sender goes on writing (the toxic reads and discards what it cannot pass).
        until(
            lambda: all(
                len(p.sent) >= n + 20 * RECORD.size or p.ended.is_set()
                for p, n in zip(pumps, at_cut, strict=True)
            ),
            "20 more records from every sender",
            every=0.01,
        )
        step.heal()
        at_heal = [len(p.received) for p in pumps]
        until(
            lambda: all(len(p.received) > n or p.ended.is_set() for p, n in zip(pumps, at_heal, strict=True)),
            "every stream to go on or end after the heal",
            every=0.01,
        )
        for pump in pumps:
            pump.finish()
    finally:
        for sock in socks:
            sock.close()
    for i, pump in enumerate(pumps):
        received, sent = bytes(pump.received), bytes(pump.sent)
        if not sent.startswith(received):
            size = RECORD.size
            at = next(
                k for k in range(0, len(received), size) if sent[k : k + size] != received[k : k + size]
            )
            got = (
                f"record {RECORD.unpack_from(received, at)[0]}"
                if len(received) >= at + size
                else "a partial record"
            )
            pytest.fail(f"stream {i}: {got} arrived where record {at // size} was due: a hole after the heal")
