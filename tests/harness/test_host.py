"""The plugin host: entry points, ``-p`` modules, and every way a plugin can be refused."""

from __future__ import annotations

import pytest

from harness.errors import BrokerChaosError, PluginError
from harness.host import Host

SHIPPED = {"reference", "rabbitmq", "faults", "checkers", "amqp091"}


def test_entry_point_plugins_are_registered(host: Host) -> None:
    assert SHIPPED <= {p.name for p in host.loaded}
    assert {"reference", "rabbitmq"} <= set(host.registry.brokers)
    assert {"partition", "kill", "pause", "stop", "power-loss", "degrade", "rolling-restart"} <= set(
        host.registry.faults
    )
    assert "python" in host.registry.checkers
    assert "amqp091" in host.registry.clients
    for lp in host.loaded:
        if lp.name in SHIPPED:
            assert lp.source.startswith("entry point "), lp


def test_contributions_are_attributed_to_their_plugin(host: Host) -> None:
    origin = host.registry.origin
    assert origin[("broker", "reference")] == "reference"
    assert origin[("broker", "rabbitmq")] == "rabbitmq"
    assert origin[("fault", "partition")] == "faults"
    assert origin[("client", "amqp091")] == "amqp091"
    assert origin[("checker", "python")] == "checkers"


def test_p_module_loads_alongside_entry_points(fixture_plugins: str) -> None:
    h = Host.load([f"{fixture_plugins}.good"])
    assert h.broker("fixture").client_port == 5999
    assert h.fault("nap").requires == {"kill"}
    assert h.checker("always-valid")(None, None)["valid"] is True
    row = next(r for r in h.describe() if r["plugin"] == f"{fixture_plugins}.good")
    assert row["source"] == f"-p {fixture_plugins}.good"
    assert row["version"] == "9.9"


@pytest.mark.parametrize(
    ("module", "needles"),
    [
        (
            "broken_import",
            ["failed to import", "ModuleNotFoundError", "brokerchaos_fixture_missing_dependency"],
        ),
        ("misspelled_hook", ["brokerchaos_register_brokerz", "spec/hooks.py"]),
        ("wrong_argument", ["registry"]),
        ("unknown_capability", ["teleport", "known: clock, kill"]),
        ("relative_data_dir", ["data_dir must be an absolute path"]),
        ("raising_hook", ["brokerchaos_register_checkers raised RuntimeError: checker table is corrupt"]),
    ],
)
def test_refused_plugin_is_named_with_the_reason(
    fixture_plugins: str, module: str, needles: list[str]
) -> None:
    with pytest.raises(PluginError) as e:
        Host.load([f"{fixture_plugins}.{module}"], entry_points=False)
    assert e.value.plugin == f"{fixture_plugins}.{module}"
    for needle in needles:
        assert needle in e.value.reason
    assert str(e.value).startswith(f"plugin '{fixture_plugins}.{module}': ")


def test_p_module_that_does_not_exist() -> None:
    with pytest.raises(PluginError) as e:
        Host.load(["does.not.exist"], entry_points=False)
    assert e.value.plugin == "does.not.exist"
    assert "No module named 'does'" in str(e.value)


def test_duplicate_broker_name_names_both_plugins(fixture_plugins: str) -> None:
    with pytest.raises(PluginError) as e:
        Host.load(["plugins.reference", f"{fixture_plugins}.duplicate_broker"], entry_points=False)
    assert e.value.plugin == f"{fixture_plugins}.duplicate_broker"
    assert "'plugins.reference'" in e.value.reason
    assert "broker 'reference'" in e.value.reason


def test_duplicate_against_entry_points_too(fixture_plugins: str) -> None:
    with pytest.raises(PluginError) as e:
        Host.load([f"{fixture_plugins}.duplicate_broker"])
    assert e.value.plugin == f"{fixture_plugins}.duplicate_broker"
    assert "already provided by plugin 'reference'" in e.value.reason


def test_the_same_module_twice_registers_once(fixture_plugins: str) -> None:
    h = Host.load(["plugins.reference", "plugins.reference"], entry_points=False)
    assert [p.name for p in h.loaded] == ["plugins.reference"]
    # And reached both through its entry point and through -p, it is still one plugin.
    h = Host.load(["plugins.reference"])
    assert sum(1 for p in h.loaded if p.name in ("reference", "plugins.reference")) == 1


def test_register_after_load(fixture_plugins: str) -> None:
    import importlib

    h = Host.load(entry_points=False)
    assert h.registry.brokers == {}
    h.register(importlib.import_module(f"{fixture_plugins}.good"), "late")
    assert h.registry.origin[("broker", "fixture")] == "late"
    with pytest.raises(PluginError) as e:
        h.register(importlib.import_module(f"{fixture_plugins}.misspelled_hook"), "late-typo")
    assert e.value.plugin == "late-typo"


def test_configure_is_historic(fixture_plugins: str) -> None:
    import importlib

    good = importlib.import_module(f"{fixture_plugins}.good")
    good.seen_config.clear()
    h = Host.load(entry_points=False)
    h.configure({"store": "/tmp/store"})
    h.register(good, "after-configure")
    assert good.seen_config == [{"store": "/tmp/store"}]


def test_typed_lookups_fail_with_one_line_listing_what_exists(host: Host) -> None:
    for lookup, name, needle in (
        (host.broker, "kafka", "reference"),
        (host.fault, "meteor", "partition"),
        (host.checker, "vibes", "python"),
        (host.client, "mqtt", "mqtt"),
    ):
        with pytest.raises(BrokerChaosError) as e:
            lookup(name)
        assert name in str(e.value) and needle in str(e.value)
        assert "\n" not in str(e.value)


def test_the_checkers_a_run_uses_are_asked_then_named_then_the_defaults(fixture_plugins: str) -> None:
    h = Host.load([f"{fixture_plugins}.good"])
    defaults = h.registry.default_checkers()
    assert "always-valid" not in defaults, "the fixture registers it without default=True"
    assert h.checkers_for(["always-valid"], ["python"]) == ("always-valid",)
    assert h.checkers_for(None, ["always-valid"]) == ("always-valid",)
    assert h.checkers_for([], ()) == defaults
    with pytest.raises(BrokerChaosError, match="unknown checker 'vibes'"):
        h.checkers_for(None, ["vibes"])


def test_describe_rows(host: Host) -> None:
    rows = {r["plugin"]: r for r in host.describe()}
    assert SHIPPED <= set(rows)
    assert rows["reference"]["provides"] == ["broker:reference"]
    assert rows["reference"]["capabilities"] == sorted(host.broker("reference").capabilities)
    assert rows["rabbitmq"]["capabilities"] == [
        "clock",
        "kill",
        "membership",
        "mirroring",
        "partition",
        "pause",
        "power-loss",
        "stop",
    ]
    assert "fault:partition" in rows["faults"]["provides"]
    assert rows["faults"]["capabilities"] == []
    assert rows["amqp091"]["provides"] == ["client:amqp091"]
    for r in rows.values():
        assert set(r) == {"plugin", "version", "source", "provides", "capabilities"}
        assert r["version"] != "unknown", r
