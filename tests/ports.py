"""Ports for the servers the tests start themselves (broker nodes, proxies, Spark, NATS).

Asking the kernel for port 0 and closing it again is a race under pytest-xdist: the kernel hands
the same number to the next worker that asks, and a port chosen free on 127.0.0.1 may be held on
127.0.0.2 (the cluster tests listen on 127.0.0.2-4), so two workers' nodes met on one address.
Here each worker takes its ports from a range of its own below the kernel's ephemeral range
(32768-60999 by default, where outgoing connections and Docker's published ports live), in turn,
and a port is only handed out if a wildcard bind (which conflicts with a bind on any address)
shows nobody holds it. Two test sessions at once on one machine (a targeted run beside a suite)
share the worker names, so each begins its turn at a place of its own in the range (by process
id): in step, two sessions handed out the same free port at once and one node could not listen.
"""

from __future__ import annotations

import itertools
import os
import socket

_BASE = 20000
_SPAN = 1500  # ports per worker: a full suite run uses a few hundred
_WORKERS = 8  # 20000 + 8 * 1500 = 32000, below the ephemeral range


def _worker() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = name.removeprefix("gw")
    return int(digits) % _WORKERS if digits.isdigit() else 0


_start = _BASE + _worker() * _SPAN
_first = _start + (os.getpid() * 131) % _SPAN
_turn = itertools.cycle([*range(_first, _start + _SPAN), *range(_start, _first)])


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nobody holds on any address, from this worker's range."""
    for _ in range(_SPAN):
        port = next(_turn)
        if _free(port):
            return port
    raise RuntimeError(f"no free port in {_start}-{_start + _SPAN - 1}: is a previous test run still up?")


def free_ports(n: int) -> list[int]:
    return [free_port() for _ in range(n)]
