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

import contextlib
import secrets
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import allure
import pytest

from harness.errors import BrokerChaosError
from harness.host import Host
from harness.scenario import Scenario

OPTION_GROUP = "brokerchaos"


# -- options and markers -------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup(OPTION_GROUP, "brokerchaos chaos testing")
    g.addoption("--broker", default=None, metavar="PLUGIN",
                help="run every chaos scenario against this broker plugin (default: the scenario's)")
    g.addoption("--chaos-seed", type=int, default=None, metavar="N",
                help="seed for every chaos run (default: the scenario's); rerun a failure with its seed")
    g.addoption("--chaos-runs", type=int, default=None, metavar="N",
                help="seeded runs per chaos test (seed, seed+1, ...), all must be durable (default 1)")
    g.addoption("--chaos-duration", type=float, default=None, metavar="SECONDS",
                help="workload duration of every chaos run (default: the scenario's)")
    g.addoption("--chaos-store", default=None, metavar="DIR",
                help="run store root (default ./store or $BROKERCHAOS_STORE)")
    g.addoption("--chaos-plugin", action="append", default=[], metavar="MODULE",
                help="load a brokerchaos plugin module by import path (repeatable)")


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


# -- results -------------------------------------------------------------------------------


@dataclass
class ChaosResult:
    """One finished run: its results (``results.json``), run directory and scenario."""

    scenario: Scenario
    results: dict[str, Any]
    run_dir: Path

    @property
    def seed(self) -> int:
        return self.scenario.seed

    @property
    def durable(self) -> bool:
        return self.results.get("valid") is True

    def history(self) -> Iterator[dict[str, Any]]:
        """The recorded operations in order (the schema of ``harness.history``)."""
        from harness.history import read_jsonl

        yield from read_jsonl(self.run_dir / "history.jsonl")

    def loss_table(self) -> str:
        return loss_table(self.scenario, self.results, self.run_dir)

    def assert_durable(self) -> ChaosResult:
        """Raise ``AssertionError`` with the loss table unless every confirmed message came back."""
        if not self.durable:
            raise AssertionError(self.loss_table())
        return self


class ChaosSeries(list[ChaosResult]):
    """Several seeded runs of one scenario (``--chaos-runs``); durable only if each run is."""

    @property
    def results(self) -> list[dict[str, Any]]:
        return [r.results for r in self]

    @property
    def durable(self) -> bool:
        return all(r.durable for r in self)

    def assert_durable(self) -> ChaosSeries:
        bad = [r for r in self if not r.durable]
        if bad:
            head = f"{len(bad)} of {len(self)} seeded runs are not durable"
            raise AssertionError(head + "\n\n" + "\n\n".join(r.loss_table() for r in bad))
        return self


def loss_table(scenario: Scenario, results: Mapping[str, Any], run_dir: Path, limit: int = 20) -> str:
    """The text a failing chaos test shows: verdict, counts, attribution, lost ids, how to rerun."""
    from harness.runner import summary_table

    broker = scenario.broker.plugin
    lines = [
        f"chaos run {scenario.name!r} (broker {broker}, seed {scenario.seed}) is not durable: "
        f"{results.get('verdict', results.get('valid'))}"
        + (f" ({results['reason']})" if results.get("reason") else ""),
        summary_table(dict(results)),
    ]
    attribution = results.get("attribution") or {}
    rows = attribution.get("rows") or []
    if rows:
        lines.append("  loss attribution (fault kind, node that confirmed, lost):")
        lines += [f"    {r['fault_kind']:<16} {str(r['node']):<6} {r['count']}" for r in rows]
    exposure = attribution.get("exposure") or []
    if exposure:
        lines.append("  exposure (fault kind, confirmed while it could hit, lost):")
        lines += [f"    {r['fault_kind']:<16} {r['confirmed']:<8} {r['lost']}" for r in exposure]
    messages = attribution.get("messages") or []
    if messages:
        lines.append(f"  lost messages (first {min(limit, len(messages))} of {results['counts']['lost']}):")
        for m in messages[:limit]:
            lines.append(f"    {m['id']:<16} confirmed by {m['confirm_node']} at {m['confirm_ns'] / 1e9:.3f}s, "
                         f"faults: {', '.join(m['fault_ids']) or 'none'}")
    lines += [
        f"  run directory: {run_dir}",
        f"  rerun: brokerchaos run {scenario.source or '<scenario>'} --seed {scenario.seed}   "
        f"or replay its faults: brokerchaos run {scenario.source or '<scenario>'} --replay {run_dir}",
    ]
    return "\n".join(lines)


# -- scenarios -----------------------------------------------------------------------------


