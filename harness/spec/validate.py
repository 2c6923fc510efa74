"""The field checks a file the user writes is held to (the scenario, the matrix, a plugin's settings).

Each takes the value and its path in the file (``workload.rate``) and either returns the value,
typed, or raises ``ScenarioError`` naming the field and what is allowed: one line, and nothing
that reads a file has to word its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.spec.errors import ScenarioError

__all__ = [
    "boolean",
    "bounds",
    "integer",
    "is_int",
    "mapping",
    "nonempty_str",
    "number",
    "only",
    "seconds_range",
]


def is_int(v: Any) -> bool:
    """An integer and not a bool (``True`` is an ``int`` to Python, never to a file's reader)."""
    return isinstance(v, int) and not isinstance(v, bool)


def mapping(v: Any, where: str, *, required: bool = False) -> Mapping[str, Any]:
    if v is None:
        if required:
            raise ScenarioError(f"{where}: required section is missing")
        return {}
    if not isinstance(v, Mapping):
        raise ScenarioError(f"{where}: expected a mapping, got {type(v).__name__}")
    return v


def only(m: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    for key in m:
        if key not in allowed:
            prefix = f"{where}." if where else ""
            raise ScenarioError(f"{prefix}{key}: unknown field; allowed: {', '.join(sorted(allowed))}")


def nonempty_str(v: Any, where: str, *, required: bool = False) -> str:
    if v is None and required:
        raise ScenarioError(f"{where}: required")
    if not isinstance(v, str) or not v:
        raise ScenarioError(f"{where}: expected a non-empty string, got {v!r}")
    return v


def boolean(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise ScenarioError(f"{where}: expected true or false, got {v!r}")
    return v


def integer(v: Any, where: str, *, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ScenarioError(f"{where}: expected an integer{bounds(lo, hi)}, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ScenarioError(f"{where}: {v} is out of range; allowed{bounds(lo, hi)}")
    return v


def number(v: Any, where: str, *, lo: float | None = None, required: bool = False) -> float:
    if v is None and required:
        raise ScenarioError(f"{where}: required (a number of seconds)")
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ScenarioError(f"{where}: expected a number{bounds(lo, None)}, got {v!r}")
    if lo is not None and v < lo:
        raise ScenarioError(f"{where}: {v} is out of range; allowed{bounds(lo, None)}")
    return float(v)


def seconds_range(v: Any, where: str, *, positive: bool = False) -> tuple[float, float]:
    """``[min, max]`` seconds, or one number for both. ``positive``: the gap between random
    faults, where 0 would let the schedule draw steps forever without time advancing."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        v = [v, v]
    if not isinstance(v, Sequence) or isinstance(v, str) or len(v) != 2:
        raise ScenarioError(f"{where}: expected [min, max] seconds, got {v!r}")
    lo, hi = (number(x, where, lo=0) for x in v)
    if positive and lo <= 0:
        raise ScenarioError(f"{where}: min {lo} is out of range; allowed > 0")
    if lo > hi:
        raise ScenarioError(f"{where}: min {lo} is greater than max {hi}")
    return (lo, hi)


def bounds(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f" from {lo} to {hi}"
    if lo is not None:
        return f" >= {lo}"
    if hi is not None:
        return f" <= {hi}"
    return ""
