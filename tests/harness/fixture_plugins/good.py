"""A well-formed plugin contributing one of each kind, and recording the configuration it sees."""

from __future__ import annotations

from typing import Any

from harness import hookimpl
from harness.spec import Fault

from ._broker import FixtureBroker

__version__ = "9.9"

seen_config: list[dict[str, Any]] = []


class Nap(Fault):
    name = "nap"
    requires = frozenset({"kill"})


def always_valid(run_dir: Any, scenario: Any) -> dict[str, Any]:
    return {"valid": True, "verdict": "durable"}


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    register.add_broker(FixtureBroker())


@hookimpl
def brokerchaos_register_faults(register: Any) -> None:
    register.add_fault(Nap)


@hookimpl
def brokerchaos_register_checkers(register: Any) -> None:
    register.add_checker("always-valid", always_valid)


@hookimpl
def brokerchaos_configure(config: dict[str, Any]) -> None:
    seen_config.append(config)
