"""One chaos run, phase by phase: images, cluster, workload + nemesis, drain, check, report.

Teardown happens on every exit path (normal, exception, Ctrl-C, SIGTERM), and
the history is closed first so every open operation is completed as ``info``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.cluster import (
    Cluster,
    build_topology,
    docker_client,
    fault_nodes,
    filesystem_model,
    node_roles,
    role_recipes,
)
from harness.coverage import annotate, check_workload_features
from harness.errors import BrokerChaosError, NodesDown, PortInUse
from harness.evidence import missing, read_fault_evidence
from harness.history import Recorder, to_parquet
from harness.host import Host
from harness.images import ImageBuilder, broker_image
from harness.liveness import scrape_logs
from harness.nemesis import Nemesis, Plan, check_capabilities, check_file_roles, plan
from harness.outcome import ChaosResult
from harness.progress import say
from harness.scenario import Scenario
from harness.spec.broker import ImageRecipe
from harness.spec.client import workload_check
from harness.spec.fault import HOST_FEATURES, Fault, FaultContext
from harness.spec.rundir import DISJOINT_NODES, RESULTS_JSON, SCENARIO_JSON
from harness.store import RunDir
from harness.verdicts import combine, judge_unsynced
from harness.workload import (
    assignments,
    depth_timeout,
    driver_options,
    node_holdings_reader,
    queue_depth_reader,
    queue_holders_reader,
    queue_replicas_reader,
    run_workload,
)

EXIT_ERROR = 2
"""A harness or usage error before any verdict; a checked run exits with ``exit_code`` (0, 1 or 3)."""


class Run:
    """A run in progress; hooks receive it (``run.scenario``, ``run.dir``, ``run.id``)."""

    def __init__(
        self,
        host: Host,
        scenario: Scenario,
        store_root: Path,
        *,
        replay: Plan | None = None,
        keep: bool = False,
        checkers: tuple[str, ...] | None = None,
        build_images: bool = True,
        client_port_base: int | None = None,
    ) -> None:
        self.host = host
        self.scenario = scenario
        self.plugin = host.broker(scenario.broker.plugin, scenario.broker.version)
        self.settings = self.plugin.validate_settings(scenario.broker.settings)
        self.faults = host.registry.faults
        check_capabilities(scenario, self.faults, frozenset(self.plugin.capabilities), self.plugin.name)
        check_file_roles(scenario, self.plugin)
        check_workload_features(scenario.workload, self.plugin)
        # A missing client is the workload phase's error (one line there); here only what it refuses.
        workload_check(host.registry.clients.get(self.plugin.protocol), scenario.workload)
        roles = node_roles(self.plugin, scenario.broker.nodes, self.settings)
        #: Every node, each with its role (what faults aim at); the workload uses ``client_nodes``.
        self.nodes = fault_nodes(roles)
        self.client_nodes = [n for n, r in roles.items() if r.clients]
        self.role_recipes = role_recipes(self.plugin, scenario.broker.nodes, self.settings)
        self.plan = replay if replay is not None else plan(scenario, self.faults, self.nodes)
        if replay is not None:
            _check_replay(replay, self.faults, frozenset(self.plugin.capabilities), list(self.nodes))
        self.features = host_features(scenario, self.plan, self.faults)
        for feature in sorted(self.features):
            cap = HOST_FEATURES[feature].capability
            if cap is not None and cap not in self.plugin.capabilities:
                raise BrokerChaosError(
                    f"broker plugin {self.plugin.name!r} does not declare {cap!r}, which "
                    f"{feature} needs: {HOST_FEATURES[feature].description}"
                )
        self.lazyfs = "lazyfs" in self.features
        #: The lazy filesystem's model (None: no lazy filesystem), recorded in scenario.json and results.json.
        self.filesystem = filesystem_model(self.plugin, scenario.broker.filesystem, self.lazyfs)
        self.faketime = "faketime" in self.features
        self.checkers = host.checkers_for(checkers, scenario.checkers)
        self.id = f"bc-{secrets.token_hex(3)}"
        self.store_root = store_root
        self.keep = keep
        self.build_images = build_images
        self.client_ports = (
            {n: client_port_base + i for i, n in enumerate(self.nodes)} if client_port_base else None
        )
        self.dir: RunDir | None = None
        self.timings: dict[str, float] = {}
        self.drained_at: float | None = None  # monotonic time the workload's final drain returned
        #: The exact version the running broker reported (``BrokerPlugin.broker_version``).
        self.running_version: str | None = None

    # -- the run ---------------------------------------------------------------------------

    def execute(self) -> dict[str, Any]:
        client = docker_client()  # before anything is written: no empty run when Docker is down
        if self.client_ports:
            check_ports_free(self.client_ports)
        self.dir = RunDir.create(self.store_root, self.scenario.name)
        say(
            "run",
            f"{self.scenario.name} seed={self.scenario.seed} broker={self.plugin.name} "
            f"nodes={len(self.nodes)} -> {self.dir.path}",
        )
        self.dir.write_json(SCENARIO_JSON, self._stored_scenario())
        self.host.run_started(self)
        log_handler = _log_to(self.dir.path / "harness.log")
        recorder = Recorder(self.dir.history_jsonl, parquet=self.dir.history_parquet)
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        workload: dict[str, Any] = {}
        checking: _Background | None = None
        try:
            images = self._phase("images", lambda: self._images(client))
            topology = build_topology(
                self.plugin,
                run_id=self.id,
                # The scenario's count, which ``roles`` reads: the total (``self.nodes``) would
                # give a role of ``nodes=None`` every node of the other roles as well.
                nodes=self.scenario.broker.nodes,
                settings=self.settings,
                broker_image=images["broker"],
                proxy_image=images["toxiproxy"],
                lazyfs=self.lazyfs,
                faketime=self.faketime,
                filesystem=self.filesystem,
                host_ports=self.client_ports,
                role_images={name: images[f"role:{name}"] for name in self.role_recipes},
            )
            with Cluster(client, topology, self.plugin, self.settings, keep=self.keep) as cluster:
                drained = False
                try:
                    self._phase("cluster", lambda: self._start(cluster))
                    workload = self._phase("workload", lambda: self._workload(cluster, recorder))
                    drained = True
                finally:
                    recorder.close()
                    if drained:
                        # The history is complete and the checkers need no Docker: check while the
                        # cluster's logs are collected and its containers removed.
                        checking = _Background(self._check_aside)
                    self._phase("teardown", lambda: cluster.collect(self.dir.path))
        finally:
            signal.signal(signal.SIGTERM, previous)
            recorder.close()
            logging.getLogger().removeHandler(log_handler)
            log_handler.close()
        assert checking is not None  # the workload returned: the check was started beside the teardown
        results = self._checked(checking)
        scrape_logs(self.dir.path, results)
        annotate_coverage(self.plugin, self.dir.path, results)
        results["workload"] = workload
        results["broker"] = self.broker_block()
        results["filesystem"] = self.filesystem
        results["timings"] = self.timings
        self.dir.write_json(RESULTS_JSON, results)
        self._phase("report", lambda: self.report(results))
        self.host.run_finished(self, results)
        return results

    def _stored_scenario(self) -> dict[str, Any]:
        """``scenario.json``: everything needed to run this again, the seed and the plan included."""
        return {
            "scenario": self.scenario.to_dict(),
            "seed": self.scenario.seed,
            "run_id": self.id,
            "broker": {
                "plugin": self.plugin.name,
                "version": self.plugin.version,
                "broker_version": self.plugin.release.name if self.plugin.release else None,
                "settings": self.settings,
                "capabilities": sorted(self.plugin.capabilities),
                DISJOINT_NODES: self.plugin.disjoint_nodes(self.settings),
            },
            "plan": self.plan.to_list(),
            "lazyfs": self.lazyfs,
            "filesystem": self.filesystem,
            "faketime": self.faketime,
            "plugins": self.host.describe(),
        }

    def _phase(self, name: str, fn: Any) -> Any:
        self.host.phase(self, name, "start")
        t = time.monotonic()
        try:
            out = fn()
        except BaseException as exc:
            self.timings[name] = round(time.monotonic() - t, 3)
            self.host.phase(self, name, "failed", error=str(exc) or type(exc).__name__)
            raise
        self.timings[name] = round(time.monotonic() - t, 3)
        self.host.phase(self, name, "done", seconds=self.timings[name])
        return out

    def _start(self, cluster: Cluster) -> None:
        cluster.start()
        # What the running broker reports, not what the scenario asked for.
        self.running_version = self.plugin.broker_version(next(iter(cluster.nodes.values())))

    def broker_block(self) -> dict[str, Any]:
        """The broker a run tested: plugin, the version the scenario chose and the one running."""
        rel = self.plugin.release
        return {
            "plugin": self.plugin.name,
            "version": rel.name if rel else None,
            "suite": rel.suite if rel else None,
            "running": self.running_version,
        }

    def _images(self, client: Any) -> dict[str, str]:
        if not self.build_images:
            raise BrokerChaosError("images are not built: run `brokerchaos images build` first")
        return build_images(client, self.plugin, faketime=self.faketime, roles=self.role_recipes)

    def _workload(self, cluster: Cluster, recorder: Recorder) -> dict[str, Any]:
        w = self.scenario.workload
        endpoints = cluster.endpoints()
        first = {
            proc: node for proc, (_q, node) in assignments(w, self.client_nodes, self.scenario.seed).items()
        }
        factory = self.host.client(self.plugin.protocol)
        depth = queue_depth_reader(self.plugin, cluster.nodes, depth_timeout(w.drain_timeout, len(endpoints)))
        holders = queue_holders_reader(self.plugin, cluster.nodes)
        replicas = queue_replicas_reader(self.plugin, cluster.nodes)
        driver = factory(
            endpoints,
            recorder,
            **driver_options(
                w,
                self.plugin,
                self.settings,
                seed=self.scenario.seed,
                first_node=first,
                queue_depth=depth,
                queue_holders=holders,
                queue_replicas=replicas,
            ),
        )

        ctx = FaultContext(cluster)
        nemesis = Nemesis(
            self.plan,
            self.faults,
            ctx,
            recorder,
            settle=self.scenario.nemesis.settle if self.plan.steps else 0.0,
            final_heal=lambda: heal_all(self.faults, ctx, frozenset(self.plugin.capabilities)),
            on_fault=lambda op: self.host.fault_done(self, op),
            serving=self.client_nodes,
            nodes=self.nodes,
        )
        start = time.monotonic()

        def tick(c: dict[str, int]) -> None:
            t = time.monotonic() - start
            if int(t) % 5 == 0:
                say(
                    "workload",
                    f"t={t:5.0f}s published {c['published']} ok / {c['failed']} nacked / "
                    f"{c['unknown']} unknown, consumed {c['consumed']}",
                )

        say(
            "workload",
            f"{w.producers} producers, {w.consumers} consumers, {w.queues} queue(s), "
            f"rate {w.rate or 'unlimited'}/s, {w.duration:.0f}s, {len(self.plan.steps)} fault(s) planned",
        )
        stats = asyncio.run(
            run_workload(
                driver,
                w,
                self.client_nodes,
                self.scenario.seed,
                recorder,
                on_tick=tick,
                nemesis=nemesis,
                holdings=node_holdings_reader(self.plugin, cluster.nodes),
                broker_dead_letter=self.plugin.dead_letter_queues,
                down=nemesis.down,
            )
        )
        self.drained_at = time.monotonic()
        say("drain", "drained " + ", ".join(f"{q}: {n}" for q, n in stats.drained.items()))
        return stats.as_dict()

    # -- checking and reporting ---------------------------------------------------------------

    def _check_aside(self) -> tuple[dict[str, Any], list[tuple[str, int, int, float, BaseException | None]]]:
        """``check_run`` on another thread, with no hooks called from it (plugins keep per-thread
        state, e.g. Allure's open steps): each phase's name, start and stop (epoch ms), seconds
        and error are kept for ``_checked`` to report on the run's own thread."""
        assert self.dir is not None
        phases: list[tuple[str, int, int, float, BaseException | None]] = []

        def phase(name: str, fn: Any) -> Any:
            start_ms, t, error = int(time.time() * 1000), time.monotonic(), None
            try:
                return fn()
            except BaseException as exc:
                error = exc
                raise
            finally:
                phases.append(
                    (name, start_ms, int(time.time() * 1000), round(time.monotonic() - t, 3), error)
                )

        results = check_run(
            self.host,
            self.dir,
            self.scenario.to_dict(),
            self.checkers,
            phase=phase,
            drained_at=self.drained_at,
        )
        return results, phases

    def _checked(self, checking: _Background) -> dict[str, Any]:
        """The results of ``_check_aside``, its phases reported (with their real times) as if run here."""
        try:
            results, phases = checking.result()
        except BaseException as exc:
            self.host.phase(self, "check", "start")
            self.host.phase(self, "check", "failed", error=str(exc) or type(exc).__name__)
            raise
        for name, start_ms, stop_ms, seconds, error in phases:
            self.timings[name] = seconds
            self.host.phase(self, name, "start", start_ms=start_ms)
            if error is not None:
                self.host.phase(
                    self, name, "failed", error=str(error) or type(error).__name__, stop_ms=stop_ms
                )
            else:
                self.host.phase(self, name, "done", seconds=seconds, stop_ms=stop_ms)
        return results

    def report(self, results: dict[str, Any]) -> Path | None:
        assert self.dir is not None
        return render_report(self.host, self.dir, results)


class _Background:
    """A call on its own daemon thread; ``result`` waits for it and returns or raises what it
    did. Not a ThreadPoolExecutor: its worker is joined at interpreter exit, so an interrupted
    run would wait there for a check nobody reads."""

    def __init__(self, fn: Any) -> None:
        self._out: Any = None
        self._exc: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name="check", daemon=True)
        self._thread.start()

    def _run(self, fn: Any) -> None:
        try:
            self._out = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of result()
            self._exc = exc

    def result(self) -> Any:
        self._thread.join()
        if self._exc is not None:
            raise self._exc
        return self._out


