"""One request over NATS's text protocol, from inside a node's container, as the system user.

The membership calls of the plugin are system-account requests: ``$JS.API.SERVER.REMOVE``
(what ``nats server raft peer-remove`` sends; only the meta leader answers) and
``$SYS.REQ.SERVER.PING.JSZ`` with ``leader_only`` (the meta leader's view of the meta group,
the only view that lists every peer). The image has no NATS client and the host reaches a
node only through the proxies (which partitions cut): the plugin runs this file's source in
the container (``python3 -c SOURCE PORT USER PASSWORD SUBJECT PAYLOAD WAIT``), against the
node's own server on 127.0.0.1, and reads the JSON line it prints. Only the standard library
is imported.

The protocol part is bytes in, events out (``Parser``) and lines out (``handshake``,
``request_lines``), so it is tested on literal bytes without a server.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from typing import Any

INBOX = "_INBOX.brokerchaos.sysreq"
CRLF = b"\r\n"


def handshake(user: str, password: str) -> bytes:
    """CONNECT with the user's credentials: no echo of our own publishes, no ``+OK`` per line."""
    opts = {
        "verbose": False,
        "pedantic": False,
        "user": user,
        "pass": password,
        "lang": "python",
        "version": "brokerchaos-sysreq",
        "protocol": 1,
        "echo": False,
        "headers": False,
    }
    return b"CONNECT " + json.dumps(opts, separators=(",", ":")).encode() + CRLF


def request_lines(subject: str, payload: bytes, inbox: str = INBOX) -> bytes:
    """Subscribe to the reply inbox, publish the request with it as reply subject, then PING:
    the PONG says the server has processed both (an error would come before it)."""
    return (
        f"SUB {inbox} 1".encode()
        + CRLF
        + f"PUB {subject} {inbox} {len(payload)}".encode()
        + CRLF
        + payload
        + CRLF
        + b"PING"
        + CRLF
    )


class ProtocolError(Exception):
    """The server said ``-ERR`` or sent something this parser does not know."""


class Parser:
    """Server-to-client protocol: ``INFO``, ``MSG``, ``PING``, ``PONG``, ``+OK``, ``-ERR``.

    ``feed`` takes whatever bytes arrived and returns the complete events among them, each a
    tuple: ``("info", dict)``, ``("msg", subject, reply, payload)``, ``("ping",)``,
    ``("pong",)``, ``("ok",)``, ``("err", text)``; a partial line or payload waits for more."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        self.buf += data
        out: list[tuple[Any, ...]] = []
        while True:
            end = self.buf.find(CRLF)
            if end < 0:
                return out
            line = self.buf[:end].decode(errors="replace")
            op, _, rest = line.partition(" ")
            op = op.upper()
            if op == "MSG":
                args = rest.split()
                if len(args) not in (3, 4):
                    raise ProtocolError(f"bad MSG line: {line!r}")
                size = int(args[-1])
                start = end + 2
                if len(self.buf) < start + size + 2:
                    return out  # the payload is still on its way
                payload = self.buf[start : start + size]
                self.buf = self.buf[start + size + 2 :]
                out.append(("msg", args[0], args[2] if len(args) == 4 else None, payload))
                continue
            self.buf = self.buf[end + 2 :]
            if op == "INFO":
                out.append(("info", json.loads(rest)))
            elif op == "PING":
                out.append(("ping",))
            elif op == "PONG":
                out.append(("pong",))
            elif op == "+OK":
                out.append(("ok",))
            elif op == "-ERR":
                out.append(("err", rest.strip().strip("'")))
            else:
                raise ProtocolError(f"unknown protocol line: {line!r}")


def request(
    port: int, user: str, password: str, subject: str, payload: bytes, wait: float, host: str = "127.0.0.1"
) -> list[Any]:
    """Send one request and gather the replies for ``wait`` seconds, or until the first one
    (the requests used here have one answerer). Replies that are JSON come back decoded."""
    parser = Parser()
    replies: list[Any] = []
    deadline = time.monotonic() + wait
    with socket.create_connection((host, port), timeout=wait) as sock:
        sock.sendall(handshake(user, password) + request_lines(subject, payload))
        while not replies:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                raise ProtocolError("the server closed the connection")
            for event in parser.feed(data):
                if event[0] == "err":
                    raise ProtocolError(event[1])
                if event[0] == "ping":
                    sock.sendall(b"PONG" + CRLF)
                elif event[0] == "msg":
                    try:
                        replies.append(json.loads(event[3]))
                    except ValueError:
                        replies.append(event[3].decode(errors="replace"))
    return replies


if __name__ == "__main__":
    port, user, password, subject, body, wait = sys.argv[1:7]
    try:
        got = request(int(port), user, password, subject, body.encode(), float(wait))
    except (OSError, ProtocolError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        sys.exit(1)
    print(json.dumps({"replies": got}))
