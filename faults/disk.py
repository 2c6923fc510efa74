"""Disk faults while the broker runs: EIO, a full disk, slow fsyncs and fsyncs that lie.

Each kind adds a rule to the lazy filesystem under the data directory of the chosen nodes
(``nodectl disk add``; see ``faults/lazyfs/diskfaults.py`` for what each rule does) and removes
it at heal. The heal's record carries the rule's final counts: how many reads, writes or fsyncs
of which files were refused, delayed or lied about, so the history shows what the broker met.
A broker must either get a clear error (and refuse to confirm what it could not write) or keep
its promise; the checkers decide. An fsync that lies is the exception on purpose: the broker
cannot know, so a power cut while the lie holds must cost it the data it was told was durable.

The rules outlive a power cut (the disk is still bad after the reboot) and hold nothing a
process fault holds, so they combine with kills and power loss in one schedule.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from faults.power import on_each
from faults.process import nodectl
from faults.targets import pick_nodes
from harness import FaultError, ScenarioError
from harness.spec import Evidence, Fault, FaultContext, combine_evidence

OPS = ("read", "write", "fsync")


class _DiskRuleFault(Fault):
    """One lazyfs disk rule, named by the fault's id, on each chosen node."""

    requires = frozenset({"power-loss"})  # the data directory can sit on the lazy filesystem
    needs = frozenset({"lazyfs"})
    #: The lazyfs rule kind this fault adds, and the parameters it passes on to the rule.
    rule_kind: ClassVar[str]
    rule_fields: ClassVar[tuple[str, ...]] = ()
    params_schema: ClassVar[Mapping[str, Any]] = {"nodes": object, "files": str}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        out = dict(params)
        out["nodes"] = pick_nodes(cls.name, params.get("nodes", "minority"), nodes, rng)
        out["files"] = str(params.get("files", "*"))
        return out

    def rule(self) -> dict[str, Any]:
        """The rule as lazyfs takes it (``id``, ``kind``, ``glob`` and the kind's own fields)."""
        return {
            "id": self.fault_id or self.name,
            "kind": self.rule_kind,
            "glob": self.params["files"],
            **{k: self.params[k] for k in self.rule_fields},
        }

    def _each(self, *args: str) -> dict[str, Any]:
        nodes = self.ctx.cluster.nodes
        replies, errors = on_each(list(self.params["nodes"]), lambda n: nodectl(nodes[n], "disk", *args))
        if errors:
            raise FaultError(
                f"{self.name}: nodectl disk {args[0]} failed: "
                + "; ".join(f"{n}: {e}" for n, e in sorted(errors.items()))
                + (f" (done on {', '.join(sorted(replies))})" if replies else "")
            )
        return {n: r["lazyfs"] for n, r in replies.items()}

    def apply(self) -> dict[str, Any]:
        rule = self.rule()
        done = self._each("add", json.dumps(rule, sort_keys=True))
        return {"rule": rule, "nodes": {n: r["rule"] for n, r in done.items()}}

    def heal(self) -> dict[str, Any]:
        """Remove the rule; its final counts say what it did on each node."""
        done = self._each("clear", self.rule()["id"])
        return {"nodes": {n: (r["cleared"] or [None])[0] for n, r in done.items()}}

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """While held only the rule's presence is known; what it did is counted when it is cleared."""
        nodes = sorted(done.get("nodes") or {})
        return Evidence.unmeasured(
            f"rule {self.rule()['id']} in place on {', '.join(nodes)}; what it returned is counted at the heal",
            {"nodes": dict(done.get("nodes") or {})},
        )

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """The rule's final counts per node: how many calls it refused, delayed or lied to, on which files."""
        parts = {}
        for node, report in sorted((done.get("nodes") or {}).items()):
            if not report:
                parts[node] = Evidence.unmeasured("the rule was gone before its heal (no counts)")
                continue
            hits = int(report.get("hits") or 0)
            facts = {k: report.get(k) for k in ("hits", "ops", "paths", "first_hit", "last_hit")}
            what = f"{hits} {'/'.join(report.get('ops') or [])} call(s) met the {report.get('kind')} rule"
            if hits:
                shown = ", ".join(report.get("paths") or [])
                parts[node] = Evidence.bit(f"{what} ({shown})", facts)
            else:
                parts[node] = Evidence.none(
                    f"no {'/'.join(report.get('ops') or [])} call matched while it held", facts
                )
        ev = combine_evidence(parts)
        return Evidence(ev.effect, ev.summary, ev.facts, ev.no_effect_reason, ev.flags, True)

    @classmethod
    def heal_all(cls, ctx: FaultContext) -> dict[str, Any] | None:
        """Every disk rule on every lazy filesystem goes, each node's own and each shared volume's
        (shared by all disk kinds: it runs once). A node whose data directory is a shared volume's
        has no lazy filesystem of its own to clear."""
        topology = ctx.cluster.topology
        if not getattr(topology, "lazyfs", False):
            return None
        shared = getattr(topology, "shared_disks", ())
        own = getattr(topology, "lazy_nodes", ()) if shared else tuple(ctx.cluster.nodes)
        targets = {n: ctx.cluster.nodes[n] for n in own}
        targets.update({f"shared-{d.name}": ctx.cluster.disks[d.name] for d in shared})
        replies, errors = on_each(list(targets), lambda n: nodectl(targets[n], "disk", "clear"))
        if errors:
            raise FaultError(
                "clearing disk fault rules failed: "
                + "; ".join(f"{n}: {e}" for n, e in sorted(errors.items()))
            )
        cleared = {n: r["lazyfs"]["cleared"] for n, r in replies.items() if r["lazyfs"]["cleared"]}
        return cleared or None


