from __future__ import annotations

from pathlib import Path

import spark_reports
from harness.host import Host
from spark_reports.engines import plugin as engines
from spark_reports.reports import plugin as reports
from spark_reports.service import plugin as service
from spark_reports.service import session


def test_registers_both_checkers_through_the_hooks() -> None:
    host = Host()
    host.register(engines, "checkers")
    assert {"python", "spark"} <= set(host.registry.checkers)
    assert host.registry.checkers["python"] is spark_reports.check_python
    assert host.registry.default_checkers() == ("spark",), "Spark is the engine of record"


def test_the_three_parts_load_through_the_entry_points_like_any_plugin() -> None:
    """pytest's way: the engines, the reports and the Spark service are each a plugin, loaded through
    the same door as an outside one."""
    host = Host.load()
    sources = {p.name: p.source for p in host.loaded}
    assert sources["checkers"] == "entry point spark_reports.engines.plugin"
    assert sources["reports"] == "entry point spark_reports.reports.plugin"
    assert sources["spark-service"] == "entry point spark_reports.service.plugin"


def test_the_spark_master_comes_from_the_configure_hook(monkeypatch) -> None:
    seen = []

    def check_spark(run_dir: Path, scenario: object, spark_master: str | None = None) -> dict[str, bool]:
        seen.append(spark_master)
        return {"valid": True}

    monkeypatch.setattr(engines, "check_spark", check_spark)
    monkeypatch.setattr(session, "settings", {})
    monkeypatch.setattr(service, "settings", session.settings)
    host = Host()
    host.register(service, "spark-service")
    host.register(engines, "checkers")
    host.configure({"spark_master": "spark://127.0.0.1:7077", "store": Path("/tmp")})
    host.registry.checkers["spark"](Path("/nowhere"), {})
    assert seen == ["spark://127.0.0.1:7077"]


def test_the_reports_plotting_library_is_imported_once_the_workload_is_done(monkeypatch) -> None:
    """Not during the workload (its CPU would be the brokers'), but beside the check."""
    import sys

    monkeypatch.setattr(reports, "_plotting", None)
    for phase, status in (("cluster", "done"), ("workload", "start")):
        reports.brokerchaos_phase(None, phase, status, {})
        assert reports._plotting is None
    reports.brokerchaos_phase(None, "workload", "done", {})
    thread = reports._plotting
    assert thread is not None
    thread.join()
    assert "matplotlib.pyplot" in sys.modules
