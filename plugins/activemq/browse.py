"""How many messages an ActiveMQ node holds for a queue, counted by a STOMP queue browser.

Run inside the broker's container (``python3 browse.py PORT QUEUE``; standard library only):
ActiveMQ from Debian has no cheap ready/unacked split (JMX starts a JVM per look, the web
console is disabled), so the plugin's ``queue_depth`` is a ``HeldTotal``: a browser sees every
message the queue holds, ready or delivered but not yet acknowledged. Prints the count; exits
non-zero with the reason when the node does not answer (a slave waiting on the store's lock).
"""

from __future__ import annotations

import socket
import sys

TIMEOUT = 10.0


def frames(sock: socket.socket) -> object:
    """STOMP frames as (command, headers), bodies skipped (NUL-terminated; heart-beats ignored)."""
    buf = b""
    while True:
        while b"\0" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            buf += chunk
        frame, _, buf = buf.partition(b"\0")
        head = frame.lstrip(b"\r\n").split(b"\n\n", 1)[0].decode(errors="replace").splitlines()
        if not head:
            continue
        headers = dict(line.split(":", 1) for line in head[1:] if ":" in line)
        yield head[0], headers


def count(port: int, queue: str) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.settimeout(TIMEOUT)
        got = frames(sock)
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\nheart-beat:0,0\n\n\0")
        command, headers = next(got)  # type: ignore[call-overload]
        if command != "CONNECTED":
            raise ConnectionError(f"{command}: {headers.get('message', '')}")
        sock.sendall(f"SUBSCRIBE\nid:0\ndestination:/queue/{queue}\nack:auto\nbrowser:true\n\n\0".encode())
        n = 0
        for command, headers in got:  # type: ignore[attr-defined]
            if command == "ERROR":
                raise ConnectionError(headers.get("message", "ERROR frame"))
            if command == "MESSAGE":
                if headers.get("browser") == "end":
                    return n
                n += 1
    raise ConnectionError("unreachable")


if __name__ == "__main__":
    try:
        print(count(int(sys.argv[1]), sys.argv[2]))
    except (OSError, ConnectionError) as exc:
        print(f"browse: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
