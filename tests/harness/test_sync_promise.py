"""A run's sync promise (``harness.runner.sync_promise``) is asked of the broker plugin at the
version the scenario names: a NATS 2.15 scenario with ``sync_interval: always`` promises a sync
before each confirm, where the default version (2.9, which has no such setting) refuses it."""

from __future__ import annotations

from harness.host import Host
from harness.runner import sync_promise


def nats(settings: dict[str, object], version: str | None) -> dict[str, object]:
    broker: dict[str, object] = {"plugin": "nats", "settings": settings}
    if version is not None:
        broker["version"] = version
    return {"broker": broker}


def test_a_version_s_setting_is_judged_at_that_version(host: Host) -> None:
    assert sync_promise(host, nats({"sync_interval": "always"}, "2.15")) is True
    assert sync_promise(host, nats({}, "2.15")) is False
    assert sync_promise(host, nats({}, None)) is False


def test_an_unloaded_plugin_promises_nothing(host: Host) -> None:
    assert sync_promise(host, {"broker": {"plugin": "no-such-broker"}}) is None
