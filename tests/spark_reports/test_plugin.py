from __future__ import annotations

import pluggy

import spark_reports
from spark_reports import plugin


class _Registry:
    def __init__(self) -> None:
        self.checkers: dict[str, object] = {}

    def add_checker(self, name: str, fn: object) -> None:
        self.checkers[name] = fn


class _Spec:
    @pluggy.HookspecMarker("brokerchaos")
    def brokerchaos_register_checkers(self, register):  # type: ignore[no-untyped-def]
        """Register checkers."""


def test_registers_both_checkers_through_pluggy() -> None:
    pm = pluggy.PluginManager("brokerchaos")
    pm.add_hookspecs(_Spec)
    pm.register(plugin)
    pm.check_pending()
    reg = _Registry()
    pm.hook.brokerchaos_register_checkers(register=reg)
    assert reg.checkers == {"python": spark_reports.check_python, "spark": spark_reports.check_spark}
