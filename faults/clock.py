"""Clock faults: a node's broker reads a wrong wall clock, while the host's clock stays right.

Containers share the host kernel's clock, so setting it (``date -s``) would move every node
and the harness too. Instead each broker process runs with libfaketime preloaded (the
``faketime`` host feature, ``harness.cluster.FAKETIME_ENV``), which adds the offset written in
one control file (``FAKETIME_FILE``, e.g. ``+12.5`` or ``-300``: seconds) to every wall-clock
read: ``time()``, ``gettimeofday()`` and ``clock_gettime(CLOCK_REALTIME)``. CLOCK_MONOTONIC is
left alone, as under a real clock error (an NTP step never moves it). The broker re-reads the
file at most once a second, so a change reaches it within a second.

Only runtimes that read the clock through libc see the offset: the kinds ``require`` the
``clock`` capability, which a broker plugin declares when its runtime does (the reference
broker's CPython does; a Go binary reads the clock through the vDSO without libc and does not).

Kinds (after Jepsen's clock nemesis):

``clock-skew``
    the node's clock is off by ``offset`` seconds for the fault's window; heal sets it right.
``clock-bump``
    the clock jumps by ``delta`` seconds (added to whatever offset it has) and stays there:
    a bump is a jump, not a window; ``clock-reset`` or the final heal sets it right.
``clock-strobe``
    the clock flips between offsets ``a`` and ``b`` every ``period`` seconds for ``duration``
    seconds (a loop inside the node's container, so no harness round trip paces it), then
    returns to the true time; heal stops it early.
``clock-reset``
    the clocks of ``node`` (or of every node) are set right.
"""

from __future__ import annotations

import json
import random
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any

from harness import FaultError, ScenarioError, short_error
from harness.spec import ConformanceProbe, Evidence, Fault, FaultContext, combine_evidence
from harness.spec.fault import FAKETIME_FILE

STROBE_PID = FAKETIME_FILE + ".strobe.pid"
#: Seconds between two changes a broker is sure to see (libfaketime's FAKETIME_CACHE_DURATION).
MIN_PERIOD = 1.0


def offset_text(seconds: float) -> str:
    """The control file's form of an offset: sign, seconds, at most millisecond precision."""
    value = round(float(seconds), 3)
    text = f"{value:+.3f}".rstrip("0").rstrip(".")
    return "+0" if text in ("+", "-", "+0", "-0") else text


def _node(params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random, kind: str) -> str:
    node = params.get("node") or rng.choice(list(nodes))
    if node not in nodes:
        raise ScenarioError(f"{kind}: node {node!r} is not one of {list(nodes)}")
    return str(node)


def _seconds(params: Mapping[str, Any], key: str, rng: random.Random, low: float, high: float) -> float:
    """A scenario's value, or a seeded draw of either sign between ``low`` and ``high`` seconds."""
    if key in params:
        return round(float(params[key]), 3)
    return round(rng.choice((-1, 1)) * rng.uniform(low, high), 3)


def _exec(ctx: FaultContext, node: str, script: str) -> str:
    rc, out = ctx.cluster.nodes[node].exec(["sh", "-c", script], timeout=15)
    if rc != 0:
        raise FaultError(f"{node}: clock control failed (exit {rc}): {out.strip()[-300:]}")
    return out.strip()


def write_offset(ctx: FaultContext, node: str, seconds: float) -> dict[str, Any]:
    """Replace the node's offset (atomically: the broker never reads a half-written file)."""
    text = offset_text(seconds)
    f = shlex.quote(FAKETIME_FILE)
    _exec(ctx, node, f"printf '%s\\n' {shlex.quote(text)} > {f}.tmp && mv {f}.tmp {f}")
    return {"node": node, "file": FAKETIME_FILE, "offset": text}


def read_offset(ctx: FaultContext, node: str) -> float:
    text = _exec(ctx, node, f"cat {shlex.quote(FAKETIME_FILE)}")
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        raise FaultError(f"{node}: the clock control file holds {text!r}, not an offset") from None


def stop_strobe(ctx: FaultContext, node: str) -> str | None:
    """Stop a strobe loop on the node, if one runs; returns its pid."""
    p = shlex.quote(STROBE_PID)
    out = _exec(
        ctx, node, f"if [ -f {p} ]; then pid=$(cat {p}); kill $pid 2>/dev/null; rm -f {p}; echo $pid; fi"
    )
    return out or None


#: Seconds within which a measured offset counts as the configured one (or as none).
TOLERANCE_S = 0.25


