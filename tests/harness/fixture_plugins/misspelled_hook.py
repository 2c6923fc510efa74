"""Implements a hook that does not exist (one letter off)."""

from __future__ import annotations

from typing import Any

from harness import hookimpl


@hookimpl
def brokerchaos_register_brokerz(register: Any) -> None:
    raise AssertionError("never called: the host must refuse this plugin")
