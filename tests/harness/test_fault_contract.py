"""The fault contract: what a kind needs is declared, the final heal loops over what registered,
and capabilities are an open set a fault package extends."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from harness import BrokerChaosError, PluginError, hookimpl
from harness import scenario as S
from harness.host import Host
from harness.nemesis import Plan, PlannedFault
from harness.runner import heal_all, host_features
from harness.spec import BrokerPlugin, Fault, FaultContext


class Shared(Fault):
    name = "shared-a"
    calls: ClassVar[list[str]] = []

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        Shared.calls.append(cls.name)
        return {"healed": True}


class SharedB(Shared):
    name = "shared-b"


class Own(Fault):
    name = "own"
    requires = frozenset({"kill"})
    needs = frozenset({"lazyfs"})

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        Shared.calls.append(cls.name)
        return None


def test_heal_all_runs_each_mechanism_once_and_only_for_kinds_the_broker_can_suffer() -> None:
    Shared.calls.clear()
    faults: dict[str, type[Fault]] = {"shared-a": Shared, "shared-b": SharedB, "own": Own}
    out = heal_all(faults, FaultContext(cluster=None), frozenset())
    assert Shared.calls == ["shared-a"] and out == {"shared-a": {"healed": True}}
    Shared.calls.clear()
    out = heal_all(faults, FaultContext(cluster=None), frozenset({"kill"}))
    assert Shared.calls == ["own", "shared-a"] and out == {"shared-a": {"healed": True}}


def test_host_features_come_from_what_the_planned_kinds_need() -> None:
    sc = S.from_dict({"broker": {"plugin": "reference"}})
    faults: dict[str, type[Fault]] = {"own": Own, "shared-a": Shared}
    assert host_features(sc, Plan([PlannedFault("f1", 1.0, 1.0, "shared-a", {})]), faults) == frozenset()
    assert host_features(sc, Plan([PlannedFault("f1", 1.0, 1.0, "own", {})]), faults) == {"lazyfs"}

    class Odd(Fault):
        name = "odd"
        needs = frozenset({"quantum-disk"})

    with pytest.raises(BrokerChaosError, match=r"host features \['quantum-disk'\]"):
        host_features(sc, Plan([PlannedFault("f1", 1.0, 1.0, "odd", {})]), {"odd": Odd})


class _Broker(BrokerPlugin):
    name = "capable"
    client_port = 5672
    data_dir = "/data"
    capabilities = frozenset({"kill", "teleport"})


class TeleportPackage:
    @hookimpl
    def brokerchaos_register_faults(self, register: Any) -> None:
        register.add_capability("teleport", "the broker runs under a fake clock the harness can set")


class BrokerPackage:
    @hookimpl
    def brokerchaos_register_brokers(self, register: Any) -> None:
        register.add_broker(_Broker())


def test_a_capability_a_fault_package_defines_can_be_declared() -> None:
    host = Host()
    host.register(TeleportPackage(), "teleport-faults")
    host.register(BrokerPackage(), "capable-broker")
    assert "teleport" in host.registry.capabilities and host.broker("capable").capabilities == {
        "kill",
        "teleport",
    }


def test_a_capability_nobody_defined_is_refused_naming_the_plugin() -> None:
    host = Host()
    with pytest.raises(PluginError, match=r"capable-broker.*unknown capabilities \['teleport'\]"):
        host.register(BrokerPackage(), "capable-broker")


def test_add_fault_refuses_what_is_not_a_fault() -> None:
    class NotAFault:
        name = "x"

    class Bad:
        @hookimpl
        def brokerchaos_register_faults(self, register: Any) -> None:
            register.add_fault(NotAFault)

    with pytest.raises(PluginError, match="subclass of harness.spec.Fault"):
        Host().register(Bad(), "bad")
