"""brokerchaos as a pytest plugin (entry point ``pytest11``): a chaos test in a few lines.

    import pytest

    @pytest.mark.chaos
    @pytest.mark.docker
    def test_crash_keeps_confirmed_messages(chaos_run):
        chaos_run("scenarios/crash.yaml", duration=10).assert_durable()

A durability failure is an ``AssertionError`` whose message is the loss table
(attribution rows included), so the test fails with what a reviewer needs; a
harness error (bad scenario, Docker unreachable) is a ``BrokerChaosError`` and
is reported in one line. With ``--alluredir`` every run also becomes Allure
labels, steps and attachments (``harness.allure_report``).

Precedence of settings: keyword arguments in the test, then command-line
options (``--broker``, ``--chaos-seed``, ``--chaos-duration``, ``--chaos-runs``,
``--chaos-store``), then the scenario file.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import allure
import pytest

from harness.errors import BrokerChaosError
from harness.host import Host
from harness.outcome import ChaosResult, ChaosSeries
from harness.runner import execute, running_cluster
from harness.scenario import Scenario, with_overrides
from harness.scenario import build as build_scenario

OPTION_GROUP = "brokerchaos"


# -- options and markers -------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup(OPTION_GROUP, "brokerchaos chaos testing")
    g.addoption(
        "--broker",
        default=None,
        metavar="PLUGIN[@VERSION]",
        help="run every chaos scenario against this broker plugin, at VERSION if given "
        "(rabbitmq@4.3; default: the scenario's)",
    )
    g.addoption(
        "--chaos-seed",
        type=int,
        default=None,
        metavar="N",
        help="seed for every chaos run (default: the scenario's); rerun a failure with its seed",
    )
    g.addoption(
        "--chaos-runs",
        type=int,
        default=None,
        metavar="N",
        help="seeded runs per chaos test (seed, seed+1, ...), all must be durable (default 1)",
    )
    g.addoption(
        "--chaos-duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="workload duration of every chaos run (default: the scenario's)",
    )
    g.addoption(
        "--chaos-store",
        default=None,
        metavar="DIR",
        help="run store root (default ./store or $BROKERCHAOS_STORE)",
    )
    g.addoption(
        "--chaos-plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="load a brokerchaos plugin module by import path (repeatable)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: a chaos scenario run end to end (brokerchaos)")
    config.addinivalue_line("markers", "docker: needs a Docker engine and the project's images")
    runs = config.getoption("--chaos-runs")
    if runs is not None and runs < 1:
        raise pytest.UsageError("--chaos-runs must be at least 1")
    duration = config.getoption("--chaos-duration")
    if duration is not None and duration <= 0:
        raise pytest.UsageError("--chaos-duration must be a positive number of seconds")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """A harness error is the user's to fix, not a bug in the test: one line, no traceback."""
    report: Any = yield
    if call.excinfo is not None and isinstance(call.excinfo.value, BrokerChaosError):
        report.longrepr = f"brokerchaos: {call.excinfo.value}"
    return report


# -- scenarios -----------------------------------------------------------------------------


# -- fixtures ------------------------------------------------------------------------------


def _store(config: pytest.Config) -> Path:
    from harness.store import default_root

    opt = config.getoption("--chaos-store")
    return Path(opt) if opt else default_root()


@pytest.fixture(scope="session")
def chaos_host(pytestconfig: pytest.Config) -> Host:
    """The loaded plugins (entry points plus ``--chaos-plugin``); with ``--alluredir``, the Allure reporter too."""
    host = Host.load(pytestconfig.getoption("--chaos-plugin"))
    if pytestconfig.getoption("allure_report_dir", default=None):
        from harness.allure_report import AllureReporter

        host.register(AllureReporter(), "allure")
    return host


def _reporter(host: Host) -> Any:
    return host.pm.get_plugin("allure")


def _overrides(config: pytest.Config, overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(overrides)
    for key, opt in (("broker", "--broker"), ("seed", "--chaos-seed"), ("duration", "--chaos-duration")):
        if out.get(key) is None and config.getoption(opt) is not None:
            out[key] = config.getoption(opt)
    if isinstance(out.get("broker"), str) and "@" in out["broker"] and out.get("version") is None:
        out["broker"], out["version"] = out["broker"].split("@", 1)
    return out


@pytest.fixture
def chaos_run(chaos_host: Host, pytestconfig: pytest.Config) -> Any:
    """``chaos_run(scenario, runs=None, checkers=None, **overrides) -> ChaosResult | ChaosSeries``.

    ``scenario`` is a path (relative to the working directory or the rootdir), a dict
    or a ``Scenario``; overrides are ``build_scenario``'s keywords (broker, seed,
    duration, nodes, settings, workload, nemesis, ...).
    """
    root = Path(str(pytestconfig.rootpath))

    def run(
        scenario: str | Path | Mapping[str, Any] | Scenario,
        *,
        runs: int | None = None,
        checkers: list[str] | tuple[str, ...] | None = None,
        keep: bool = False,
        **overrides: Any,
    ) -> ChaosResult | ChaosSeries:
        with allure.step(f"load scenario {scenario if isinstance(scenario, str | Path) else '(inline)'}"):
            sc = build_scenario(scenario, root=root, **_overrides(pytestconfig, overrides))
        n = runs if runs is not None else (pytestconfig.getoption("--chaos-runs") or 1)
        if n < 1:
            raise BrokerChaosError("runs must be at least 1")
        store = _store(pytestconfig)
        chosen = tuple(checkers) if checkers else None
        if n == 1:
            return execute(chaos_host, sc, store, checkers=chosen, keep=keep, reporter=_reporter(chaos_host))
        return ChaosSeries(
            execute(
                chaos_host,
                with_overrides(sc, seed=sc.seed + k),
                store,
                checkers=chosen,
                keep=keep,
                reporter=_reporter(chaos_host),
            )
            for k in range(n)
        )

    return run


@pytest.fixture
def chaos_cluster(
    chaos_host: Host, pytestconfig: pytest.Config, request: pytest.FixtureRequest
) -> Iterator[Any]:
    """A running cluster (``harness.cluster.Cluster``) without the workload; always torn down.

    The scenario comes from ``@pytest.mark.chaos(scenario=..., nodes=..., settings=...)``
    or an indirect parameter (a path or dict); by default ``--broker`` (or ``reference``)
    with one node. Reach ``cluster.nodes["n1"].toxiproxy`` and ``cluster.client_endpoints()``.
    """
    marker = request.node.get_closest_marker("chaos")
    kwargs = dict(marker.kwargs) if marker else {}
    base = getattr(request, "param", None) or kwargs.pop("scenario", None)
    if base is None:
        base = {
            "name": "cluster",
            "broker": {"plugin": pytestconfig.getoption("--broker") or "reference", "nodes": 1},
        }
    overrides = _overrides(pytestconfig, kwargs)
    overrides.pop("duration", None)
    sc = build_scenario(base, root=Path(str(pytestconfig.rootpath)), **overrides)
    with running_cluster(chaos_host, sc) as cluster:
        yield cluster
