"""Toxiproxy wiring, through ``toxiproxy-python``.

Each node has its own Toxiproxy server sharing the node's network namespace (a
sidecar). In node A's namespace, every peer host name B resolves to a loopback
address of A's sidecar, which listens there on B's inter-node ports and forwards
to B: so A->B and B->A are separate proxies and every directed link can be cut
alone. A client proxy in each sidecar forwards the published client port to the
broker. ``toxiproxy-python`` keeps its server address in a class attribute, so
every call goes through ``ToxiproxyServer`` under one lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from harness.errors import ClusterError

_lock = threading.RLock()

#: Where the client proxy listens inside each node's namespace: 40000 + port % 10000.
CLIENT_PROXY_OFFSET = 40000


def client_proxy_port(client_port: int) -> int:
    return CLIENT_PROXY_OFFSET + client_port % 10000


def extra_client_proxy_port(port: int) -> int:
    """Where the client proxy of a further client port listens (``extra_client_ports``): 50000 +
    port % 10000, apart from the client port's (6379 and 26379 would meet at 46379)."""
    return CLIENT_PROXY_OFFSET + 10000 + port % 10000


def peer_address(index: int) -> str:
    """The loopback address node ``index`` (1-based) has inside every other node's namespace."""
    return f"127.0.0.{10 + index}"


@dataclass(frozen=True)
class ProxySpec:
    """One directed link. ``src`` is the node whose sidecar holds it (``client`` for client links)."""

    name: str
    listen: str
    upstream: str
    src: str
    dst: str
    port: int

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "listen": self.listen, "upstream": self.upstream, "enabled": True}


class ToxiproxyServer:
    """One Toxiproxy-API server (one node's sidecar), reached from the harness."""

    def __init__(self, node: str, host: str, port: int) -> None:
        self.node = node
        self.host = host
        self.port = port

    @contextmanager
    def _api(self) -> Iterator[Any]:
        from toxiproxy import Toxiproxy

        with _lock:
            server = Toxiproxy()
            server.update_api_consumer(self.host, self.port)
            yield server

    def wait(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._api() as api:
                if api.running():
                    return
            time.sleep(0.2)
        raise ClusterError(
            f"Toxiproxy server of {self.node} at {self.host}:{self.port} did not answer in {timeout:.0f}s"
        )

    def populate(self, proxies: list[ProxySpec], attempts: int = 5) -> None:
        """Create the proxies (create-or-replace). A server that has just started can still
        reset the first requests, so connection errors are retried a few times."""
        import requests

        for attempt in range(attempts):
            try:
                with self._api() as api:
                    api.populate(
                        [{"name": p.name, "listen": p.listen, "upstream": p.upstream} for p in proxies]
                    )
                return
            except requests.ConnectionError as exc:
                if attempt == attempts - 1:
                    raise ClusterError(
                        f"Toxiproxy server of {self.node} refused the proxies: {exc}"
                    ) from None
                time.sleep(0.5 * (attempt + 1))

    def proxies(self) -> dict[str, dict[str, Any]]:
        """Each proxy: enabled, addresses, its toxics' names and ``bytes``, the project server's
        counters (per stream, ``read`` from its sender and ``written`` to its receiver, over every
        connection the proxy carried; None from a server without them, as Toxiproxy's own) and
        ``connections`` (``accepted``, and ``upstream_failed``: closed at once, nothing listened
        upstream; None likewise). Read from the raw answer: the client drops fields it does not know."""
        import requests

        reply = requests.get(f"http://{self.host}:{self.port}/proxies", timeout=10)
        reply.raise_for_status()
        return {
            name: {
                "enabled": p["enabled"],
                "listen": p["listen"],
                "upstream": p["upstream"],
                "toxics": sorted(t["name"] for t in p.get("toxics") or []),
                "bytes": p.get("bytes"),
                "connections": p.get("connections"),
            }
            for name, p in reply.json().items()
        }

    def set_enabled(self, name: str, enabled: bool) -> None:
        with self._api() as api:
            proxy = api.get_proxy(name)
            if proxy is None:
                raise ClusterError(f"no proxy {name!r} on {self.node}'s Toxiproxy")
            if enabled:
                proxy.enable()
            else:
                proxy.disable()

    def add_toxic(
        self,
        proxy_name: str,
        *,
        name: str,
        type: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        with self._api() as api:
            proxy = api.get_proxy(proxy_name)
            if proxy is None:
                raise ClusterError(f"no proxy {proxy_name!r} on {self.node}'s Toxiproxy")
            proxy.add_toxic(
                name=name, type=type, stream=stream, toxicity=toxicity, attributes=attributes or {}
            )

    def remove_toxic(self, proxy_name: str, toxic: str) -> None:
        with self._api() as api:
            proxy = api.get_proxy(proxy_name)
            if proxy is not None and toxic in proxy.toxics():
                proxy.destroy_toxic(toxic)

    def reset(self) -> None:
        """Enable every proxy and remove every toxic (idempotent)."""
        with self._api() as api:
            api.reset()
