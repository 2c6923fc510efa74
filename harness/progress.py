"""Progress lines for long work. One line per event on stderr, prefixed by the phase,
so a CI log reads as a timeline and a terminal user sees the run moving."""

from __future__ import annotations

import sys
import time

_t0 = time.monotonic()
quiet = False


def say(phase: str, message: str) -> None:
    if quiet:
        return
    elapsed = time.monotonic() - _t0
    print(f"[{elapsed:7.1f}s] {phase:<9} {message}", file=sys.stderr, flush=True)