def build_images(
    client: Any,
    plugin: Any,
    *,
    faketime: bool = False,
    roles: Mapping[str, ImageRecipe] | None = None,
    tags_only: bool = False,
) -> dict[str, str]:
    """The broker's node image (with libfaketime under the ``faketime`` feature), the
    Toxiproxy sidecar image and the image of each role that declares its own (``roles``: by
    role name; ``role:NAME`` in the answer), built if missing (offline); ``tags_only``: their
    tags, nothing built (``client`` may be None)."""
    builder = ImageBuilder(client, tags_only=tags_only)
    broker = broker_image(builder, plugin)
    if faketime:
        broker = builder.faketime_image(broker)
    out = {"broker": broker, "toxiproxy": builder.toxiproxy_image()}
    for name, recipe in (roles or {}).items():
        out[f"role:{name}"] = builder.node_image(recipe)
    return out


def check_run(
    host: Host,
    run_dir: RunDir,
    scenario: dict[str, Any],
    checkers: tuple[str, ...] | list[str],
    phase: Any = None,
    drained_at: float | None = None,
) -> dict[str, Any]:
    """Run the checkers on a stored run and compose their verdicts, worst first (pure: no Docker;
    ``harness.verdicts.combine``).

    drained_at: when the run's final drain returned (monotonic); each checker's line then also
    says how long after the drain it finished (a run checks while its cluster is torn down).
    """
    phase = phase or (lambda name, fn: fn())
    if run_dir.history_jsonl.exists() and not run_dir.history_parquet.exists():
        # The recorder writes the Parquet history during the run; only a run it could not
        # close (killed) or an older stored run needs converting.
        n = phase("history", lambda: to_parquet(run_dir.history_jsonl, run_dir.history_parquet))
        say("check", f"history: {n} operations -> {run_dir.history_parquet.name}")
    per: dict[str, dict[str, Any]] = {}
    for name in checkers:
        fn = host.checker(name)
        say("check", f"checker {name}")
        started = time.monotonic()
        try:
            res = phase("check", lambda fn=fn: fn(run_dir.path, scenario))
        except Exception as exc:  # noqa: BLE001 - a checker that throws yields unknown, not a crash
            res = {"valid": "unknown", "verdict": "unknown", "error": f"{type(exc).__name__}: {exc}"}
        done = time.monotonic()
        after = f" ({done - drained_at:.1f}s after the drain)" if drained_at is not None else ""
        say("check", f"checker {name}: {res.get('verdict')} in {done - started:.1f}s{after}")
        per[name] = res
    results = combine(per)
    lost, unreachable = missing(results)
    results["fault_evidence"] = read_fault_evidence(
        run_dir.history_jsonl,
        lost=lost,
        unreachable=unreachable,
        confirms_after_sync=sync_promise(host, scenario),
        capped=bool(results.get("lost_truncated")),
    )
    judge_unsynced(results)
    return results


