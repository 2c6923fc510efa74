"""One request line in, one JSON line out, over a unix socket.

Both control sockets (lazyfs's and the node init's) speak this, so that `docker exec` with a tiny
client, or `socat`, is all the harness needs to drive a fault inside a container.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

Handler = Callable[[str], dict[str, Any]]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class LineServer:
    """Serve a unix socket on a daemon thread; each connection may send several request lines."""

    def __init__(self, path: str, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.closed = False
        self.thread = threading.Thread(target=self._accept, name=f"control:{path}", daemon=True)

    def start(self) -> LineServer:
        self.thread.start()
        return self

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            for raw in f:
                line = raw.decode("utf-8", "replace").strip()
                if not line:
                    continue
                try:
                    reply = self.handler(line)
                except Exception as e:  # a failed command is reported to the caller, never kills the server
                    reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                f.write(json.dumps(reply, sort_keys=True).encode() + b"\n")
                f.flush()

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class ControlError(Exception):
    """The control socket is missing or did not answer."""


def request(path: str, line: str, timeout: float = 60.0) -> dict[str, Any]:
    """Send one request line and return the decoded reply."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        raise ControlError(f"cannot reach control socket {path}: {e.strerror or e}") from None
    with s, s.makefile("rwb") as f:
        f.write(line.strip().encode() + b"\n")
        f.flush()
        try:
            raw = f.readline()
        except TimeoutError:
            raise ControlError(f"no reply from {path} within {timeout}s") from None
    if not raw:
        raise ControlError(f"{path} closed the connection without a reply")
    reply: dict[str, Any] = json.loads(raw)
    return reply


def wait_for_socket(path: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Wait until a server answers on `path` (any reply will do)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not alive():
            raise ControlError(f"the process serving {path} exited")
        try:
            request(path, "ping", timeout=2.0)
            return
        except ControlError as e:
            last = str(e)
        time.sleep(0.05)
    raise ControlError(f"{path} not ready after {timeout}s ({last})")
