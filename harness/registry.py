"""The registries handed to the ``brokerchaos_register_*`` hooks (tox's ``register`` pattern)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.broker import KNOWN_CAPABILITIES, BrokerPlugin
from harness.errors import PluginError


@dataclass
class Registry:
    """Everything the loaded plugins contributed, keyed by name.

    ``current_plugin`` is set by the host while one plugin's hook runs, so a bad
    contribution is reported against the plugin that made it.
    """

    brokers: dict[str, BrokerPlugin] = field(default_factory=dict)
    clients: dict[str, Callable[..., Any]] = field(default_factory=dict)
    faults: dict[str, type] = field(default_factory=dict)
    checkers: dict[str, Callable[..., dict[str, Any]]] = field(default_factory=dict)
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
            raise PluginError(self.current_plugin, f"add_broker() needs a BrokerPlugin instance, got {plugin!r}")
        for attr in ("name", "client_port", "data_dir"):
            if not hasattr(plugin, attr):
                raise PluginError(self.current_plugin, f"broker plugin does not declare {attr!r}")
        unknown = set(plugin.capabilities) - KNOWN_CAPABILITIES
        if unknown:
            raise PluginError(
                self.current_plugin,
                f"broker {plugin.name!r} declares unknown capabilities {sorted(unknown)}; "
                f"known: {', '.join(sorted(KNOWN_CAPABILITIES))}",
            )
        if not plugin.data_dir.startswith("/"):
            raise PluginError(self.current_plugin, f"broker {plugin.name!r}: data_dir must be an absolute path")
        self._claim("broker", plugin.name)
        self.brokers[plugin.name] = plugin

    def add_client(self, protocol: str, factory: Callable[..., Any]) -> None:
        self._claim("client", protocol)
        self.clients[protocol] = factory

    def add_fault(self, fault: type) -> None:
        name = getattr(fault, "name", None)
        if not isinstance(name, str):
            raise PluginError(self.current_plugin, f"fault class {fault!r} has no string 'name'")
        self._claim("fault", name)
        self.faults[name] = fault

    def add_checker(self, name: str, fn: Callable[..., dict[str, Any]]) -> None:
        if not callable(fn):
            raise PluginError(self.current_plugin, f"checker {name!r} is not callable")
        self._claim("checker", name)
        self.checkers[name] = fn