def sync_promise(host: Host, scenario: Mapping[str, Any]) -> bool | None:
    """What the scenario's broker plugin says of its settings: a confirm follows an fsync
    (``BrokerPlugin.confirms_after_sync``); None when it does not say or is not loaded (a
    stored run re-checked where its plugin is not installed)."""
    broker = scenario.get("broker") or {}
    if broker.get("plugin") not in host.registry.brokers:
        return None
    plugin = host.broker(broker["plugin"], broker.get("version"))
    return plugin.confirms_after_sync(plugin.validate_settings(broker.get("settings") or {}))


def host_features(scenario: Scenario, plan: Plan, faults: Mapping[str, type[Fault]]) -> frozenset[str]:
    """What the host must set up before the cluster starts: the scenario's own requests and
    whatever the planned fault kinds ``need``."""
    out = {"lazyfs"} if scenario.broker.lazyfs else set()
    for step in plan.steps:
        out |= faults[step.kind].needs
    unknown = out - set(HOST_FEATURES)
    if unknown:
        raise BrokerChaosError(
            f"fault kinds need host features {sorted(unknown)} this harness does not provide; "
            f"it provides: {', '.join(sorted(HOST_FEATURES))}"
        )
    return frozenset(out)


def heal_all(
    faults: Mapping[str, type[Fault]], ctx: FaultContext, capabilities: frozenset[str]
) -> dict[str, Any]:
    """Every registered fault kind the broker could have suffered heals whatever it may have left.
    A kind that could not bring nodes back (``NodesDown``) does not stop the others: the nodes that
    stayed down are raised once every kind has healed, with what was done."""
    out: dict[str, Any] = {}
    down: dict[str, str] = {}
    healed: set[Any] = set()  # kinds that share a mechanism share one heal_all: run it once
    for name, cls in sorted(faults.items()):
        fn = getattr(cls.heal_all, "__func__", cls.heal_all)
        if cls.requires <= capabilities and fn not in healed:
            healed.add(fn)
            try:
                done = cls.heal_all(ctx)
            except NodesDown as exc:
                down.update(exc.nodes)
                done = exc.done
            if done:
                out[name] = done
    if down:
        raise NodesDown(down, out)
    return out


