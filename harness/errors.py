"""Errors a user can cause, each ending in one line that says what to do.

The classes are part of the contract (``harness.spec.errors``) and are importable from here
as well; ``short_error`` puts a Docker or HTTP error's root cause in a few words.
"""

from __future__ import annotations

from harness.spec.errors import (
    BrokerChaosError,
    ClusterError,
    ConfigError,
    DockerUnavailable,
    FaultError,
    ImageError,
    NodesDown,
    PluginError,
    PortInUse,
    ScenarioError,
)

__all__ = [
    "BrokerChaosError",
    "ClusterError",
    "ConfigError",
    "DockerUnavailable",
    "FaultError",
    "ImageError",
    "NodesDown",
    "PluginError",
    "PortInUse",
    "ScenarioError",
    "short_error",
]


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
