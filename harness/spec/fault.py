"""The fault contract: what a fault kind is, what it may touch, and how the host heals it.

A fault kind is a class registered by a plugin (``brokerchaos_register_faults``)
with a ``name``, the broker ``requires`` capabilities, the host features it
``needs`` (e.g. ``lazyfs``: node data directories on the lazy filesystem), and
three steps: ``resolve`` turns scenario parameters into concrete ones using the
step's own seeded RNG, ``apply`` does it and ``heal`` undoes it. ``heal_all`` is
the kind's last word on every exit path: it undoes whatever any application of
the kind may have left behind, whether or not the nemesis knows it applied one.

A fault that was asked for is not a fault that happened. Each application measures its own
``Evidence``: ``evidence`` right after ``apply`` (while the fault is held), ``heal_evidence``
right after ``heal`` (the final word: the same record completed with what the heal saw). The
nemesis records it next to the action in the history; the harness only reads what the records
say (``effect``), never which kind measured them.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from harness.spec.broker import BROKER_ROLE
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


#: The lazy filesystem's models (``broker.filesystem``; ``docs/explanation/filesystem-models.md``),
#: strictest first: when a name change and a file's data survive a power cut.
FILESYSTEM_MODELS = ("strict", "ext4-ordered", "xfs")


@dataclass(frozen=True)
class ConformanceProbe:
    """How ``brokerchaos validate`` exercises a fault kind once on a plugin that can suffer it.

    ``params`` are one application's scenario parameters (the kit targets node ``n1``),
    ``nodes`` the cluster size it needs, ``may_lose`` whether a correct broker may lose
    confirmed messages under it (power loss: the broker's durability setting decides).
    ``corrupts``: the kind damages a data file, so what the kit expects after the heal
    follows the plugin's ``corruption_response`` (``refuse``: the node stays down and its
    log names the file) rather than requiring the broker back.
    """

    params: Mapping[str, Any] = field(default_factory=lambda: {"node": "n1"})
    nodes: int = 1
    may_lose: bool = False
    corrupts: bool = False


class ClusterNodes(tuple[str, ...]):
    """The node names a fault kind resolves against, each with its role (``BrokerPlugin.roles``).

    A plain sequence of names everywhere a kind reads it; ``roles`` maps each name to its role
    (every node ``broker`` when the cluster declares no others)."""

    roles: Mapping[str, str]

    def __new__(cls, names: Sequence[str], roles: Mapping[str, str] | None = None) -> ClusterNodes:
        out = super().__new__(cls, tuple(names))
        out.roles = {n: (roles or {}).get(n, BROKER_ROLE) for n in out}
        return out

    def of_role(self, fault: str, role: Any) -> ClusterNodes:
        """The nodes of ``role``; a ``ScenarioError`` naming the roles there are if it has none."""
        picked = [n for n in self if self.roles[n] == role]
        if not picked:
            known = ", ".join(sorted(set(self.roles.values())))
            raise ScenarioError(f"fault {fault}: role {role!r} has no node; this cluster's roles: {known}")
        return ClusterNodes(picked, self.roles)


def role_of(nodes: Sequence[str]) -> Mapping[str, str]:
    """Each node's role, for names that carry none (a plain list): every node a broker."""
    return nodes.roles if isinstance(nodes, ClusterNodes) else {n: BROKER_ROLE for n in nodes}


