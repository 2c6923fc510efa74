"""Every hook brokerchaos calls, grouped by phase. Plugins implement them with ``harness.hookimpl``.

Hooks are always called with keyword arguments. The registries passed to the
``register_*`` hooks are the only way to contribute brokers, clients, faults and
checkers, so built-ins and third-party plugins go through the same door.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    from pathlib import Path

    from harness.spec.broker import BrokerPlugin
    from harness.spec.registry import Registry

hookspec = pluggy.HookspecMarker("brokerchaos")


class Run(Protocol):
    """What the run hooks receive: the run in progress (the harness's runner is one). The
    contract names what a plugin may read of it, not the class that carries it."""

    id: str  # the run's id, which labels its containers
    scenario: Any  # the scenario (``name``, ``seed``, ``source``, ``broker``, ``workload``, ...)
    dir: Any  # the run directory (``.path``); None before it is created
    plugin: BrokerPlugin  # the broker plugin under test
    nodes: list[str]  # node names, ``n1``...
    checkers: tuple[str, ...]  # the checkers that will judge it
    plan: Any  # the planned faults (``.steps``, each with ``kind``)


# -- registration (called once when the host starts) ------------------------------


@hookspec
def brokerchaos_register_brokers(register: Registry) -> None:
    """Contribute broker plugins with ``register.add_broker(plugin)``.

    ``plugin`` is an instance of ``harness.BrokerPlugin``. Its name is what a
    scenario's ``broker:`` field refers to; two plugins with one name are an error.
    """


@hookspec
def brokerchaos_register_clients(register: Registry) -> None:
    """Contribute workload drivers with ``register.add_client(protocol, factory)``.

    One driver serves every broker plugin that speaks ``protocol`` (e.g. ``amqp091``);
    ``factory(endpoints, recorder, **options)`` returns a ``harness.spec.client.Driver``:
    ``endpoints`` maps every node to its client endpoint (``harness.spec.client.Endpoint``),
    ``recorder`` is the history's writer (``harness.spec.history.Recorder``) and ``options``
    are ``harness.spec.client.DriverOptions``. The factory runs in the harness's process, so
    the client library it imports must be installed there.
    """


@hookspec
def brokerchaos_register_faults(register: Registry) -> None:
    """Contribute fault kinds with ``register.add_fault(fault_class)``.

    A fault class names the broker capabilities it needs (``requires``); the host
    refuses a scenario whose broker does not declare them, before anything starts.
    Each application is constructed as ``cls(ctx, params, fault_id)``; whatever it
    adds (toxics, files) should carry ``fault_id`` so overlapping faults do not
    collide. A fault that turns proxies off and back on says so in
    ``switches_proxies(params)``, and the planner refuses to overlap it with
    another network fault. A fault that cuts nodes off says which in
    ``cuts_off(params, nodes)``; one whose heal needs nodes to reach each other
    (a join) says which in ``heal_needs_links(params, nodes)``, and the nemesis
    starts that heal only once no held fault cuts one of them off.
    """


@hookspec
def brokerchaos_register_checkers(register: Registry) -> None:
    """Contribute checkers with ``register.add_checker(name, fn)``.

    ``fn(run_dir, scenario) -> dict`` must be a pure function of the stored run (no
    Docker, no network, no clock) returning the results schema of ``spark_reports``.
    """


# -- configuration -----------------------------------------------------------------


@hookspec(historic=True)
def brokerchaos_configure(config: dict[str, Any]) -> None:
    """See the harness configuration once the command line is read, before any run.

    ``config`` holds ``store`` (the run store's root), ``spark_master`` (None: the
    checker's default), ``spark_remote`` (a Spark Connect server's ``sc://HOST:PORT``, given
    with ``--spark-remote``; None: none given) and ``checker_options`` (``{checker: {option: value}}`` from
    ``--checker-option``). Checkers take their settings from here, never from the
    harness by name. Historic: a plugin registered later (``-p``) still receives it.
    A plugin that cannot accept a setting raises ``ValueError`` with a message that says
    what to give instead: the command ends with that message as one line.
    """


@hookspec(firstresult=True)
def brokerchaos_service(name: str, action: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """Start, show or stop a plugin's long-lived service: ``brokerchaos NAME start|status|stop``.

    ``name`` is the command's (``spark``: the checkers' Spark Connect server, which later
    commands check through while it is up); ``action`` is ``start``, ``status`` or ``stop``;
    ``options`` holds the command line's (``port``, ``driver_memory``, ``no_warm_up``). Returns
    ``{"up": bool, "lines": [str, ...]}``, the lines to print; None: no plugin serves ``name``
    (first result). A plugin that cannot do it raises ``ValueError`` with one line that says
    what to do instead.
    """


# -- run lifecycle ------------------------------------------------------------------


@hookspec
def brokerchaos_run_started(run: Run) -> None:
    """A run has its directory and scenario; nothing has started in Docker yet."""


@hookspec
def brokerchaos_phase(run: Run, phase: str, status: str, detail: dict[str, Any]) -> None:
    """A phase of a run began or ended.

    ``phase`` is one of ``images``, ``cluster``, ``workload``, ``heal``, ``drain``,
    ``check``, ``report``, ``teardown``; ``status`` is ``start``, ``done`` or
    ``failed``. Reporters (progress lines, Allure steps) listen here.
    """


@hookspec
def brokerchaos_fault(run: Run, op: dict[str, Any]) -> None:
    """The nemesis applied or healed a fault; ``op`` is the completed history record."""


@hookspec(firstresult=True)
def brokerchaos_render_report(run_dir: Path, results: dict[str, Any]) -> str | None:
    """Render the report of one checked run and return its path; first result: the first plugin that renders one wins."""


@hookspec(firstresult=True)
def brokerchaos_grade(run_dirs: list[Path], engine: str, out: Path) -> dict[str, Any] | None:
    """Grade many stored runs together into ``out``; first result: the first plugin that grades wins.

    Returns ``{"verdict": ..., "lines": [headline, detail, ...], "report": path, "grade": {...}}``.
    ``engine`` is a checker name or ``stored`` (reuse each run's ``results.json``).
    """


@hookspec
def brokerchaos_run_finished(run: Run, results: dict[str, Any]) -> None:
    """A run ended and was checked; ``results`` is what ``results.json`` holds."""