def annotate_coverage(plugin: Any, run_dir: Path, results: dict[str, Any]) -> None:
    """The run's events and coverage cells (``harness.coverage``); a plugin whose ``events`` throws
    leaves the error there instead, not a crash: the verdict stands without them."""
    try:
        annotate(plugin, run_dir, results)
    except Exception as exc:  # noqa: BLE001 - a plugin's log reader must not sink a checked run
        results["events"] = []
        results["coverage"] = {"error": f"{type(exc).__name__}: {exc}"}


def render_report(host: Host, run_dir: RunDir, results: dict[str, Any]) -> Path | None:
    """The first report a plugin renders (``brokerchaos_render_report``), if any plugin does."""
    return host.render_report(run_dir.path, results)


def check_ports_free(ports: dict[str, int]) -> None:
    """Fixed client ports must be free before anything starts (Docker would fail half-way)."""
    import socket

    for node, port in ports.items():
        if not 1 <= port <= 65535:
            raise BrokerChaosError(f"--ports: {port} (for {node}) is not a TCP port number")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                raise PortInUse(
                    f"port {port} (client port of {node}) is in use: free it or choose another --ports base"
                ) from None


def _check_replay(replay: Plan, faults: Any, capabilities: frozenset[str], nodes: list[str]) -> None:
    """A replayed plan comes from a file: check it as strictly as a planned one."""
    for step in replay.steps:
        if step.kind not in faults:
            raise BrokerChaosError(
                f"replay: the stored run used fault {step.kind!r}, which no loaded plugin provides"
            )
        missing = faults[step.kind].requires - capabilities
        if missing:
            raise BrokerChaosError(f"replay: fault {step.kind!r} needs broker capabilities {sorted(missing)}")
        named = step.params.get("nodes")
        targets = [step.params.get("node")] + (list(named) if isinstance(named, list) else [])
        for node in targets:
            if node is not None and node not in nodes:
                raise BrokerChaosError(
                    f"replay: fault {step.fault_id} targets node {node!r}, not one of {nodes}"
                )


