"""The plugin host: loads plugins, checks them against the hook spec, and is the only
code that touches ``pm.hook`` (everything else calls the typed methods here)."""

from __future__ import annotations

import importlib
import importlib.metadata as md
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from harness.errors import BrokerChaosError, ConfigError, PluginError
from harness.spec import hooks as hookspec
from harness.spec.fault import Fault
from harness.spec.registry import Registry

PROJECT = "brokerchaos"
ENTRY_POINT_GROUP = "brokerchaos"


@dataclass(frozen=True)
class LoadedPlugin:
    name: str
    source: str  # "entry point <module>" or "-p <module>"
    version: str


class Host:
    """A loaded set of plugins and what they registered."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspec)
        self.loaded: list[LoadedPlugin] = []
        self.registry = Registry()

    # -- loading ---------------------------------------------------------------------

    @classmethod
    def load(cls, extra: Sequence[str] = (), *, entry_points: bool = True) -> Host:
        """Load entry-point plugins, then each ``-p module.path``; validate; collect registrations."""
        host = cls()
        if entry_points:
            for ep in sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
                try:
                    module = ep.load()
                except Exception as exc:  # noqa: BLE001 - any import failure is the plugin's
                    raise PluginError(
                        ep.name, f"failed to import {ep.value}: {type(exc).__name__}: {exc}"
                    ) from exc
                version = (
                    _module_version(module)
                    if hasattr(module, "__version__") or ep.dist is None
                    else ep.dist.version
                )
                host._register(module, ep.name, f"entry point {ep.value}", version)
        for path in extra:
            try:
                module = importlib.import_module(path)
            except Exception as exc:  # noqa: BLE001
                raise PluginError(path, f"failed to import: {type(exc).__name__}: {exc}") from exc
            host._register(module, path, f"-p {path}", _module_version(module))
        host._check_pending()
        host._collect()
        return host

    def register(self, plugin: object, name: str) -> None:
        """Register one more plugin object after loading (tests, the pytest plugin)."""
        self._register(plugin, name, "registered", _module_version(plugin))
        self._check_pending()
        self._collect(only=[name])

    def _register(self, plugin: object, name: str, source: str, version: str) -> None:
        if self.pm.has_plugin(name):
            return  # the same module reached through an entry point and -p
        if self.pm.is_registered(plugin):
            return
        try:
            self.pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(name, str(exc)) from exc
        self.loaded.append(LoadedPlugin(name, source, version))

    def _check_pending(self) -> None:
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            name = self.pm.get_name(exc.plugin) or repr(exc.plugin)
            raise PluginError(name, f"{exc} (see harness/spec/hooks.py for the hooks that exist)") from exc

    def _collect(self, only: Iterable[str] | None = None) -> None:
        names = set(only) if only is not None else None
        for hook_name in (
            "brokerchaos_register_brokers",
            "brokerchaos_register_clients",
            "brokerchaos_register_faults",
            "brokerchaos_register_checkers",
        ):
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if names is not None and impl.plugin_name not in names:
                    continue
                self.registry.current_plugin = impl.plugin_name
                try:
                    impl.function(register=self.registry)
                except BrokerChaosError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    raise PluginError(
                        impl.plugin_name, f"{hook_name} raised {type(exc).__name__}: {exc}"
                    ) from exc
        self.registry.current_plugin = "?"
        self.registry.check_capabilities()

    # -- typed facade ----------------------------------------------------------------

    def broker(self, name: str, version: str | None = None) -> Any:
        """The broker plugin ``name`` bound to ``version`` (None: its default version)."""
        try:
            return self.registry.brokers[name].at_version(version)
        except KeyError:
            known = ", ".join(sorted(self.registry.brokers)) or "(none loaded)"
            raise BrokerChaosError(
                f"unknown broker plugin {name!r}; loaded: {known} (install it, or load it with -p module.path)"
            ) from None

    def client(self, protocol: str) -> Any:
        try:
            return self.registry.clients[protocol]
        except KeyError:
            raise BrokerChaosError(
                f"no workload driver for protocol {protocol!r}; load a client plugin"
            ) from None

    def fault(self, name: str) -> type[Fault]:
        try:
            return self.registry.faults[name]
        except KeyError:
            known = ", ".join(sorted(self.registry.faults)) or "(none loaded)"
            raise BrokerChaosError(f"unknown fault {name!r}; available: {known}") from None

    def checker(self, name: str) -> Any:
        try:
            return self.registry.checkers[name]
        except KeyError:
            known = ", ".join(sorted(self.registry.checkers)) or "(none loaded)"
            raise BrokerChaosError(f"unknown checker {name!r}; available: {known}") from None

    def checkers_for(
        self, asked: Sequence[str] | None, named: Sequence[str] | None = None
    ) -> tuple[str, ...]:
        """The checkers a run or an analysis uses, decided here only: those asked for (the command
        line), else those the scenario names, else those registered as a default (``add_checker(...,
        default=True)``); each one loaded, or one line naming the checkers that are."""
        chosen = tuple(asked or ()) or tuple(named or ()) or self.registry.default_checkers()
        for name in chosen:
            self.checker(name)
        return chosen

    def configure(self, config: dict[str, Any]) -> None:
        """Give every plugin the settings; one that refuses one (a ValueError) ends the command with
        its message as one line."""
        try:
            self.pm.hook.brokerchaos_configure.call_historic(kwargs={"config": config})
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def run_started(self, run: Any) -> None:
        self.pm.hook.brokerchaos_run_started(run=run)

    def phase(self, run: Any, phase: str, status: str, **detail: Any) -> None:
        self.pm.hook.brokerchaos_phase(run=run, phase=phase, status=status, detail=detail)

    def fault_done(self, run: Any, op: dict[str, Any]) -> None:
        self.pm.hook.brokerchaos_fault(run=run, op=op)

    def render_report(self, run_dir: Path, results: dict[str, Any]) -> Path | None:
        path = self.pm.hook.brokerchaos_render_report(run_dir=run_dir, results=results)
        return Path(path) if path else None

    def grade(self, run_dirs: list[Path], engine: str, out: Path) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.pm.hook.brokerchaos_grade(
            run_dirs=run_dirs, engine=engine, out=out
        )
        return result

    def service(self, name: str, action: str, options: dict[str, Any]) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.pm.hook.brokerchaos_service(
            name=name, action=action, options=options
        )
        return result

    def run_finished(self, run: Any, results: dict[str, Any]) -> None:
        self.pm.hook.brokerchaos_run_finished(run=run, results=results)

    def describe(self) -> list[dict[str, Any]]:
        """One row per loaded plugin and what it contributed (for ``brokerchaos plugins``)."""
        rows = []
        for lp in self.loaded:
            contributed = sorted(
                f"{kind}:{name}" for (kind, name), who in self.registry.origin.items() if who == lp.name
            )
            if not contributed:  # a plugin of hooks only (a report, a service): the hooks it answers
                contributed = self._hooks_of(lp.name)
            caps: list[str] = []
            for (kind, name), who in self.registry.origin.items():
                if kind == "broker" and who == lp.name:
                    caps.extend(sorted(self.registry.brokers[name].capabilities))
            rows.append(
                {
                    "plugin": lp.name,
                    "version": lp.version,
                    "source": lp.source,
                    "provides": contributed,
                    "capabilities": sorted(set(caps)),
                }
            )
        return rows

    def _hooks_of(self, name: str) -> list[str]:
        callers = self.pm.get_hookcallers(self.pm.get_plugin(name)) or []
        return sorted(f"hook:{c.name.removeprefix(PROJECT + '_')}" for c in callers)


def _module_version(module: object) -> str:
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    if isinstance(module, ModuleType):
        top = module.__name__.split(".")[0]
        try:
            return md.version(top)
        except md.PackageNotFoundError:
            pass
    return "unknown"
