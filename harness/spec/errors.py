"""The errors a user can cause, each ending in one line that says what to do.

Plugins, faults and checkers raise these (a plugin's bad setting is a ``ScenarioError``, a
fault that cannot be applied a ``FaultError``); the CLI catches ``BrokerChaosError`` and
prints ``brokerchaos: <message>`` with exit status 2; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations


class BrokerChaosError(Exception):
    """Base of every error the harness reports as one line."""


class PluginError(BrokerChaosError):
    """A plugin failed to import, broke the hook spec, or declared something inconsistent."""

    def __init__(self, plugin: str, reason: str) -> None:
        super().__init__(f"plugin {plugin!r}: {reason}")
        self.plugin = plugin
        self.reason = reason


class ScenarioError(BrokerChaosError):
    """A scenario file is missing, unreadable or invalid; names the field and the allowed values."""


class DockerUnavailable(BrokerChaosError):
    """The Docker engine cannot be reached."""


class PortInUse(BrokerChaosError):
    """A port the harness must bind is taken."""


class ImageError(BrokerChaosError):
    """An image could not be built."""


class ClusterError(BrokerChaosError):
    """A cluster did not start or did not become ready in time."""


class ConfigError(BrokerChaosError):
    """A plugin cannot accept a setting of the command line (``brokerchaos_configure``)."""


class FaultError(BrokerChaosError):
    """A fault could not be applied (unsupported capability, bad parameters)."""