def _log_to(path: Path) -> logging.Handler:
    """Library logs (aiormq's connection errors, asyncio) go to the run directory, not the terminal:
    the history already records each failure as an operation."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    return handler


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def dumps(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2, sort_keys=True, default=str)


def execute(
    host: Host,
    scenario: Scenario,
    store: Path,
    *,
    checkers: tuple[str, ...] | None = None,
    keep: bool = False,
    reporter: Any = None,
) -> ChaosResult:
    """Run one scenario to its results. ``reporter`` (the Allure one) hears of a run that dies."""
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
def running_cluster(
    host: Host,
    scenario: Scenario,
    *,
    keep: bool = False,
    collect_to: Path | None = None,
    faketime: bool = False,
) -> Iterator[Any]:
    """A started ``harness.cluster.Cluster`` for a scenario's broker, no workload; always torn down."""
    plugin = host.broker(scenario.broker.plugin, scenario.broker.version)
    settings = plugin.validate_settings(scenario.broker.settings)
    client = docker_client()
    recipes = role_recipes(plugin, scenario.broker.nodes, settings)
    images = build_images(client, plugin, faketime=faketime, roles=recipes)
    topology = build_topology(
        plugin,
        role_images={name: images[f"role:{name}"] for name in recipes},
        run_id=f"bc-{secrets.token_hex(3)}",
        nodes=scenario.broker.nodes,
        settings=settings,
        broker_image=images["broker"],
        proxy_image=images["toxiproxy"],
        lazyfs=scenario.broker.lazyfs,
        faketime=faketime,
        filesystem=scenario.broker.filesystem,
    )
    with Cluster(client, topology, plugin, settings, keep=keep) as cluster:
        try:
            cluster.start()
            yield cluster
        finally:
            if collect_to is not None:
                cluster.collect(collect_to)
