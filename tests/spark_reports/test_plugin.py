from __future__ import annotations

from pathlib import Path

import spark_reports
from harness.host import Host
from spark_reports import plugin


def test_registers_both_checkers_through_the_hooks() -> None:
    host = Host()
    host.register(plugin, "checkers")
    assert {"python", "spark"} <= set(host.registry.checkers)
    assert host.registry.checkers["python"] is spark_reports.check_python
    assert host.registry.default_checkers() == ("spark",), "Spark is the engine of record"


def test_the_spark_master_comes_from_the_configure_hook(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seen = []

    def check_spark(run_dir: Path, scenario: object, spark_master: str | None = None) -> dict[str, bool]:
        seen.append(spark_master)
        return {"valid": True}

    monkeypatch.setattr(plugin, "check_spark", check_spark)
    monkeypatch.setattr(plugin, "settings", {})
    host = Host()
    host.register(plugin, "checkers")
    host.configure({"spark_master": "spark://127.0.0.1:7077", "store": Path("/tmp")})
    host.registry.checkers["spark"](Path("/nowhere"), {})
    assert seen == ["spark://127.0.0.1:7077"]


def test_the_reports_plotting_library_is_imported_once_the_workload_is_done(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Not during the workload (its CPU would be the brokers'), but beside the check."""
    import sys

    from spark_reports import plugin

    monkeypatch.setattr(plugin, "_plotting", None)
    for phase, status in (("cluster", "done"), ("workload", "start")):
        plugin.brokerchaos_phase(None, phase, status, {})
        assert plugin._plotting is None
    plugin.brokerchaos_phase(None, "workload", "done", {})
    thread = plugin._plotting
    assert thread is not None
    thread.join()
    assert "matplotlib.pyplot" in sys.modules
