"""The fault contract: what a fault kind is, what it may touch, and how the host heals it.

A fault kind is a class registered by a plugin (``brokerchaos_register_faults``)
with a ``name``, the broker ``requires`` capabilities, the host features it
``needs`` (e.g. ``lazyfs``: node data directories on the lazy filesystem), and
three steps: ``resolve`` turns scenario parameters into concrete ones using the
step's own seeded RNG, ``apply`` does it and ``heal`` undoes it. ``heal_all`` is
the kind's last word on every exit path: it undoes whatever any application of
the kind may have left behind, whether or not the nemesis knows it applied one.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.spec.errors import ScenarioError


@dataclass(frozen=True)
class HostFeature:
    """Something the host sets up before the cluster starts, for the fault kinds that ``need`` it."""

    description: str
    #: The broker capability that says a plugin can run with it (None: any plugin can).
    capability: str | None = None


#: Under the ``faketime`` feature: the file libfaketime reads the broker's wall-clock offset
#: from (``+12.5``, ``-3``: seconds), in the broker container. Clock faults write it.
FAKETIME_FILE = "/var/lib/brokerchaos-clock/offset"

#: Host features a fault may ``need``.
HOST_FEATURES: dict[str, HostFeature] = {
    "lazyfs": HostFeature(
        "each node's data directory sits on the lazy filesystem (unsynced writes can be dropped)",
        capability="power-loss",
    ),
    "faketime": HostFeature(
        "libfaketime is preloaded into each broker process, its wall-clock offset read from a "
        "control file the clock faults write",
        capability="clock",
    ),
}


@dataclass(frozen=True)
class ConformanceProbe:
    """How ``brokerchaos validate`` exercises a fault kind once on a plugin that can suffer it.

    ``params`` are one application's scenario parameters (the kit targets node ``n1``),
    ``nodes`` the cluster size it needs, ``may_lose`` whether a correct broker may lose
    confirmed messages under it (power loss: the broker's durability setting decides).
    ``corrupts``: the fault damages a data file while the broker is down, so a broker that
    declares ``corruption_response = "refuse"`` passes by staying down with its log naming
    the file (``BrokerPlugin.corruption_response``).
    """

    params: Mapping[str, Any] = field(default_factory=lambda: {"node": "n1"})
    nodes: int = 1
    may_lose: bool = False
    corrupts: bool = False


class FaultContext:
    """What a fault may touch: the running cluster (nodes, proxies, containers)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    @property
    def nodes(self) -> list[str]:
        return list(self.cluster.topology.nodes)


class Fault:
    """Base of every fault kind."""

    name: ClassVar[str]
    #: Broker capabilities the kind needs (``BrokerPlugin.capabilities``).
    requires: ClassVar[frozenset[str]] = frozenset()
    #: Host features the kind needs when it is planned in a run (``HOST_FEATURES``):
    #: the host sets them up before the cluster starts.
    needs: ClassVar[frozenset[str]] = frozenset()
    #: What an application holds for itself on the nodes it targets (e.g. ``process``: the
    #: broker's processes; ``disk``: its data directory; ``clock``): two faults held at once
    #: may not hold the same resource on the same node (a pause of a killed broker, two clock
    #: offsets). Kinds that only add to a shared mechanism (toxics, each named by its fault
    #: id) hold nothing.
    touches: ClassVar[frozenset[str]] = frozenset()
    #: How the conformance kit exercises this kind (None: it does not).
    conformance: ClassVar[ConformanceProbe | None] = None
    #: Parameters a scenario may give, with allowed values (for validation messages).
    params_schema: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, ctx: FaultContext, params: Mapping[str, Any], fault_id: str = "") -> None:
        self.ctx = ctx
        self.params = dict(params)
        #: The plan's id for this application (``f3``); names what it adds, so overlapping faults do not collide.
        self.fault_id = fault_id

    @classmethod
    def switches_proxies(cls, params: Mapping[str, Any]) -> bool:
        """Whether this application turns proxies off and back on (which no other fault may do meanwhile)."""
        return False

    @classmethod
    def holds(cls, params: Mapping[str, Any], nodes: Sequence[str]) -> set[tuple[str, str]]:
        """The ``(resource, node)`` pairs one application holds exclusively while it is applied.

        By default each resource in ``touches`` on the nodes the concrete parameters name
        (``node``, or a list ``nodes``), or on every node when they name none.
        """
        if not cls.touches:
            return set()
        if isinstance(params.get("node"), str):
            targets: Sequence[str] = [params["node"]]
        elif isinstance(params.get("nodes"), list | tuple):
            targets = list(params["nodes"])
        else:
            targets = nodes
        return {(r, n) for r in cls.touches for n in targets}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        """Concrete parameters for one application (deterministic given ``rng``)."""
        for key, value in params.items():
            if key not in cls.params_schema:
                raise ScenarioError(
                    f"fault {cls.name}: unknown parameter {key!r}; allowed: "
                    f"{', '.join(sorted(cls.params_schema)) or '(none)'}"
                )
            _check_param(cls.name, key, value, cls.params_schema[key])
        return dict(params)

    def apply(self) -> dict[str, Any]:
        raise NotImplementedError

    def heal(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        """Undo whatever this kind may have left anywhere in the cluster (idempotent).

        The host calls it for every registered kind on every exit path, after the
        nemesis stopped, so a kind never applied must be harmless to heal. Kinds that
        share a mechanism (every Toxiproxy-based kind) may leave it to the first one;
        return None when there was nothing for this kind to do, else what was done.
        """
        return None


def _check_param(fault: str, key: str, value: Any, allowed: Any) -> None:
    """Reject a value ``params_schema`` rules out now, not when the fault is applied mid-run."""
    if isinstance(allowed, tuple):
        if value not in allowed:
            raise ScenarioError(
                f"fault {fault}: {key} {value!r} is not allowed; use one of {', '.join(map(str, allowed))}"
            )
    elif isinstance(allowed, type):
        if allowed is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            ok = isinstance(value, allowed) and not (allowed is int and isinstance(value, bool))
        if not ok:
            raise ScenarioError(f"fault {fault}: {key} expects {allowed.__name__}, got {value!r}")
