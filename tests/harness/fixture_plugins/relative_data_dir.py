"""Declares a data directory relative to nothing in particular."""

from __future__ import annotations

from typing import Any

from harness import hookimpl

from ._broker import FixtureBroker


class Relative(FixtureBroker):
    name = "relative"
    data_dir = "var/lib/relative"


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    register.add_broker(Relative())