def build_scenario(scenario: str | Path | Mapping[str, Any] | Scenario, *, broker: str | None = None,
                   seed: int | None = None, duration: float | None = None, nodes: int | None = None,
                   settings: Mapping[str, Any] | None = None, workload: Mapping[str, Any] | None = None,
                   nemesis: Mapping[str, Any] | None = None, checkers: list[str] | tuple[str, ...] | None = None,
                   name: str | None = None, lazyfs: bool | None = None, root: Path | None = None) -> Scenario:
    """A scenario from a file, a dict or a ``Scenario``, with overrides held to the file's rules.

    ``workload`` is merged into the scenario's; ``nemesis`` replaces it. Changing the
    broker drops the scenario's broker settings (they belong to the other plugin)
    unless ``settings`` are given.
    """
    from harness import scenario as scenario_mod

    source: str | None
    if isinstance(scenario, Scenario):
        data, source = scenario.to_dict(), scenario.source
    elif isinstance(scenario, Mapping):
        data, source = dict(scenario), None
    else:
        path = Path(scenario)
        if not path.is_absolute() and not path.exists() and root is not None and (root / path).exists():
            path = root / path
        loaded = scenario_mod.load(path)
        data, source = loaded.to_dict(), loaded.source
    data.pop("source", None)
    b = dict(data.get("broker") or {})
    if broker is not None and broker != b.get("plugin"):
        b["plugin"] = broker
        b["settings"] = {}
    if nodes is not None:
        b["nodes"] = nodes
    if settings is not None:
        b["settings"] = {**(b.get("settings") or {}), **settings}
    if lazyfs is not None:
        b["lazyfs"] = lazyfs
    data["broker"] = b
    if workload:
        data["workload"] = {**(data.get("workload") or {}), **workload}
    if nemesis is not None:
        data["nemesis"] = dict(nemesis)
    if checkers is not None:
        data["checkers"] = list(checkers)
    if name is not None:
        data["name"] = name
    sc = scenario_mod.from_dict(data, source=source, default_name=data.get("name") or "scenario")
    return sc.with_overrides(seed=seed, duration=duration)


def execute(host: Host, scenario: Scenario, store: Path, *, checkers: tuple[str, ...] | None = None,
            keep: bool = False, reporter: Any = None) -> ChaosResult:
    """Run one scenario to its results. ``reporter`` (the Allure one) hears of a run that dies."""
    from harness.runner import Run

    run = Run(host, scenario, store, keep=keep, checkers=checkers)
    try:
        results = run.execute()
    except BaseException as exc:
        if reporter is not None:
            reporter.run_aborted(run, exc)
        raise
    assert run.dir is not None
    return ChaosResult(scenario, results, run.dir.path)


@contextlib.contextmanager
def running_cluster(host: Host, scenario: Scenario, *, keep: bool = False,
                    collect_to: Path | None = None) -> Iterator[Any]:
    """A started ``harness.cluster.Cluster`` for a scenario's broker, no workload; always torn down."""
    from harness.cluster import Cluster, build_topology, docker_client
    from harness.images import ImageBuilder

    plugin = host.broker(scenario.broker.plugin)
    settings = plugin.validate_settings(scenario.broker.settings)
    client = docker_client()
    builder = ImageBuilder(client)
    topology = build_topology(plugin, run_id=f"bc-{secrets.token_hex(3)}", nodes=scenario.broker.nodes,
                              settings=settings, broker_image=builder.node_image(plugin.image()),
                              proxy_image=builder.toxiproxy_image(), lazyfs=scenario.broker.lazyfs)
    with Cluster(client, topology, plugin, settings, keep=keep) as cluster:
        try:
            cluster.start()
            yield cluster
        finally:
            if collect_to is not None:
                cluster.collect(collect_to)


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
    return out


@pytest.fixture
def chaos_run(chaos_host: Host, pytestconfig: pytest.Config) -> Any:
    """``chaos_run(scenario, runs=None, checkers=None, **overrides) -> ChaosResult | ChaosSeries``.

    ``scenario`` is a path (relative to the working directory or the rootdir), a dict
    or a ``Scenario``; overrides are ``build_scenario``'s keywords (broker, seed,
    duration, nodes, settings, workload, nemesis, ...).
    """
    root = Path(str(pytestconfig.rootpath))

    def run(scenario: str | Path | Mapping[str, Any] | Scenario, *, runs: int | None = None,
            checkers: list[str] | tuple[str, ...] | None = None, keep: bool = False,
            **overrides: Any) -> ChaosResult | ChaosSeries:
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
            execute(chaos_host, sc.with_overrides(seed=sc.seed + k), store, checkers=chosen, keep=keep,
                    reporter=_reporter(chaos_host))
            for k in range(n)
        )

    return run


@pytest.fixture
def chaos_cluster(chaos_host: Host, pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A running cluster (``harness.cluster.Cluster``) without the workload; always torn down.

    The scenario comes from ``@pytest.mark.chaos(scenario=..., nodes=..., settings=...)``
    or an indirect parameter (a path or dict); by default ``--broker`` (or ``reference``)
    with one node. Reach ``cluster.nodes["n1"].toxiproxy`` and ``cluster.client_endpoints()``.
    """
    marker = request.node.get_closest_marker("chaos")
    kwargs = dict(marker.kwargs) if marker else {}
    base = getattr(request, "param", None) or kwargs.pop("scenario", None)
    if base is None:
        base = {"name": "cluster", "broker": {"plugin": pytestconfig.getoption("--broker") or "reference",
                                               "nodes": 1}}
    overrides = _overrides(pytestconfig, kwargs)
    overrides.pop("duration", None)
    sc = build_scenario(base, root=Path(str(pytestconfig.rootpath)), **overrides)
    with running_cluster(chaos_host, sc) as cluster:
        yield cluster
