"""Registers both checkers with the brokerchaos host."""

from __future__ import annotations

from typing import Any

import pluggy

from ._python import check_python
from ._spark import check_spark

hookimpl = pluggy.HookimplMarker("brokerchaos")


@hookimpl
def brokerchaos_register_checkers(register: Any) -> None:
    register.add_checker("python", check_python)
    register.add_checker("spark", check_spark)
