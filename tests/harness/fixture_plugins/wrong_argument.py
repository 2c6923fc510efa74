"""Implements a real hook with an argument name the spec does not have."""

from __future__ import annotations

from typing import Any

from harness import hookimpl


@hookimpl
def brokerchaos_register_brokers(registry: Any) -> None:
    raise AssertionError("never called: the host must refuse this plugin")
