"""A registration hook that throws."""

from __future__ import annotations

from typing import Any

from harness import hookimpl


@hookimpl
def brokerchaos_register_checkers(register: Any) -> None:
    raise RuntimeError("checker table is corrupt")
