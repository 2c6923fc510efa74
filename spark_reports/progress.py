"""Progress lines on stderr, one per stage, for the engines and the service alike; muted per thread."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_T0 = time.monotonic()
_muted = threading.local()


@contextmanager
def quiet() -> Iterator[None]:
    """No progress lines from this thread (a warm-up check in the background of a run)."""
    _muted.on = True
    try:
        yield
    finally:
        _muted.on = False


def progress(engine: str, stage: str, **numbers: Any) -> None:
    """One short line per stage on stderr, so a long job visibly moves."""
    if getattr(_muted, "on", False):
        return
    numbers["t"] = f"{time.monotonic() - _T0:.1f}s"
    extra = " ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in numbers.items())
    print(f"spark_reports[{engine}]: {stage} {extra}".rstrip(), file=sys.stderr, flush=True)