class DiskError(_DiskRuleFault):
    """EIO on ``ops`` (read, write, fsync; default write and fsync) of the matching files."""

    name = "disk-error"
    rule_kind = "eio"
    rule_fields = ("ops",)
    params_schema = {**_DiskRuleFault.params_schema, "ops": list}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        out = super().resolve(params, nodes, rng)
        ops = list(params.get("ops", ["write", "fsync"]))
        bad = [o for o in ops if o not in OPS]
        if bad or not ops:
            raise ScenarioError(f"fault {cls.name}: ops {ops!r} must be a non-empty list of {', '.join(OPS)}")
        out["ops"] = [o for o in OPS if o in ops]
        return out


class DiskFull(_DiskRuleFault):
    """ENOSPC on writes once ``after_bytes`` more bytes (default 0: at once) reached the matching files.

    ``df`` (default true): free space as ``statfs`` reports it shrinks with the budget, so a broker
    with a disk alarm can block publishers first; false: only the writes fail (a full partition
    holding just those files, or a broker that never looks).
    """

    name = "disk-full"
    rule_kind = "enospc"
    rule_fields = ("after_bytes", "df")
    params_schema = {**_DiskRuleFault.params_schema, "after_bytes": int, "df": bool}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        out = super().resolve(params, nodes, rng)
        out["after_bytes"] = int(params.get("after_bytes", 0))
        out["df"] = bool(params.get("df", True))
        if out["after_bytes"] < 0:
            raise ScenarioError(f"fault {cls.name}: after_bytes must not be negative")
        return out


class SlowFsync(_DiskRuleFault):
    """Every fsync of a matching file or directory takes ``delay_ms`` (default 100, at most 60000) longer.

    A slow flush, not a hung disk: the fsync covers what was written before it started, and the
    node's other reads, writes and name operations go on while it waits (the kernel's FUSE module
    still makes writes to the very file being fsynced, and listing or naming in a directory being
    fsynced, wait for it). It persists when its delay
    ends; a power cut before then persists nothing of it, and writes made meanwhile need the next
    fsync. The heal ends the delay of fsyncs still waiting and records ``hits`` and
    ``delayed_ms_total``. ``files`` is a glob over paths in the data directory (default ``*``).
    """

    name = "slow-fsync"
    rule_kind = "slow-fsync"
    rule_fields = ("delay_ms",)
    params_schema = {**_DiskRuleFault.params_schema, "delay_ms": float}

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        out = super().resolve(params, nodes, rng)
        out["delay_ms"] = float(params.get("delay_ms", 100.0))
        if not 0 < out["delay_ms"] <= 60_000:
            raise ScenarioError(f"fault {cls.name}: delay_ms must be between 0 and 60000")
        return out


class FsyncLie(_DiskRuleFault):
    """fsync of matching files and directories reports success and persists nothing."""

    name = "fsync-lie"
    rule_kind = "fsync-lie"


DISK_FAULTS: tuple[type[Fault], ...] = (DiskError, DiskFull, SlowFsync, FsyncLie)