def _aimed(resolve: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """``resolve`` of a kind, taught ``role``: the kind resolves its other parameters against
    the nodes of that role only (every kind picks its targets from ``nodes``), and the concrete
    parameters keep ``role`` so the plan says what was aimed at."""

    @functools.wraps(resolve)
    def wrapper(
        cls: type[Fault], params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random
    ) -> dict[str, Any]:
        if "role" not in params:
            return resolve(cls, params, nodes, rng)
        rest = {k: v for k, v in params.items() if k != "role"}
        aimed = ClusterNodes(nodes, role_of(nodes)).of_role(cls.name, params["role"])
        return {**resolve(cls, rest, aimed, rng), "role": params["role"]}

    wrapper.aimed = True  # type: ignore[attr-defined]
    return wrapper


@dataclass(frozen=True)
class Evidence:
    """What one fault action measured of its own effect, not what it asked for.

    ``effect``: True when the measurement shows the fault bit (bytes dropped, a link that
    stopped carrying bytes, a process gone), False when it shows nothing happened (then
    ``no_effect_reason`` says what was found, in words an operator reads in one line:
    ``nothing unsynced was dropped``), None when it could not be measured (``summary`` says why).
    ``summary`` is the one line the terminal shows; ``facts`` is what was measured, as JSON
    (bytes and files, pids and signals, probes, checksums, offsets), for the history, the report
    and ``results.json``. ``flags`` are further lines an operator must see even though the fault
    bit (one direction of a cut that still carried bytes). ``restored``: on the evidence a heal
    completes, whether the measurement after the heal shows the fault undone (None: not measured).
    ``exposed``: the ids of the messages whose stored records the fault destroyed (a power cut's
    unsynced writes, mapped by a broker plugin with the ``unsynced-messages`` capability); None
    when nothing mapped them. The harness compares them with the confirms and the losses.
    """

    effect: bool | None
    summary: str
    facts: Mapping[str, Any] = field(default_factory=dict)
    no_effect_reason: str | None = None
    flags: tuple[str, ...] = ()
    restored: bool | None = None
    exposed: tuple[str, ...] | None = None

    @classmethod
    def bit(cls, summary: str, facts: Mapping[str, Any] | None = None, **kw: Any) -> Evidence:
        return cls(True, summary, dict(facts or {}), **kw)

    @classmethod
    def none(cls, reason: str, facts: Mapping[str, Any] | None = None, **kw: Any) -> Evidence:
        """Measured, and nothing happened: ``reason`` is the one line that says so."""
        return cls(False, reason, dict(facts or {}), no_effect_reason=reason, **kw)

    @classmethod
    def unmeasured(cls, why: str, facts: Mapping[str, Any] | None = None, **kw: Any) -> Evidence:
        return cls(None, why, dict(facts or {}), **kw)

    def as_dict(self) -> dict[str, Any]:
        """The record the history keeps (``value.evidence`` of the fault's and the heal's ``ok``)."""
        return {
            "effect": self.effect,
            "summary": self.summary,
            "no_effect_reason": self.no_effect_reason,
            "flags": list(self.flags),
            "restored": self.restored,
            "exposed": None if self.exposed is None else list(self.exposed),
            "facts": dict(self.facts),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Evidence:
        effect = d.get("effect")
        restored = d.get("restored")
        exposed = d.get("exposed")
        return cls(
            effect if isinstance(effect, bool) else None,
            str(d.get("summary") or ""),
            dict(d.get("facts") or {}),
            d.get("no_effect_reason"),
            tuple(str(f) for f in d.get("flags") or ()),
            restored if isinstance(restored, bool) else None,
            None if exposed is None else tuple(str(i) for i in exposed),
        )

    def with_heal(self, summary: str, facts: Mapping[str, Any], restored: bool | None) -> Evidence:
        """This evidence completed by a heal: the same finding, what the heal saw added."""
        return replace(self, summary=summary, facts=dict(facts), restored=restored)


def combine_evidence(parts: Mapping[str, Evidence]) -> Evidence:
    """One action's evidence from its parts (one per node or per link, by name): it bit where any
    part bit; it had no effect only when every part was measured and none bit."""
    if not parts:
        return Evidence.unmeasured("nothing to measure")
    effects = [e.effect for e in parts.values()]
    facts = {name: {**e.facts, "summary": e.summary, "effect": e.effect} for name, e in parts.items()}
    flags = tuple(f for e in parts.values() for f in e.flags)
    restored_parts = [e.restored for e in parts.values()]
    restored = None if None in restored_parts else all(r for r in restored_parts if r is not None)
    # One part (one node) needs no name: the action's line already names its target.
    label = (lambda name: "") if len(parts) == 1 else (lambda name: f"{name}: ")
    summary = "; ".join(f"{label(name)}{e.summary}" for name, e in parts.items())
    mapped = [e.exposed for e in parts.values() if e.exposed is not None]
    exposed = tuple(sorted({i for ids in mapped for i in ids})) if mapped else None
    if True in effects:
        quiet = [f"{n}: {e.no_effect_reason}" for n, e in parts.items() if e.effect is False]
        return Evidence.bit(summary, facts, flags=flags + tuple(quiet), restored=restored, exposed=exposed)
    if None in effects:
        return Evidence.unmeasured(summary, facts, flags=flags, restored=restored, exposed=exposed)
    reason = "; ".join(f"{label(n)}{e.no_effect_reason}" for n, e in parts.items())
    return Evidence.none(reason, facts, flags=flags, restored=restored, exposed=exposed)


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
    #: Parameters with which one application, aimed at a ``node``, closes that node's client
    #: connections while it is held, so the workload's clients reconnect to the other nodes (None:
    #: the kind cannot). ``brokerchaos explore`` uses them to push the clients onto one side of a
    #: partition: this kind on every node outside it.
    sheds_clients: ClassVar[Mapping[str, Any] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Every kind accepts ``role`` (``params: {role: storage}``) without a line of its own.
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("resolve")
        if isinstance(own, classmethod) and not getattr(own.__func__, "aimed", False):
            cls.resolve = classmethod(_aimed(own.__func__))  # type: ignore[assignment]

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
        elif "role" in params:
            targets = [n for n in nodes if role_of(nodes).get(n) == params["role"]]
        else:
            targets = nodes
        return {(r, n) for r in cls.touches for n in targets}

    @classmethod
    def cuts_off(cls, params: Mapping[str, Any], nodes: Sequence[str]) -> set[str]:
        """The nodes one application keeps from hearing, or being heard by, another node while it
        is held (a partition: both ends of each cut). None by default."""
        return set()

    @classmethod
    def heal_needs_links(cls, params: Mapping[str, Any], nodes: Sequence[str]) -> set[str]:
        """The nodes that must reach each other for one application's heal to work (a node that
        joins a cluster talks to its members). The nemesis starts such a heal only once no other
        held application ``cuts_off`` one of them: it waits for their heals, or leaves it to the
        final heal when one is held to the end. None by default."""
        return set()

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        """Concrete parameters for one application (deterministic given ``rng``). Every kind also
        takes ``role``: its targets are then picked among that role's nodes only."""
        if "role" in params:
            return _aimed(Fault.resolve.__func__)(cls, params, nodes, rng)  # type: ignore[attr-defined]
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

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """Measure, right after ``apply`` returned ``done`` and while the fault is held, whether it
        bit. A kind that measures nothing says so (``effect`` None), never that it bit."""
        return Evidence.unmeasured(f"{self.name} measures no evidence of its effect")

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """The action's evidence completed after ``heal`` returned ``done``: ``applied`` (what
        ``evidence`` measured) with what the heal saw (``restored``; a kind may also find only now
        that the fault came to nothing, e.g. a corrupted file gone before the broker read it)."""
        return applied

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
