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
