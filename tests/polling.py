"""Waiting in tests: poll a condition until it holds, with no deadline.

A busy CI machine is slow, not wrong, so no wait here gives up after some number of
seconds: that would fail a test on no defect. A wait that never ends is a hang, and the
suite's hang guard ends it (``timeout`` under ``[tool.pytest.ini_options]`` in
pyproject.toml, from pytest-timeout), printing every thread's stack with this wait's
``what`` in it. Where something can tell that the condition will never hold (the process
that should make it true has exited), pass ``gone``: the wait then fails at once with
what it returns.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

Gone = Callable[[], str | None]
"""Why the condition can no longer hold (``None``: it still can)."""


def until(
    cond: Callable[[], Any],
    what: str,
    *,
    every: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
    gone: Gone | None = None,
) -> Any:
    """Poll ``cond`` every ``every`` seconds until it returns something true, and return that.
    Exceptions of the ``ignore`` types count as "not yet" (a node that does not answer yet)."""
    while True:
        try:
            got = cond()
            if got:
                return got
        except ignore:
            pass
        _check(gone, what)
        time.sleep(every)


async def until_async(
    cond: Callable[[], Any | Awaitable[Any]], what: str, *, every: float = 0.05, gone: Gone | None = None
) -> Any:
    """``until`` inside an event loop: ``cond`` may be a plain or an async function."""
    while True:
        got = cond()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        _check(gone, what)
        await asyncio.sleep(every)


def _check(gone: Gone | None, what: str) -> None:
    why = gone() if gone is not None else None
    if why:
        raise AssertionError(f"waiting for {what}: {why}")
