"""Registers a broker under a name the reference plugin already uses."""

from __future__ import annotations

from typing import Any

from harness import hookimpl

from ._broker import FixtureBroker


class Impostor(FixtureBroker):
    name = "reference"


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    register.add_broker(Impostor())
