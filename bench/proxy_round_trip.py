"""Round trips through the project's Toxiproxy server against the same round trips made directly.

    python -m bench.proxy_round_trip                      # ~10 s
    python -m bench.proxy_round_trip --compare OLD_BINARY  # also through another build

A server on loopback answers each 16-byte request in two writes 1 ms apart (an 8-byte
header, then a 24-byte body), as servers often do (a header then a body, a command's reply
then a replication ack). Server and client set ``TCP_NODELAY``, as brokers and their client
libraries do, so only the proxy's own sockets decide whether Nagle's algorithm holds the
second write back until the peer's delayed ACK (about 40 ms on Linux). One persistent
connection goes straight to the server, one through a proxy of the built
``tools/toxiproxy-server`` binary with no toxic; their round trips alternate, so both see
the same load. The figure is the ratio of the two medians (proxied / direct): a cable's is
about 1. Results: bench/results/proxy_round_trip.{json,md} (``--name`` for another stem).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import socketserver
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BINARY = REPO / "tools" / "toxiproxy-server" / "target" / "release" / "brokerchaos-toxiproxy"
REQUEST = b"q" * 16
HEADER = b"h" * 8
BODY = b"b" * 24
GAP = 0.001


class TwoWriteServer(socketserver.ThreadingTCPServer):
    """Answers every ``REQUEST`` with ``HEADER``, then ``GAP`` seconds later ``BODY``."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, gap: float = GAP) -> None:
        super().__init__(("127.0.0.1", 0), _TwoWriteHandler)
        self.gap = gap

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return f"{host!s}:{port}"

    def __enter__(self) -> TwoWriteServer:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


class _TwoWriteHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: TwoWriteServer = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while _read_exactly(sock, len(REQUEST)):
                sock.sendall(HEADER)
                time.sleep(server.gap)
                sock.sendall(BODY)
        except OSError:
            pass


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def client(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def round_trip(sock: socket.socket) -> float:
    """Seconds from sending a request to the last byte of its two-part reply."""
    started = time.perf_counter()
    sock.sendall(REQUEST)
    if _read_exactly(sock, len(HEADER) + len(BODY)) != HEADER + BODY:
        raise ConnectionError("the reply was cut short")
    return time.perf_counter() - started


def alternate(addresses: dict[str, str], count: int) -> dict[str, list[float]]:
    """``count`` round trips on one connection to each address, taking turns."""
    socks = {name: client(address) for name, address in addresses.items()}
    times: dict[str, list[float]] = {name: [] for name in addresses}
    try:
        for sock in socks.values():
            round_trip(sock)  # the first one also opens the proxy's upstream connection
        for _ in range(count):
            for name, sock in socks.items():
                times[name].append(round_trip(sock))
    finally:
        for sock in socks.values():
            sock.close()
    return times


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    q = statistics.quantiles(ms, n=100)
    return {"p50_ms": q[49], "p90_ms": q[89], "p99_ms": q[98], "max_ms": ms[-1]}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ProxyServer:
    """One running Toxiproxy-API server binary with one proxy to ``upstream``."""

    def __init__(self, binary: Path, upstream: str) -> None:
        import requests

        port = free_port()
        self.process = subprocess.Popen(
            [str(binary), "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{binary} exited with {self.process.returncode}")
            try:
                requests.get(f"{url}/version", timeout=2)
                break
            except requests.ConnectionError:
                time.sleep(0.05)
        body = {"name": "bench", "listen": "127.0.0.1:0", "upstream": upstream}
        reply = requests.post(f"{url}/proxies", json=body, timeout=10)
        reply.raise_for_status()
        self.listen: str = reply.json()["listen"]

    def __enter__(self) -> ProxyServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def measure(binaries: dict[str, Path], count: int, gap: float) -> dict[str, Any]:
    with TwoWriteServer(gap) as upstream, contextlib.ExitStack() as stack:
        proxies = {
            name: stack.enter_context(ProxyServer(b, upstream.address)) for name, b in binaries.items()
        }
        addresses = {"direct": upstream.address} | {name: p.listen for name, p in proxies.items()}
        times = alternate(addresses, count)
    paths = {name: summary(samples) for name, samples in times.items()}
    direct = paths["direct"]["p50_ms"]
    for name in binaries:
        paths[name]["ratio_p50_to_direct"] = paths[name]["p50_ms"] / direct
    return paths


def markdown(result: dict[str, Any]) -> str:
    from bench.facts import facts_markdown

    lines = [
        "# Round trips through the Toxiproxy server vs direct",
        "",
        facts_markdown(result["machine"], result["command"]).rstrip(),
        f"- workload: {result['count']} round trips per path on one persistent loopback connection each, "
        f"paths taking turns; request 16 B, reply 8 B + {result['gap_ms']:g} ms + 24 B (two writes); "
        "server and client set TCP_NODELAY; no toxic",
        "",
        "| path | p50 ms | p90 ms | p99 ms | max ms | p50 / direct p50 |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in result["paths"].items():
        ratio = f"{s['ratio_p50_to_direct']:.2f}" if "ratio_p50_to_direct" in s else "1"
        label = result["labels"].get(name, name)
        lines.append(
            f"| {label} | {s['p50_ms']:.2f} | {s['p90_ms']:.2f} | {s['p99_ms']:.2f} | {s['max_ms']:.2f} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    from bench.facts import command_line, machine_facts, write_json, write_text

    ap = argparse.ArgumentParser(prog="python -m bench.proxy_round_trip", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--binary", type=Path, default=BINARY, help="the server to measure (default: the built one)"
    )
    ap.add_argument("--compare", type=Path, help="another build of the server to measure in the same run")
    ap.add_argument("--compare-label", default="other build", help="how the results name --compare")
    ap.add_argument("--count", type=int, default=300, help="round trips per path (default 300)")
    ap.add_argument(
        "--gap-ms", type=float, default=GAP * 1000, help="pause between the two writes (default 1)"
    )
    ap.add_argument(
        "--name",
        default="proxy_round_trip",
        help="results file stem under bench/results/ (default proxy_round_trip)",
    )
    args = ap.parse_args()
    for path in filter(None, (args.binary, args.compare)):
        if not os.access(path, os.X_OK):
            print(
                f"error: {path} is not an executable; build it with "
                "`cargo build --release --locked` in tools/toxiproxy-server",
                file=sys.stderr,
            )
            return 2
    if args.count < 10:
        print("error: --count must be at least 10", file=sys.stderr)
        return 2
    binaries = {"proxied": args.binary} | ({"compare": args.compare} if args.compare else {})
    facts = machine_facts()
    paths = measure(binaries, args.count, args.gap_ms / 1000)
    facts["load_average_at_end"] = os.getloadavg()
    result = {
        "command": command_line(),
        "machine": facts,
        "count": args.count,
        "gap_ms": args.gap_ms,
        "labels": {"direct": "direct", "proxied": "through the server", "compare": args.compare_label},
        "binaries": {k: str(v) for k, v in binaries.items()},
        "paths": paths,
    }
    write_json(f"{args.name}.json", result)
    text = markdown(result)
    write_text(f"{args.name}.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
