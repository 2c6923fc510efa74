"""A stopped transport's dialers end, whenever the stop comes.

Python 3.11's ``asyncio.wait_for`` returns the inner result (or raises its error) when a cancel
meets an inner call that has just finished: a dial loop that retries on ``OSError`` then never
sees its cancel and dials forever, and a node whose start failed (its client port taken) hung in
``asyncio.run``'s teardown instead of exiting. The stop is tried here after every number of
event-loop turns up to 60, with a peer that refuses at once, on both event loops the broker runs on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from broker_impl.cluster.transport import Transport
from tests.ports import free_port

TRIES = 60
TURNS_TO_END = 200  # event-loop turns a cancelled dialer gets to end; a lost cancel never ends


def _loops() -> list[Callable[[], asyncio.AbstractEventLoop]]:
    loops: list[Callable[[], asyncio.AbstractEventLoop]] = [asyncio.new_event_loop]
    try:
        import uvloop
    except ImportError:
        return loops
    return [*loops, uvloop.new_event_loop]


async def _still_dialling_after_stop(turns: int) -> list[str]:
    refused = free_port()  # nobody listens there: every dial fails at once with ECONNREFUSED
    t = Transport(
        "n1",
        ("127.0.0.1", free_port()),
        {"n2": ("127.0.0.1", refused)},
        tick=0.05,
        on_message=lambda *_: None,
        on_up=lambda _peer: None,
        on_down=lambda _peer: None,
    )
    await t.start()
    for _ in range(turns):
        await asyncio.sleep(0)
    dialers = list(t._dialers.values())
    await t.stop()
    for _ in range(TURNS_TO_END):
        if all(d.done() for d in dialers):
            return []
        await asyncio.sleep(0)
    return [d.get_name() for d in dialers if not d.done()]


@pytest.mark.parametrize("new_loop", _loops(), ids=lambda f: f.__module__.split(".")[0])
def test_stop_ends_every_dialer_whenever_it_comes(new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    stuck = {}
    for turns in range(TRIES):
        with asyncio.Runner(loop_factory=new_loop) as runner:
            left = runner.run(_still_dialling_after_stop(turns))
        if left:
            stuck[turns] = left
    assert not stuck, f"dialers still running after stop (by turns before the stop): {stuck}"
