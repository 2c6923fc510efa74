"""`python -m faults.node.probe [--wait S] HOST:PORT...`: does a link carry bytes both ways?

Runs in a node's network namespace (the broker container shares its sidecar's), where each
address is a proxy's listen address: the way the broker itself reaches a peer. Each probe opens a
connection, writes a few bytes no protocol accepts (0xff: a frame length beyond any limit, an
AMQP header mismatch) and waits up to S seconds for the far end to answer anything or close:

- ``refused``: the connection was refused or reset at once (a disabled proxy);
- ``passes``: bytes or a close came back (the far end heard us and we heard it);
- ``stalled``: nothing came back (a cut that drops the bytes, or a peer that answers garbage
  with silence: only a probe that passes on the same link at another time tells them apart).

Standard library only; prints one JSON line ``{"ok": true, "probes": {ADDRESS: {...}}}``.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PROBE = b"\xff" * 8


def probe(address: str, wait: float) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    host = "127.0.0.1" if host in ("", "0.0.0.0") else host
    started = time.monotonic()
    try:
        sock = socket.create_connection((host, int(port)), timeout=wait)
    except (ConnectionRefusedError, ConnectionResetError) as e:
        return {"result": "refused", "error": type(e).__name__, "ms": _ms(started)}
    except TimeoutError:
        return {"result": "stalled", "at": "connect", "ms": _ms(started)}
    except OSError as e:
        return {"result": "refused", "error": f"{type(e).__name__}: {e}", "ms": _ms(started)}
    with sock:
        try:
            sock.sendall(PROBE)
            sock.settimeout(max(0.01, wait - (time.monotonic() - started)))
            data = sock.recv(64)
        except TimeoutError:
            return {"result": "stalled", "at": "reply", "ms": _ms(started)}
        except OSError as e:  # a reset after the connect: the far end heard us and answered
            return {"result": "passes", "reply": type(e).__name__, "ms": _ms(started)}
    return {"result": "passes", "reply": "bytes" if data else "close", "ms": _ms(started)}


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


def probe_all(addresses: list[str], wait: float) -> dict[str, dict[str, Any]]:
    """Every probe at once, so that a stalled one costs ``wait`` once, not per link."""
    with ThreadPoolExecutor(max_workers=max(1, len(addresses))) as pool:
        results = list(pool.map(lambda a: probe(a, wait), addresses))
    return dict(zip(addresses, results, strict=True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faults.node.probe")
    p.add_argument("--wait", type=float, default=1.5, help="seconds to wait for an answer")
    p.add_argument("addresses", nargs="+", metavar="HOST:PORT")
    a = p.parse_args(argv)
    print(json.dumps({"ok": True, "probes": probe_all(a.addresses, a.wait)}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
