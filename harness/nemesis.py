"""The nemesis: a seeded schedule of faults applied while the workload runs.

A fault kind is a class registered by a plugin (``brokerchaos_register_faults``)
with a ``name``, the broker ``requires`` capabilities, and three steps:
``resolve`` turns scenario parameters into concrete ones (which nodes, which
links) using the step's own seeded RNG, ``apply`` does it and ``heal`` undoes it.
The concrete parameters are planned before the run starts, so the same seed
gives the same schedule, and a recorded run can be replayed exactly.

Every action goes to the history (process ``nemesis``) with what was actually
done: proxies, toxics, containers, signals, and the evidence the fault measured of its own
effect while held and after its heal (``harness.spec.fault.Evidence``). A fault whose evidence
shows no effect is said in one line as it happens.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import FaultError, NodesDown, ScenarioError
from harness.evidence import fault_line
from harness.history import Recorder
from harness.progress import say
from harness.scenario import Scenario
from harness.spec.broker import BrokerPlugin
from harness.spec.fault import Evidence, Fault, FaultContext
from harness.spec.history import EVIDENCE


@dataclass
class PlannedFault:
    fault_id: str
    at: float
    hold: float | None
    kind: str
    params: dict[str, Any]


@dataclass
class Plan:
    steps: list[PlannedFault] = field(default_factory=list)

    def to_list(self) -> list[dict[str, Any]]:
        return [vars(s) for s in self.steps]


def _fault_class(faults: Mapping[str, type[Fault]], name: str) -> type[Fault]:
    try:
        return faults[name]
    except KeyError:
        raise ScenarioError(
            f"nemesis: unknown fault {name!r}; available: {', '.join(sorted(faults))}"
        ) from None


def check_capabilities(
    scenario: Scenario, faults: Mapping[str, type[Fault]], capabilities: frozenset[str], broker: str
) -> None:
    budget = scenario.budgets.recovery_s
    if isinstance(budget, Mapping):
        unknown = sorted(set(budget) - set(faults))
        if unknown:
            raise ScenarioError(
                f"budgets.recovery_s: {', '.join(map(repr, unknown))} is not a fault kind; "
                f"use one of {', '.join(sorted(faults))}"
            )
    for name in sorted(scenario.nemesis.fault_names):
        missing = _fault_class(faults, name).requires - capabilities
        if missing:
            raise ScenarioError(
                f"nemesis: fault {name!r} needs broker capabilities {sorted(missing)} "
                f"that plugin {broker!r} does not declare"
            )


def check_file_roles(scenario: Scenario, plugin: BrokerPlugin) -> None:
    """A step naming a data file role (``file_role``) names one the broker plugin declares."""
    for step in scenario.nemesis.schedule:
        role = step.params.get("file_role")
        if role is not None and role not in plugin.data_files:
            known = ", ".join(sorted(plugin.data_files)) or "none"
            raise ScenarioError(
                f"nemesis: fault {step.fault!r} at {step.at}s names data file role {role!r}, which "
                f"broker plugin {plugin.name!r} does not declare; its roles: {known}"
            )


def plan(scenario: Scenario, faults: Mapping[str, type[Fault]], nodes: Sequence[str]) -> Plan:
    """The whole schedule, concrete, from the scenario and its seed."""
    out = Plan()
    # A step at or after the end of the workload would hit a cluster with no traffic
    # (e.g. after ``--duration`` shortened a run): it is not part of this run's plan.
    steps: list[tuple[float, float | None, str, Mapping[str, Any], bool]] = [
        (s.at, s.hold, s.fault, s.params, False)
        for s in scenario.nemesis.schedule
        if s.at < scenario.workload.duration
    ]
    rnd = scenario.nemesis.random
    if rnd is not None and (rnd.overlap > 1 or steps):
        # The explicit steps are made concrete first, so the draws can see what they hold.
        steps = [
            (
                at,
                hold,
                kind,
                _fault_class(faults, kind).resolve(
                    params, nodes, random.Random(f"{scenario.seed}:fixed:{j}")
                ),
                True,
            )
            for j, (at, hold, kind, params, _) in enumerate(steps)
        ]
        steps += _overlapping(scenario, faults, nodes, steps)
    elif rnd is not None:
        rng = random.Random(f"{scenario.seed}:schedule")
        t = rng.uniform(*rnd.every)
        while t < scenario.workload.duration:
            held = rng.uniform(*rnd.hold)
            kind = rng.choice(list(rnd.faults))
            steps.append((round(t, 3), round(held, 3), kind, rnd.params.get(kind, {}), False))
            t += held + rng.uniform(*rnd.every)
    steps.sort(key=lambda s: s[0])
    for i, (at, hold, kind, params, concrete) in enumerate(steps, start=1):
        cls = _fault_class(faults, kind)
        if not concrete:
            params = cls.resolve(params, nodes, random.Random(f"{scenario.seed}:fault:{i}"))
        out.steps.append(PlannedFault(f"f{i}", at, hold, kind, dict(params)))
    check_overlaps(out.steps, faults, scenario.workload.duration, nodes)
    return out


def _overlapping(
    scenario: Scenario,
    faults: Mapping[str, type[Fault]],
    nodes: Sequence[str],
    fixed: Sequence[tuple[float, float | None, str, Mapping[str, Any], bool]],
) -> list[tuple[float, float | None, str, Mapping[str, Any], bool]]:
    """Random faults with up to ``overlap`` held at once: a new one starts ``every`` after the
    previous start, not after its heal. A draw that cannot overlap what is held during its
    window (the same resource on the same node, or proxies switched during another network
    fault), scheduled steps that start before it heals included, is replaced by another kind or
    target, else the start waits for the next heal."""
    rnd = scenario.nemesis.random
    assert rnd is not None
    duration = scenario.workload.duration
    rng = random.Random(f"{scenario.seed}:schedule")
    held_steps = [
        PlannedFault(f"step at {at:g}s", at, hold, kind, dict(params)) for at, hold, kind, params, _ in fixed
    ]
    out: list[tuple[float, float | None, str, Mapping[str, Any], bool]] = []
    t = rng.uniform(*rnd.every)
    draw = 0
    while t < duration:
        t = round(t, 3)
        active = [s for s in held_steps if _window(s, duration)[0] <= t < _window(s, duration)[1]]
        if len(active) >= rnd.overlap:
            t = round(min(_window(s, duration)[1] for s in active) + 0.001, 3)  # just after the next heal
            continue
        hold = round(rng.uniform(*rnd.hold), 3)
        # A draw must not conflict with anything held during its own window: what is held now,
        # and the scheduled steps that start before it heals.
        during = [s for s in held_steps if s.at < t + hold and _window(s, duration)[1] > t]
        kinds = list(rnd.faults)
        rng.shuffle(kinds)
        chosen = None
        for attempt in range(3):
            for kind in kinds:
                draw += 1
                params = faults[kind].resolve(
                    rnd.params.get(kind, {}), nodes, random.Random(f"{scenario.seed}:draw:{draw}:{attempt}")
                )
                candidate = PlannedFault("new", round(t, 3), hold, kind, dict(params))
                if all(_conflict(candidate, other, faults, nodes) is None for other in during):
                    chosen = candidate
                    break
            if chosen is not None:
                break
        if chosen is None:  # just after the next heal among what it met
            t = round(min(_window(s, duration)[1] for s in during) + 0.001, 3)
            continue
        held_steps.append(chosen)
        out.append((chosen.at, chosen.hold, chosen.kind, chosen.params, True))
        t += rng.uniform(*rnd.every)
    return out


def _window(s: PlannedFault, duration: float) -> tuple[float, float]:
    return s.at, s.at + (s.hold if s.hold is not None else duration)


def _conflict(
    a: PlannedFault, b: PlannedFault, faults: Mapping[str, type[Fault]], nodes: Sequence[str]
) -> str | None:
    """Why ``a`` and ``b`` cannot be held at the same time, or None."""
    switching = [s for s in (a, b) if faults[s.kind].switches_proxies(s.params)]
    network = all(faults[s.kind].requires & {"partition"} for s in (a, b))
    if switching and network:
        return (
            f"{switching[0].fault_id} switches proxies off and on (mode 'refuse' or shape 'clients'): healing "
            "one would undo the other; use mode 'drop'"
        )
    shared = faults[a.kind].holds(a.params, nodes) & faults[b.kind].holds(b.params, nodes)
    if shared:
        what = ", ".join(f"{r} of {n}" for r, n in sorted(shared))
        return f"both hold {what}: healing one would undo the other"
    return None


def check_overlaps(
    steps: Sequence[PlannedFault], faults: Mapping[str, type[Fault]], duration: float, nodes: Sequence[str]
) -> None:
    """Refuse two faults held at once when their mechanisms cannot overlap, saying why."""
    for i, a in enumerate(steps):
        for b in steps[i + 1 :]:
            (a0, a1), (b0, b1) = _window(a, duration), _window(b, duration)
            if not (a0 < b1 and b0 < a1):
                continue
            why = _conflict(a, b, faults, nodes)
            if why:
                raise ScenarioError(
                    f"nemesis: {a.fault_id} ({a.kind} at {a.at:g}s) and {b.fault_id} ({b.kind} at {b.at:g}s) are held "
                    f"at the same time and {why}; move one or shorten its hold"
                )


def plan_from_history(path: Path) -> Plan:
    """The schedule a stored run actually applied, for ``--replay``."""
    from harness.history import read_jsonl

    out = Plan()
    starts: dict[str, dict[str, Any]] = {}
    for rec in read_jsonl(path):
        if rec["process"] != "nemesis" or rec["type"] != "invoke":
            continue
        value = json.loads(rec["value"]) if rec["value"] else {}
        if rec["f"] == "heal":
            for fid in value.get("fault_ids", []):
                if fid in starts and value.get("scheduled", True):
                    starts[fid]["heal_ns"] = rec["time_ns"]
        elif "fault_id" in value:
            starts[value["fault_id"]] = {"rec": rec, "value": value}
    for fid, s in starts.items():
        t = s["rec"]["time_ns"] / 1e9
        hold = (s["heal_ns"] / 1e9 - t) if "heal_ns" in s else None
        out.steps.append(
            PlannedFault(
                fid,
                round(t - s["value"].get("workload_start_s", 0.0), 3),
                None if hold is None else round(hold, 3),
                s["value"]["kind"],
                s["value"]["params"],
            )
        )
    out.steps.sort(key=lambda p: p.at)
    return out


async def _measure(fn: Any) -> Evidence:
    """A fault's evidence, measured off the event loop; a measurement that raises is recorded as
    not measured (with why), never as an effect."""
    try:
        return await asyncio.to_thread(fn)
    except Exception as exc:  # noqa: BLE001 - the fault itself happened: only its proof failed
        return Evidence.unmeasured(f"measuring its effect failed: {type(exc).__name__}: {exc}")


def _say_evidence(fid: str, kind: str, node: Any, evidence: Evidence) -> None:
    if evidence.effect is False:
        say("nemesis", fault_line(fid, kind, node if isinstance(node, str) else None, evidence.summary))
    else:
        say("nemesis", f"{fid} evidence: {evidence.summary}")
    for flag in evidence.flags:
        say("nemesis", f"{fid} {kind}: {flag}")


@dataclass(eq=False)
class Nemesis:
    """Runs a plan against a cluster, recording every action, and heals everything at the end."""

    plan: Plan
    faults: Mapping[str, type[Fault]]
    ctx: FaultContext
    recorder: Recorder
    _: KW_ONLY
    settle: float
    final_heal: Any
    on_fault: Any = None
    #: The nodes clients work through (``Run.client_nodes``): the final heal records which came back.
    serving: Sequence[str] = ()
    #: The cluster's nodes, as the plan was resolved against (what ``cuts_off`` and
    #: ``heal_needs_links`` are asked about).
    nodes: Sequence[str] = ()
    active: dict[str, Fault] = field(default_factory=dict, init=False)
    #: Faults whose heal is running: still held until it returns.
    healing: dict[str, Fault] = field(default_factory=dict, init=False)
    #: Notified at the end of each heal, for the heals that wait for others (``_cut_off_by``).
    healed: asyncio.Condition = field(default_factory=asyncio.Condition, init=False)
    #: The nodes the final heal could not bring back, each with why (``NodesDown``).
    down: dict[str, str] = field(default_factory=dict, init=False)
    #: What each held fault measured when applied, completed by its heal.
    evidence: dict[str, Evidence] = field(default_factory=dict, init=False)
    #: Applied faults whose evidence is still being measured (``_measure_applied``).
    measuring: dict[str, asyncio.Task[None]] = field(default_factory=dict, init=False)
    start_ns: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.on_fault = self.on_fault or (lambda op: None)

    async def __call__(self, duration: float) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        self.start_ns = self.recorder.now_ns()
        heals: list[tuple[float, str]] = []
        try:
            for step in self.plan.steps:
                await self._heal_due(heals, t0, until=step.at)
                await asyncio.sleep(max(0.0, t0 + step.at - loop.time()))
                await self._apply(step)
                if step.hold is not None:
                    heals.append((step.at + step.hold, step.fault_id))
            await self._heal_due(heals, t0, until=duration)
            await asyncio.sleep(max(0.0, t0 + duration - loop.time()))
        finally:
            await self._final_heal()
        if self.settle:
            say("heal", f"settling {self.settle:.0f}s before the drain")
            await asyncio.sleep(self.settle)

    async def _heal_due(self, heals: list[tuple[float, str]], t0: float, until: float) -> None:
        """Heal every fault due by ``until``, each at its own time, and return once all are healed
        (the next fault is applied after them). A heal still running when the next one is due does
        not hold that one back: a heal may wait for what another held fault prevents (a node joining
        a cluster whose members a partition keeps paused waits for the partition's heal)."""
        loop = asyncio.get_running_loop()
        heals.sort()
        running: list[asyncio.Task[None]] = []
        try:
            while heals and heals[0][0] <= until:
                at, fid = heals.pop(0)
                await asyncio.sleep(max(0.0, t0 + at - loop.time()))
                blockers = self._cut_off_by(fid)
                later = [a for a, other in heals if other in blockers]
                if len(later) < len(set(blockers) - set(self.healing)):  # one is held to the end
                    say(
                        "nemesis",
                        f"{fid}: heal left to the final heal ({', '.join(blockers)} held to the end)",
                    )
                    continue
                until = max([until, *later])  # the next fault waits for this heal, as for any other
                running.append(asyncio.create_task(self._heal(fid, after=blockers)))
            await asyncio.gather(*running)
        except BaseException:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise

    async def _apply(self, step: PlannedFault) -> None:
        cls = self.faults[step.kind]
        fault = cls(self.ctx, step.params, step.fault_id)
        value = {
            "fault_id": step.fault_id,
            "kind": step.kind,
            "params": step.params,
            "workload_start_s": self.start_ns / 1e9,
            "hold": step.hold,
        }
        inv = self.recorder.invoke("nemesis", step.kind, node=step.params.get("node"), value=value)
        say("nemesis", f"{step.fault_id} {step.kind} {json.dumps(step.params, sort_keys=True)}")
        try:
            done = await asyncio.to_thread(fault.apply)
        except Exception as exc:  # noqa: BLE001 - a failed fault is recorded, then healed
            op = inv.info(f"{type(exc).__name__}: {exc}", {**value, "error": str(exc)})
            self.active[step.fault_id] = fault
            self.on_fault(op)
            return
        self.active[step.fault_id] = fault
        self.measuring[step.fault_id] = asyncio.create_task(self._measure_applied(step, fault, done, inv))

    async def _measure_applied(self, step: PlannedFault, fault: Fault, done: Any, inv: Any) -> None:
        """What a fault measured of its effect once applied, recorded on its ``ok``. It runs beside
        the schedule: the next fault is applied at its planned time, not once this measurement
        (seconds on a loaded machine) is over; the fault's own heal waits for it."""
        started = asyncio.get_running_loop().time()
        evidence = await _measure(lambda: fault.evidence(done))
        took = round(asyncio.get_running_loop().time() - started, 3)
        self.evidence[step.fault_id] = evidence
        _say_evidence(step.fault_id, step.kind, step.params.get("node"), evidence)
        self.on_fault(inv.ok({**inv.value, "done": done, EVIDENCE: evidence.as_dict(), "evidence_s": took}))

    def _cut_off_by(self, fid: str) -> list[str]:
        """The other held faults that cut off a node ``fid``'s heal needs to reach (``heal_needs_links``)."""
        fault = self.active.get(fid) or self.healing.get(fid)
        if fault is None:
            return []
        needs = type(fault).heal_needs_links(fault.params, self.nodes)
        held = {**self.active, **self.healing}
        return [
            f
            for f, other in held.items()
            if f != fid and needs & type(other).cuts_off(other.params, self.nodes)
        ]

    async def _heal(self, fid: str, *, scheduled: bool = True, after: Sequence[str] = ()) -> None:
        """Heal ``fid`` once the faults ``after`` names are healed (a join waits for the cuts it needs
        gone), then tell the heals that wait for it."""
        if after:
            say("nemesis", f"{fid}: heal waits for {', '.join(after)}, which cut off nodes it needs")
            async with self.healed:
                await self.healed.wait_for(lambda: not set(after) & {*self.active, *self.healing})
        fault = self.active.pop(fid, None)
        if fault is None:
            return
        self.healing[fid] = fault
        try:
            await self._heal_held(fid, fault, scheduled, after)
        finally:
            del self.healing[fid]
            async with self.healed:
                self.healed.notify_all()

    async def _heal_held(self, fid: str, fault: Fault, scheduled: bool, after: Sequence[str]) -> None:
        measuring = self.measuring.pop(fid, None)
        if measuring is not None:  # the heal undoes what the measurement is looking at: it goes first
            await measuring
        value: dict[str, Any] = {"fault_ids": [fid], "kind": "heal", "scheduled": scheduled}
        if after:
            value["after"] = list(after)
        inv = self.recorder.invoke("nemesis", "heal", value=value)
        try:
            done = await asyncio.to_thread(fault.heal)
        except Exception as exc:  # noqa: BLE001
            say("nemesis", f"healed {fid}")
            self.on_fault(inv.info(f"{type(exc).__name__}: {exc}"))
            return
        say("nemesis", f"healed {fid}")
        applied = self.evidence.pop(fid, None)
        if applied is None:  # its apply failed: nothing was measured to complete
            self.on_fault(inv.ok({**value, "done": done}))
            return
        evidence = await _measure(lambda: fault.heal_evidence(done, applied))
        if evidence.effect is False and applied.effect is not False:
            _say_evidence(fid, fault.name, fault.params.get("node"), evidence)
        else:  # what only the whole hold shows (bytes that crossed a cut while it was held)
            for flag in (f for f in evidence.flags if f not in applied.flags):
                say("nemesis", f"{fid} {fault.name}: {flag}")
        if evidence.restored is False:
            say("nemesis", f"{fid} {fault.name}: still in effect after its heal ({evidence.summary})")
        self.on_fault(inv.ok({**value, "done": done, EVIDENCE: evidence.as_dict()}))

    async def _final_heal(self) -> None:
        """Heal everything. Nodes it cannot bring back (``NodesDown``) are the run's outcome for
        them, recorded under ``down`` with the nodes left to serve clients (``serving``), and the
        run goes on to its drain; any other failure ends the run."""
        pending = list(self.active)
        while pending:  # a fault whose heal needs links others cut off comes after them
            fid = next((f for f in pending if not set(self._cut_off_by(f)) & set(pending)), pending[0])
            pending.remove(fid)
            await self._heal(fid, scheduled=False)
        value = {"fault_ids": [], "kind": "heal", "final": True}
        inv = self.recorder.invoke("nemesis", "heal", value=value)
        try:
            done = await asyncio.to_thread(self.final_heal)
        except NodesDown as exc:
            self.down.update(exc.nodes)
            up = [n for n in self.serving if n not in exc.nodes]
            for node, why in exc.nodes.items():
                say("heal", f"{node} did not come back: {why.splitlines()[0]}")
            down = {**value, "done": exc.done, "down": exc.nodes, "serving": up}
            self.on_fault(inv.info(f"did not come back: {', '.join(exc.nodes)}", down))
            return
        except Exception as exc:  # noqa: BLE001
            self.on_fault(inv.info(f"final heal failed: {type(exc).__name__}: {exc}"))
            raise FaultError(f"final heal failed: {exc}") from exc
        self.on_fault(inv.ok({**value, "done": done}))
