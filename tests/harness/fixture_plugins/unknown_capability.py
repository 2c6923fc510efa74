"""Declares a capability no fault knows."""

from __future__ import annotations

from typing import Any

from harness import hookimpl

from ._broker import FixtureBroker


class Teleporting(FixtureBroker):
    name = "teleporting"
    capabilities = frozenset({"kill", "teleport"})


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    register.add_broker(Teleporting())
