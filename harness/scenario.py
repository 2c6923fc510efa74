"""Scenarios: a chaos test as data (Jepsen's test map), loaded from YAML or TOML.

    name: partitions
    seed: 7
    broker: {plugin: reference, nodes: 3, settings: {flush: sync}}   # version: "4.3" for a plugin with versions
    workload:
      producers: 2
      consumers: 2
      rate: 200
      duration: 60
      consumer: {requeue: 0.05, recover_every: 10, close_every: 15, crash_every: 20, slow: 1, slow_ack_ms: 200}
    nemesis:
      schedule:                       # explicit steps, times in seconds from workload start ...
        - {at: 10, fault: partition, params: {shape: isolate}, hold: 10}
      random: {every: [10, 20], hold: [5, 15], faults: [partition, kill], overlap: 2}   # ... and/or drawn
                                      # from the seed; overlap: up to 2 held at once
    checkers: [python]
    budgets: {duplicated: 100, resurrected: null, recovery_s: 30}   # null: no limit; recovery_s
                                      # also per fault kind: {partition: 30, kill: 60}

Every error names the field (``workload.rate``) and what is allowed; the file is
never half-loaded.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from harness.spec.errors import ScenarioError
from harness.spec.fault import FILESYSTEM_MODELS
from harness.spec.scenario import (
    BrokerSection,
    Budgets,
    ConsumerSection,
    DelaySection,
    NemesisSection,
    RandomSchedule,
    Scenario,
    Step,
    TransactionsSection,
    WorkloadSection,
)
from harness.spec.validate import boolean, integer, mapping, nonempty_str, number, only, seconds_range

__all__ = [
    "BrokerSection",
    "Budgets",
    "ConsumerSection",
    "DelaySection",
    "NemesisSection",
    "RandomSchedule",
    "Scenario",
    "Step",
    "TransactionsSection",
    "WorkloadSection",
    "build",
    "from_dict",
    "load",
    "with_overrides",
]


# -- loading -----------------------------------------------------------------------------


def load(path: str | Path) -> Scenario:
    p = Path(path)
    if p.suffix not in (".yaml", ".yml", ".json", ".toml") and p.is_file():
        raise ScenarioError(f"{p}: scenario files end in .yaml, .yml or .toml")
    data = read_file(p, "scenario", "ready ones are in scenarios/")
    return from_dict(data, source=str(p), default_name=p.stem)


def read_file(p: Path, what: str, where_ready: str) -> Any:
    """A scenario's or a matrix's file parsed (TOML by its ending, else YAML, which reads JSON too),
    or one line that says what is wrong with it."""
    if not p.is_file():
        raise ScenarioError(f"{what} file {str(p)!r} does not exist ({where_ready})")
    text = p.read_text(encoding="utf-8")
    try:
        return tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        kind = p.suffix.lstrip(".").upper() if p.suffix in (".toml", ".yml", ".json") else "YAML"
        raise ScenarioError(f"{p}: not valid {kind}: {first}") from None


def from_dict(data: Any, *, source: str | None = None, default_name: str = "scenario") -> Scenario:
    where = f"{source}: " if source else ""
    try:
        return _build(data, default_name, source)
    except ScenarioError as exc:
        raise ScenarioError(f"{where}{exc}") from None


def _build(data: Any, default_name: str, source: str | None) -> Scenario:
    top = mapping(data, "scenario")
    only(top, "", {"name", "seed", "broker", "workload", "nemesis", "checkers", "budgets", "source"})
    return Scenario(
        name=nonempty_str(top.get("name", default_name), "name"),
        broker=_broker(top.get("broker")),
        workload=_workload(top.get("workload", {})),
        nemesis=_nemesis(top.get("nemesis", {})),
        seed=integer(top.get("seed", 0), "seed", lo=0),
        checkers=_checkers(top.get("checkers", [])),
        budgets=_budgets(top.get("budgets", {})),
        source=source,
    )


def _broker(raw: Any) -> BrokerSection:
    b = mapping(raw, "broker", required=True)
    only(b, "broker", {"plugin", "version", "nodes", "settings", "lazyfs", "filesystem"})
    return BrokerSection(
        plugin=nonempty_str(b.get("plugin"), "broker.plugin", required=True),
        version=_version(b.get("version")),
        nodes=integer(b.get("nodes", 3), "broker.nodes", lo=1, hi=9),
        settings=dict(mapping(b.get("settings", {}), "broker.settings")),
        lazyfs=boolean(b.get("lazyfs", False), "broker.lazyfs"),
        filesystem=_filesystem(b.get("filesystem")),
    )


def _workload(raw: Any) -> WorkloadSection:
    w = mapping(raw, "workload")
    defaults = WorkloadSection()
    only(w, "workload", set(asdict(defaults)))
    workload = WorkloadSection(
        producers=integer(w.get("producers", defaults.producers), "workload.producers", lo=0, hi=256),
        consumers=integer(w.get("consumers", defaults.consumers), "workload.consumers", lo=0, hi=256),
        readers=integer(w.get("readers", defaults.readers), "workload.readers", lo=0, hi=64),
        queues=integer(w.get("queues", defaults.queues), "workload.queues", lo=1, hi=1000),
        rate=number(w.get("rate", defaults.rate), "workload.rate", lo=0),
        message_size=integer(
            w.get("message_size", defaults.message_size), "workload.message_size", lo=16, hi=64 << 20
        ),
        duration=number(w.get("duration", defaults.duration), "workload.duration", lo=0.1),
        persistent=boolean(w.get("persistent", defaults.persistent), "workload.persistent"),
        prefetch=integer(w.get("prefetch", defaults.prefetch), "workload.prefetch", lo=0, hi=65535),
        in_flight=integer(w.get("in_flight", defaults.in_flight), "workload.in_flight", lo=1, hi=100_000),
        confirm_timeout=number(
            w.get("confirm_timeout", defaults.confirm_timeout), "workload.confirm_timeout", lo=0.1
        ),
        drain_timeout=number(w.get("drain_timeout", defaults.drain_timeout), "workload.drain_timeout", lo=1),
        drain_idle=number(w.get("drain_idle", defaults.drain_idle), "workload.drain_idle", lo=0.1),
        queue_prefix=nonempty_str(w.get("queue_prefix", defaults.queue_prefix), "workload.queue_prefix"),
    )
    return dataclasses.replace(
        workload,
        consumer=_consumer(w.get("consumer", {}), workload.consumers),
        delay=_delay(w.get("delay")),
        transactions=_transactions(w.get("transactions")),
        **_dead_lettering(w),
    )


def _nemesis(raw: Any) -> NemesisSection:
    n = mapping(raw, "nemesis")
    only(n, "nemesis", {"schedule", "random", "settle"})
    raw_steps = n.get("schedule", [])
    if not isinstance(raw_steps, list):
        raise ScenarioError(
            "nemesis.schedule: expected a list of steps like {at: 10, fault: partition, hold: 10}"
        )
    steps = [_step(raw_step, f"nemesis.schedule[{i}]") for i, raw_step in enumerate(raw_steps)]
    return NemesisSection(
        schedule=tuple(sorted(steps, key=lambda s: s.at)),
        # ``to_dict()`` writes ``random: null`` when there is none
        random=None if n.get("random") is None else _random(n["random"]),
        settle=number(n.get("settle", 5.0), "nemesis.settle", lo=0),
    )


def _step(raw: Any, where: str) -> Step:
    s = mapping(raw, where)
    only(s, where, {"at", "fault", "hold", "params"})
    hold = s.get("hold")
    return Step(
        at=number(s.get("at"), f"{where}.at", lo=0, required=True),
        fault=nonempty_str(s.get("fault"), f"{where}.fault", required=True),
        hold=None if hold is None else number(hold, f"{where}.hold", lo=0),
        params=dict(mapping(s.get("params", {}), f"{where}.params")),
    )


def _random(raw: Any) -> RandomSchedule:
    r = mapping(raw, "nemesis.random")
    only(r, "nemesis.random", {"faults", "every", "hold", "params", "overlap"})
    faults = r.get("faults")
    if not isinstance(faults, list) or not faults or not all(isinstance(x, str) for x in faults):
        raise ScenarioError("nemesis.random.faults: expected a non-empty list of fault names")
    return RandomSchedule(
        faults=tuple(faults),
        every=seconds_range(r.get("every", [10, 20]), "nemesis.random.every", positive=True),
        hold=seconds_range(r.get("hold", [5, 15]), "nemesis.random.hold"),
        params={
            k: dict(mapping(v, f"nemesis.random.params.{k}"))
            for k, v in mapping(r.get("params", {}), "nemesis.random.params").items()
        },
        overlap=integer(r.get("overlap", 1), "nemesis.random.overlap", lo=1, hi=16),
    )


def _checkers(checkers: Any) -> tuple[str, ...]:
    if isinstance(checkers, str):
        checkers = [checkers]
    if not isinstance(checkers, list) or not all(isinstance(c, str) for c in checkers):  # empty: the defaults
        raise ScenarioError("checkers: expected a list of checker names, e.g. [python] or [spark]")
    return tuple(checkers)


def _budgets(raw: Any) -> Budgets:
    bud = mapping(raw, "budgets")
    only(bud, "budgets", {"duplicated", "resurrected", "recovery_s"})
    return Budgets(
        **{
            k: None if bud.get(k) is None else integer(bud[k], f"budgets.{k}", lo=0)
            for k in ("duplicated", "resurrected")
        },
        recovery_s=_recovery_budget(bud.get("recovery_s")),
    )


def _recovery_budget(v: Any) -> float | dict[str, float] | None:
    """Seconds, or {fault kind: seconds}; each above 0."""
    if v is None:
        return None
    if isinstance(v, Mapping):
        if not v:
            raise ScenarioError(
                "budgets.recovery_s: an empty mapping; give seconds, or {fault kind: seconds}"
            )
        return {str(k): _seconds_above_0(x, f"budgets.recovery_s.{k}") for k, x in v.items()}
    return _seconds_above_0(v, "budgets.recovery_s")


def _seconds_above_0(v: Any, where: str) -> float:
    x = number(v, where, lo=0)
    if x == 0:
        raise ScenarioError(f"{where}: 0 is out of range; allowed: seconds > 0 (or null: no limit)")
    return x


def _consumer(data: Any, consumers: int) -> ConsumerSection:
    c = mapping(data, "workload.consumer")
    defaults = ConsumerSection()
    only(c, "workload.consumer", set(asdict(defaults)))
    every = {}
    for key in ("recover_every", "close_every", "crash_every"):
        v = number(c.get(key, getattr(defaults, key)), f"workload.consumer.{key}", lo=0)
        if 0 < v < 0.1:  # each action holds deliveries first; shorter gaps would do nothing else
            raise ScenarioError(f"workload.consumer.{key}: {v} is out of range; allowed 0 (never) or >= 0.1")
        every[key] = v
    requeue = number(c.get("requeue", defaults.requeue), "workload.consumer.requeue", lo=0)
    if requeue > 1:
        raise ScenarioError(
            f"workload.consumer.requeue: {requeue} is out of range; allowed from 0 to 1 "
            "(a probability per delivery)"
        )
    slow = integer(c.get("slow", defaults.slow), "workload.consumer.slow", lo=0)
    if slow > consumers:
        raise ScenarioError(f"workload.consumer.slow: {slow} is more than workload.consumers ({consumers})")
    return ConsumerSection(
        requeue=requeue,
        slow=slow,
        slow_ack_ms=integer(
            c.get("slow_ack_ms", defaults.slow_ack_ms), "workload.consumer.slow_ack_ms", lo=0, hi=60_000
        ),
        **every,
    )


def _delay(data: Any) -> DelaySection | None:
    if data is None:  # absent, or ``to_dict()``'s ``delay: null``
        return None
    d = mapping(data, "workload.delay")
    defaults = DelaySection()
    only(d, "workload.delay", set(asdict(defaults)))
    share = number(d.get("share", defaults.share), "workload.delay.share", lo=0)
    if share > 1:
        raise ScenarioError(
            f"workload.delay.share: {share} is out of range; allowed from 0 to 1 "
            "(the probability that a publish is delayed)"
        )
    max_delay = 2**32 - 1  # the delayed-message exchange's own bound
    lo = integer(d.get("min_ms", defaults.min_ms), "workload.delay.min_ms", lo=1, hi=max_delay)
    hi = integer(d.get("max_ms", defaults.max_ms), "workload.delay.max_ms", lo=1, hi=max_delay)
    if lo > hi:
        raise ScenarioError(f"workload.delay.min_ms: {lo} is greater than workload.delay.max_ms ({hi})")
    return DelaySection(
        share=share,
        min_ms=lo,
        max_ms=hi,
        late_ms=integer(d.get("late_ms", defaults.late_ms), "workload.delay.late_ms", lo=0),
    )


def _transactions(data: Any) -> TransactionsSection | None:
    if data is None:  # ``to_dict()`` writes ``transactions: null`` when there are none
        return None
    t = mapping(data, "workload.transactions")
    defaults = TransactionsSection()
    only(t, "workload.transactions", set(asdict(defaults)))
    publish = integer(t.get("publish_batch", 0), "workload.transactions.publish_batch", lo=0, hi=10_000)
    ack = integer(t.get("ack_batch", 0), "workload.transactions.ack_batch", lo=0, hi=10_000)
    rollback = number(t.get("rollback", 0.0), "workload.transactions.rollback", lo=0)
    if rollback > 1:
        raise ScenarioError(
            f"workload.transactions.rollback: {rollback} is out of range; allowed from 0 to 1 "
            "(a probability per transaction)"
        )
    if not publish and not ack:
        raise ScenarioError(
            "workload.transactions: set publish_batch (messages per producer transaction) "
            "and/or ack_batch (acks per consumer transaction) to 1 or more"
        )
    return TransactionsSection(publish_batch=publish, ack_batch=ack, rollback=rollback)


#: The longest TTL AMQP carries (RabbitMQ's bound for ``x-message-ttl`` and ``expiration``).
MAX_TTL_MS = 2**32 - 1


def _dead_lettering(w: Mapping[str, Any]) -> dict[str, Any]:
    """``ttl_ms``, ``expiration_ms`` and ``dead_letter``. A TTL without dead-lettering is refused:
    an expired message would be dropped by design, and the checkers could not tell it from a loss."""
    out: dict[str, Any] = {"dead_letter": boolean(w.get("dead_letter", False), "workload.dead_letter")}
    for key in ("ttl_ms", "expiration_ms"):
        v = w.get(key)
        out[key] = None if v is None else integer(v, f"workload.{key}", lo=1, hi=MAX_TTL_MS)
        if out[key] is not None and not out["dead_letter"]:
            raise ScenarioError(
                f"workload.{key}: needs workload.dead_letter: true (an expired message is otherwise "
                "dropped, and the checkers cannot tell it from a lost one)"
            )
    return out


def with_overrides(sc: Scenario, *, seed: int | None = None, duration: float | None = None) -> Scenario:
    """Command-line overrides, held to the same rules as the file (a stored run must reload)."""
    if seed is not None:
        sc = dataclasses.replace(sc, seed=integer(seed, "seed", lo=0))
    if duration is not None:
        duration = number(duration, "workload.duration", lo=0.1)
        sc = dataclasses.replace(sc, workload=dataclasses.replace(sc.workload, duration=duration))
    return sc


# -- the broker section's own fields (the common checks are in harness.spec.validate) -------


def _version(v: Any) -> str | None:
    """A broker version as written: ``"4.3"``; a number is taken as its text (YAML reads 4.3 as
    one, and 3.10 as 3.1, so the plugin's error for an unknown version says to quote it)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (str, int, float)) or not str(v):
        raise ScenarioError(f'broker.version: expected a version such as "4.3", got {v!r}')
    return str(v)


def _filesystem(v: Any) -> str | None:
    if v is None:
        return None
    if v not in FILESYSTEM_MODELS:
        raise ScenarioError(f"broker.filesystem: expected one of {', '.join(FILESYSTEM_MODELS)}, got {v!r}")
    return str(v)


def build(
    scenario: str | Path | Mapping[str, Any] | Scenario,
    *,
    broker: str | None = None,
    version: str | None = None,
    seed: int | None = None,
    duration: float | None = None,
    nodes: int | None = None,
    settings: Mapping[str, Any] | None = None,
    workload: Mapping[str, Any] | None = None,
    nemesis: Mapping[str, Any] | None = None,
    checkers: list[str] | tuple[str, ...] | None = None,
    name: str | None = None,
    lazyfs: bool | None = None,
    root: Path | None = None,
) -> Scenario:
    """A scenario from a file, a dict or a ``Scenario``, with overrides held to the file's rules.

    ``workload`` is merged into the scenario's; ``nemesis`` replaces it. Changing the
    broker drops the scenario's broker settings and version (they belong to the other plugin)
    unless ``settings`` (``version``) are given.
    """
    source: str | None
    if isinstance(scenario, Scenario):
        data, source = scenario.to_dict(), scenario.source
    elif isinstance(scenario, Mapping):
        data, source = dict(scenario), None
    else:
        path = Path(scenario)
        if not path.is_absolute() and not path.exists() and root is not None and (root / path).exists():
            path = root / path
        loaded = load(path)
        data, source = loaded.to_dict(), loaded.source
    data.pop("source", None)
    b = dict(data.get("broker") or {})
    if broker is not None and broker != b.get("plugin"):
        b["plugin"] = broker
        b["settings"] = {}
        b.pop("version", None)
    if version is not None:
        b["version"] = version
    if nodes is not None:
        b["nodes"] = nodes
    if settings is not None:
        b["settings"] = {**(b.get("settings") or {}), **settings}
    if lazyfs is not None:
        b["lazyfs"] = lazyfs
    data["broker"] = b
    if workload:
        data["workload"] = {**(data.get("workload") or {}), **workload}
    if nemesis is not None:
        data["nemesis"] = dict(nemesis)
    if checkers is not None:
        data["checkers"] = list(checkers)
    if name is not None:
        data["name"] = name
    sc = from_dict(data, source=source, default_name=data.get("name") or "scenario")
    return with_overrides(sc, seed=seed, duration=duration)
