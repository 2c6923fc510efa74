"""The registries handed to the ``brokerchaos_register_*`` hooks (tox's ``register`` pattern)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.spec.broker import BASE_CAPABILITIES, BrokerPlugin
from harness.spec.errors import PluginError
from harness.spec.fault import Fault


@dataclass
class Registry:
    """Everything the loaded plugins contributed, keyed by name.

    ``current_plugin`` is set by the host while one plugin's hook runs, so a bad
    contribution is reported against the plugin that made it.
    """

    brokers: dict[str, BrokerPlugin] = field(default_factory=dict)
    clients: dict[str, Callable[..., Any]] = field(default_factory=dict)
    faults: dict[str, type[Fault]] = field(default_factory=dict)
    checkers: dict[str, Callable[..., dict[str, Any]]] = field(default_factory=dict)
    capabilities: dict[str, str] = field(default_factory=lambda: dict(BASE_CAPABILITIES))
    defaults: list[str] = field(default_factory=list)
    origin: dict[tuple[str, str], str] = field(default_factory=dict)
    current_plugin: str = "?"

    def _claim(self, kind: str, name: str) -> None:
        key = (kind, name)
        if key in self.origin:
            raise PluginError(
                self.current_plugin, f"{kind} {name!r} is already provided by plugin {self.origin[key]!r}"
            )
        self.origin[key] = self.current_plugin

    def add_broker(self, plugin: BrokerPlugin) -> None:
        if not isinstance(plugin, BrokerPlugin):
            raise PluginError(
                self.current_plugin, f"add_broker() needs a BrokerPlugin instance, got {plugin!r}"
            )
        for attr in ("name", "client_port", "data_dir"):
            if not hasattr(plugin, attr):
                raise PluginError(self.current_plugin, f"broker plugin does not declare {attr!r}")
        if not plugin.data_dir.startswith("/"):
            raise PluginError(
                self.current_plugin, f"broker {plugin.name!r}: data_dir must be an absolute path"
            )
        self._claim("broker", plugin.name)
        self.brokers[plugin.name] = plugin

    def add_capability(self, name: str, description: str) -> None:
        """A capability a broker plugin may declare beyond the base ones (a fault package that needs it adds it)."""
        if not isinstance(name, str) or not name or not isinstance(description, str):
            raise PluginError(
                self.current_plugin, f"add_capability() needs a name and a description, got {name!r}"
            )
        if name in BASE_CAPABILITIES:
            return
        self._claim("capability", name)
        self.capabilities[name] = description

    def check_capabilities(self) -> None:
        """Once every plugin registered: a broker capability nobody defined is a typo, not a promise."""
        for broker in self.brokers.values():
            unknown = set(broker.capabilities) - set(self.capabilities)
            if unknown:
                raise PluginError(
                    self.origin.get(("broker", broker.name), "?"),
                    f"broker {broker.name!r} declares unknown capabilities {sorted(unknown)}; "
                    f"known: {', '.join(sorted(self.capabilities))}",
                )

    def add_client(self, protocol: str, factory: Callable[..., Any]) -> None:
        self._claim("client", protocol)
        self.clients[protocol] = factory

    def add_fault(self, fault: type[Fault]) -> None:
        if not (isinstance(fault, type) and issubclass(fault, Fault)):
            raise PluginError(
                self.current_plugin, f"add_fault() needs a subclass of harness.spec.Fault, got {fault!r}"
            )
        name = getattr(fault, "name", None)
        if not isinstance(name, str):
            raise PluginError(self.current_plugin, f"fault class {fault!r} has no string 'name'")
        self._claim("fault", name)
        self.faults[name] = fault

    def add_checker(self, name: str, fn: Callable[..., dict[str, Any]], *, default: bool = False) -> None:
        """``default``: run it when a scenario names no checkers (several defaults all run)."""
        if not callable(fn):
            raise PluginError(self.current_plugin, f"checker {name!r} is not callable")
        self._claim("checker", name)
        self.checkers[name] = fn
        if default:
            self.defaults.append(name)

    def default_checkers(self) -> tuple[str, ...]:
        if not self.checkers:
            raise PluginError(
                "?", "no checker is loaded: install spark_reports or load a checker plugin with -p"
            )
        return tuple(self.defaults) or (sorted(self.checkers)[0],)
