"""Errors a user can cause, each ending in one line that says what to do.

The CLI catches ``BrokerChaosError`` and prints ``brokerchaos: <message>`` with
exit status 2; anything else is a bug and keeps its traceback.
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


def short_error(exc: BaseException) -> str:
    """The root cause of a (often deeply wrapped) Docker or HTTP error, in a few words."""
    root: BaseException = exc
    seen = set()
    while True:
        nxt = root.__cause__ or root.__context__
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(nxt))
        root = nxt
    text = str(root).strip()
    for marker in (
        "Connection refused",
        "No such file or directory",
        "Permission denied",
        "Name or service not known",
        "timed out",
        "port is already allocated",
        "address already in use",
    ):
        if marker.lower() in str(exc).lower() or marker.lower() in text.lower():
            return marker.lower()
    line = text.splitlines()[-1] if text else type(root).__name__
    return line if len(line) <= 200 else line[:197] + "..."
