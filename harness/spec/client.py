"""The client contract: what a workload driver for one wire protocol offers the scheduler.

A client plugin registers a factory per protocol (``register.add_client``); a broker
plugin names the protocol it speaks (``BrokerPlugin.protocol``) and so the driver it
needs. The factory is called as ``factory(endpoints, recorder, first_node=...,
**options)`` with ``endpoints`` a ``{node: Endpoint}`` of the client ports through the
proxies, ``recorder`` the run's history writer (``harness.spec.history`` says what
each operation records) and ``options`` from ``driver_options`` (credentials, the
scenario's workload section, the seed, ``queue_depth``). It returns a ``Driver``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

#: ``(node, queue) -> (ready, unacked)``, or None when the broker plugin cannot tell.
QueueDepth = Callable[[str, str], Awaitable[tuple[int, int] | None]]


@dataclass
class Endpoint:
    node: str
    host: str
    port: int


class Driver(Protocol):
    """What a protocol driver offers the scheduler."""

    async def setup(self, queues: Sequence[str]) -> None: ...
    async def produce(self, process: str, queue: str, stop: asyncio.Event) -> None: ...
    async def consume(self, process: str, queue: str, stop: asyncio.Event) -> None: ...
    async def drain(self, process: str, queue: str) -> int: ...


class RateLimiter:
    """Evenly spaced permits at ``rate`` per second (0 = unlimited); no catch-up bursts."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next = time.monotonic()

    async def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        if self.next > now:
            await asyncio.sleep(self.next - now)
            self.next += self.interval
        else:
            self.next = now + self.interval