def measure_clock(ctx: FaultContext, node: str) -> dict[str, Any]:
    """The offset a libc reader with the broker's clock environment sees inside ``node``, and which
    broker processes load the fake clock at all (``faults.node.clockread``)."""
    rc, out = ctx.cluster.nodes[node].exec(["python3", "-m", "faults.node.clockread"], timeout=60)
    try:
        reply = dict(json.loads(out.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        raise FaultError(f"{node}: measuring the clock failed (exit {rc}): {out.strip()[-300:]}") from None
    if not reply.get("ok"):
        raise FaultError(f"{node}: measuring the clock failed: {reply.get('error')}")
    return reply


def clock_evidence(node: str, expected: Sequence[float], reading: Mapping[str, Any]) -> Evidence:
    """Whether the clock inside ``node`` reads one of the ``expected`` non-zero offsets."""
    off = float(reading["offset_s"])
    pids = dict(reading.get("pids") or {})
    facts = {
        "node": node,
        "configured_s": list(expected),
        "measured_s": off,
        "samples": reading.get("samples"),
        "fake_clock_loaded": pids,
    }
    unloaded = sorted(p for p, loaded in pids.items() if not loaded)
    flags: list[str] = [
        f"{node}: broker process(es) {', '.join(unloaded)} do not load the fake clock"
    ] * bool(unloaded)
    if not pids or len(unloaded) == len(pids):
        return Evidence.none(
            f"no broker process on {node} loads the fake clock: the offset reaches nothing", facts
        )
    wanted = ", ".join(f"{e:+.3f}" for e in expected)
    if abs(off) < TOLERANCE_S:
        return Evidence.none(
            f"the clock inside {node} reads true time ({off:+.3f} s; configured {wanted} s)", facts
        )
    if all(abs(off - e) > TOLERANCE_S for e in expected):
        flags.append(f"{node}: measured {off:+.3f} s, configured {wanted} s")
    return Evidence.bit(
        f"the clock inside {node} reads {off:+.3f} s off (configured {wanted} s)", facts, flags=tuple(flags)
    )


def clock_restored(ctx: FaultContext, node: str, applied: Evidence) -> Evidence:
    """After a heal that sets the clock right: does it read true time again?"""
    off = float(measure_clock(ctx, node)["offset_s"])
    ok = abs(off) < TOLERANCE_S
    facts = {**applied.facts, "measured_after_s": off}
    summary = f"{applied.summary}; {'true time' if ok else f'{off:+.3f} s off'} after the heal"
    return applied.with_heal(summary, facts, ok)


class _ClockFault(Fault):
    """Every clock kind writes the same control files: one final heal sets every clock right."""

    requires = frozenset({"clock"})
    needs = frozenset({"faketime"})
    touches = frozenset({"clock"})

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        if not getattr(ctx.cluster.topology, "faketime", False):
            return None  # no fake clock in this run: nothing can be off
        done: dict[str, Any] = {}
        failed = {}
        for name, node in ctx.cluster.nodes.items():
            if not node.running():
                failed[name] = "broker container not running"
                continue
            try:
                strobe = stop_strobe(ctx, name)
                done[name] = {
                    **write_offset(ctx, name, 0.0),
                    **({"stopped_strobe": strobe} if strobe else {}),
                }
            except FaultError as exc:
                failed[name] = short_error(exc)
        if failed:
            raise FaultError(f"could not set the clocks right on {failed}")
        return done


class ClockSkew(_ClockFault):
    """The broker's wall clock runs ``offset`` seconds off (default: seeded, 1 to 60 s either way) until heal."""

    name = "clock-skew"
    params_schema = {"node": str, "offset": float}
    conformance = ConformanceProbe(params={"node": "n1", "offset": 30.0})

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        return {"node": _node(params, nodes, rng, cls.name), "offset": _seconds(params, "offset", rng, 1, 60)}

    def apply(self) -> dict[str, Any]:
        return {"set": write_offset(self.ctx, self.params["node"], self.params["offset"])}

    def heal(self) -> dict[str, Any]:
        return {"set": write_offset(self.ctx, self.params["node"], 0.0)}

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """The offset measured inside the node (``faults.node.clockread``): a process started with
        the broker's own clock environment reads the clock between two true reads, and
        ``/proc/PID/maps`` says which broker processes load the fake clock. No effect: the clock
        reads true time, or no broker process loads the fake clock."""
        time.sleep(MIN_PERIOD)  # what a running broker reads is at most this old
        node = self.params["node"]
        return clock_evidence(node, [self.params["offset"]], measure_clock(self.ctx, node))

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """The clock measured again: true time."""
        return clock_restored(self.ctx, self.params["node"], applied)


class ClockBump(_ClockFault):
    """The broker's wall clock jumps by ``delta`` seconds (default: seeded, 1 to 30 s either way); it stays there until ``clock-reset`` or the final heal."""

    name = "clock-bump"
    params_schema = {"node": str, "delta": float}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        return {"node": _node(params, nodes, rng, cls.name), "delta": _seconds(params, "delta", rng, 1, 30)}

    def apply(self) -> dict[str, Any]:
        node = self.params["node"]
        before = read_offset(self.ctx, node)
        return {
            "before": offset_text(before),
            "set": write_offset(self.ctx, node, before + self.params["delta"]),
        }

    def heal(self) -> dict[str, Any]:
        return {"node": self.params["node"], "kept": "a bump stays until clock-reset or the final heal"}

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """The offset measured inside the node against the one the bump set (as ``clock-skew``)."""
        node = self.params["node"]
        return clock_evidence(node, [float(done["set"]["offset"])], measure_clock(self.ctx, node))


class ClockStrobe(_ClockFault):
    """The broker's wall clock flips between offsets ``a`` and ``b`` every ``period`` seconds (at least 1) for ``duration`` seconds."""

    name = "clock-strobe"
    params_schema = {"node": str, "a": float, "b": float, "period": float, "duration": float}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        period = round(float(params.get("period", MIN_PERIOD)), 3)
        duration = round(float(params.get("duration", 10.0)), 3)
        if period < MIN_PERIOD:
            raise ScenarioError(
                f"{cls.name}: period {period} is below {MIN_PERIOD}s, how often a broker re-reads "
                "its fake clock; a faster strobe would skip flips unseen"
            )
        if duration <= 0:
            raise ScenarioError(f"{cls.name}: duration must be > 0 seconds, got {duration}")
        return {
            "node": _node(params, nodes, rng, cls.name),
            "a": round(float(params.get("a", 0.0)), 3),
            "b": _seconds(params, "b", rng, 5, 120),
            "period": period,
            "duration": duration,
        }

    def apply(self) -> dict[str, Any]:
        p = self.params
        node = self.params["node"]
        f, pidf = shlex.quote(FAKETIME_FILE), shlex.quote(STROBE_PID)
        put = "printf '%s\\n' {v} > " + f"{f}.tmp && mv {f}.tmp {f}"
        a, b = shlex.quote(offset_text(p["a"])), shlex.quote(offset_text(p["b"]))
        # `date` here is the real clock: only the broker's processes have the fake one.
        loop = (
            f"echo $$ > {pidf}; end=$(( $(date +%s) + {int(-(-p['duration'] // 1))} )); "
            f"while [ $(date +%s) -lt $end ]; do {put.format(v=a)}; sleep {p['period']}; "
            f"{put.format(v=b)}; sleep {p['period']}; done; {put.format(v='+0')}; rm -f {pidf}"
        )
        stop_strobe(self.ctx, node)
        try:
            self.ctx.cluster.nodes[node].container.exec_run(["sh", "-c", loop], detach=True)
        except Exception as exc:  # noqa: BLE001 - the Docker SDK raises several kinds
            raise FaultError(f"{node}: could not start the clock strobe: {short_error(exc)}") from None
        return {
            "node": node,
            "file": FAKETIME_FILE,
            "between": [offset_text(p["a"]), offset_text(p["b"])],
            "period": p["period"],
            "duration": p["duration"],
            "loop": loop,
        }

    def heal(self) -> dict[str, Any]:
        node = self.params["node"]
        return {"stopped": stop_strobe(self.ctx, node), "set": write_offset(self.ctx, node, 0.0)}

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """One reading per phase of the strobe, until one shows an offset."""
        node, p = self.params["node"], self.params
        ev = Evidence.unmeasured("no reading")
        for _ in range(2):
            time.sleep(p["period"] / 2 + MIN_PERIOD / 2)
            ev = clock_evidence(node, [p["a"], p["b"]], measure_clock(self.ctx, node))
            if ev.effect is not False or not ev.facts.get("fake_clock_loaded"):
                break
        return ev

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """The clock measured again once the strobe stopped: true time."""
        return clock_restored(self.ctx, self.params["node"], applied)


class ClockReset(_ClockFault):
    """Set the broker's wall clock right again on ``node``, ``nodes`` or every node (stops a strobe)."""

    name = "clock-reset"
    params_schema = {"node": str, "nodes": list}
    touches = frozenset()

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        targets = params.get("nodes") or ([params["node"]] if params.get("node") else list(nodes))
        for n in targets:
            if n not in nodes:
                raise ScenarioError(f"{cls.name}: node {n!r} is not one of {list(nodes)}")
        return {"nodes": list(targets)}

    def apply(self) -> dict[str, Any]:
        done = []
        for node in self.params["nodes"]:
            strobe = stop_strobe(self.ctx, node)
            before = offset_text(read_offset(self.ctx, node))
            done.append(
                {
                    **write_offset(self.ctx, node, 0.0),
                    "before": before,
                    **({"stopped_strobe": strobe} if strobe else {}),
                }
            )
        return {"set": done}

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """A reset bit where a clock was off and now reads true time."""
        time.sleep(MIN_PERIOD)
        parts = {}
        for d in done["set"]:
            reading = measure_clock(self.ctx, d["node"])
            off = float(reading["offset_s"])
            facts = {"before": d["before"], "measured_s": off}
            if abs(off) >= TOLERANCE_S:
                parts[d["node"]] = Evidence.bit(
                    f"still {off:+.3f} s off",
                    facts,
                    flags=(f"{d['node']}: reset left the clock {off:+.3f} s off",),
                )
            elif d["before"] in ("+0", "0") and not d.get("stopped_strobe"):
                parts[d["node"]] = Evidence.none("its clock was already right", facts)
            else:
                parts[d["node"]] = Evidence.bit(f"set right from {d['before']} s", facts)
        return combine_evidence(parts)

    def heal(self) -> dict[str, Any]:
        return {"nodes": self.params["nodes"], "note": "nothing to undo"}


CLOCK_FAULTS: tuple[type[Fault], ...] = (ClockSkew, ClockBump, ClockStrobe, ClockReset)
