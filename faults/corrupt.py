"""File corruption: with the broker killed, flip bits in or truncate one of its data files on
some nodes (a minority by default), as Jepsen's file nemesis does, then start it again at heal.

A replicated broker should survive a corrupted minority: its checksums catch the damage and the
healthy copies repair it. The file and offsets are drawn from the run's seed at planning time as
fractions (of the sorted candidate files, of the file's size), so the plan is concrete before the
run and ``--replay`` makes the same choice from the same directory contents; the record says
exactly which file, which offsets, and which bytes before and after (``faults.node.corrupt``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

from faults.power import NodesFault, on_each
from faults.process import nodectl
from faults.targets import pick_nodes
from harness import FaultError, ScenarioError
from harness.spec import BrokerPlugin, ConformanceProbe, Evidence, combine_evidence


class CorruptFile(NodesFault):
    """Kill the broker, corrupt one data file under ``data_dir``, start it at heal.

    ``mode``: ``bitflip`` flips ``bits`` single bits at seeded offsets; ``truncate`` drops the
    last ``bytes`` bytes, or without ``bytes`` cuts at a seeded offset. ``files`` narrows the
    candidates with a glob relative to ``data_dir``; ``file_role`` instead names one of the
    broker plugin's ``data_files`` roles (such as ``quorum-segment``), whose globs the plugin
    declares. Without either, the candidates are the files of the roles that hold the run's
    messages (``message_file_roles``), or every file when the plugin declares none.
    """

    name = "corrupt-file"
    requires = frozenset({"kill"})
    touches = frozenset({"process", "disk"})
    conformance = ConformanceProbe(
        params={"nodes": ["n1"], "mode": "bitflip", "bits": 1}, nodes=1, may_lose=True, corrupts=True
    )
    params_schema = {
        "nodes": object,
        "mode": ("bitflip", "truncate"),
        "bits": int,
        "bytes": int,
        "files": str,
        "file_role": str,
        "picks": dict,
    }
    DEFAULT_BITS = 8

    @classmethod
    def resolve(cls, params: Mapping[str, Any], nodes: Sequence[str], rng: random.Random) -> dict[str, Any]:
        super().resolve(params, nodes, rng)
        mode = params.get("mode", "bitflip")
        out: dict[str, Any] = {
            "nodes": pick_nodes(cls.name, params.get("nodes", "minority"), nodes, rng),
            "mode": mode,
        }
        if "file_role" in params:
            if "files" in params:
                raise ScenarioError(f"fault {cls.name}: give files (a glob) or file_role, not both")
            out["file_role"] = str(params["file_role"])
        elif "files" in params:
            out["files"] = str(params["files"])
        if mode == "bitflip":
            if "bytes" in params:
                raise ScenarioError(f"fault {cls.name}: bytes is for mode truncate; bitflip takes bits")
            out["bits"] = int(params.get("bits", cls.DEFAULT_BITS))
            if not 1 <= out["bits"] <= 4096:
                raise ScenarioError(f"fault {cls.name}: bits {out['bits']} must be between 1 and 4096")
        else:
            if "bits" in params:
                raise ScenarioError(f"fault {cls.name}: bits is for mode bitflip; truncate takes bytes")
            if "bytes" in params:
                out["bytes"] = int(params["bytes"])
                if out["bytes"] < 1:
                    raise ScenarioError(f"fault {cls.name}: bytes {out['bytes']} must be at least 1")
        picks = dict(params.get("picks") or {})
        for node in out["nodes"]:
            if node not in picks:
                pick: dict[str, Any] = {"file": rng.random()}
                if mode == "bitflip":
                    pick["flips"] = [[rng.random(), rng.randrange(8)] for _ in range(out["bits"])]
                elif "bytes" not in out:
                    pick["cut"] = rng.random()
                picks[node] = pick
        out["picks"] = {n: picks[n] for n in out["nodes"]}
        return out

    def _plan(self, node: str) -> dict[str, Any]:
        role = self.params.get("file_role")
        globs: str | list[str]
        if role is not None:
            globs = list(file_role_globs(self.ctx.cluster.plugin, role))
        elif "files" in self.params:
            globs = self.params["files"]
        else:
            globs = data_file_globs(self.ctx.cluster.plugin, self.ctx.cluster.settings)
        plan = {"mode": self.params["mode"], "glob": globs, **self.params["picks"][node]}
        if role is not None:
            plan["role"] = role
        if "bytes" in self.params:
            plan["bytes"] = self.params["bytes"]
        return plan

    def _corrupt(self, name: str) -> dict[str, Any]:
        node = self.ctx.cluster.nodes[name]
        killed = nodectl(node, "crash")
        root = self.ctx.cluster.topology.data_dir
        rc, out = node.exec(
            ["python3", "-m", "faults.node.corrupt", "--root", root, "--plan", json.dumps(self._plan(name))],
            timeout=60,
        )
        line = out.strip().splitlines()[-1] if out.strip() else ""
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            reply = {"ok": False, "error": f"exit {rc}: {out.strip()[-300:]}"}
        if not reply.get("ok"):
            raise FaultError(
                f"broker killed, but corrupting a file under {root} failed: {reply.get('error')}"
            )
        reply.pop("ok")
        return {"nodectl": killed, "corrupted": reply}

    def apply(self) -> dict[str, Any]:
        done, errors = on_each(list(self.params["nodes"]), self._corrupt)
        if errors:
            raise FaultError(
                "; ".join(f"{n}: {e}" for n, e in sorted(errors.items()))
                + (f" (corrupted: {json.dumps(done, sort_keys=True)})" if done else "")
            )
        self.corrupted = {n: d["corrupted"] for n, d in done.items()}
        return {"nodes": done}

    def evidence(self, done: Mapping[str, Any]) -> Evidence:
        """Per node: the file, its written extent (bit flips land only there, never in a
        preallocated zero tail), every changed offset with its byte before and after, and the
        file's sha256 before and after. No effect: the checksum did not change."""
        return combine_evidence(
            {n: changed(d["corrupted"]) for n, d in sorted((done.get("nodes") or {}).items())}
        )

    def _verify(self, name: str) -> dict[str, Any]:
        node = self.ctx.cluster.nodes[name]
        record = json.dumps({k: self.corrupted[name].get(k) for k in ("file", "sha256_after")})
        rc, out = node.exec(["python3", "-m", "faults.node.corrupt", "--verify", record], timeout=60)
        try:
            return dict(json.loads(out.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            raise FaultError(
                f"{name}: verifying the corrupted file failed (exit {rc}): {out.strip()[-300:]}"
            ) from None

    def heal(self) -> dict[str, Any]:
        """Before the broker starts again: does each corrupted file still hold the corruption?"""
        names = sorted(getattr(self, "corrupted", {}))
        before, errors = on_each(names, self._verify)
        return {**super().heal(), "before_start": before, "verify_errors": errors}

    def heal_evidence(self, done: Mapping[str, Any], applied: Evidence) -> Evidence:
        """Before the broker starts again, each corrupted file is checked to still hold the
        corruption (its sha256): a file deleted or rewritten meanwhile means the fault had no effect."""
        healed = super().heal_evidence(done, applied)
        lost = {
            n: v["state"] for n, v in (done.get("before_start") or {}).items() if v.get("state") != "intact"
        }
        if not lost or applied.effect is not True:
            return healed
        if len(lost) < len(done.get("before_start") or {}):
            flags = tuple(
                f"{n}: the corrupted file was {s} before the broker started" for n, s in lost.items()
            )
            return Evidence(True, healed.summary, healed.facts, None, healed.flags + flags, healed.restored)
        reason = "; ".join(
            f"{n}: the corrupted file was {'deleted' if s == 'gone' else 'rewritten'} before the broker read it"
            for n, s in sorted(lost.items())
        )
        return Evidence.none(reason, healed.facts, flags=healed.flags, restored=healed.restored)


def data_file_globs(plugin: BrokerPlugin, settings: Mapping[str, Any]) -> str | list[str]:
    """Where a corruption that names no file lands: the files of the data file roles that hold
    the messages of a run with ``settings`` (``message_file_roles``), or every file when the
    plugin declares none. Among every file, a RabbitMQ node's seeded pick landed in a one-byte
    ``.vhost`` or a Ra metadata table as often as in a queue's log."""
    roles = plugin.message_file_roles(settings)
    return [g for role in roles for g in plugin.data_files[role]] or "**/*"


def file_role_globs(plugin: BrokerPlugin, role: str) -> tuple[str, ...]:
    """The globs of one of ``plugin``'s data file roles; an unknown role names the known ones."""
    try:
        return tuple(plugin.data_files[role])
    except KeyError:
        known = ", ".join(sorted(plugin.data_files)) or "none"
        raise ScenarioError(
            f"fault corrupt-file: broker plugin {plugin.name!r} declares no data file role {role!r}; "
            f"its roles: {known}"
        ) from None


def changed(reply: Mapping[str, Any]) -> Evidence:
    """What one node's corruption changed: offsets and bytes, and the file's sha256 before and after."""
    before, after = reply.get("sha256_before"), reply.get("sha256_after")
    facts = {
        k: reply.get(k)
        for k in ("file", "size_before", "size_after", "written_extent", "sha256_before", "sha256_after")
    }
    if reply.get("role"):
        facts["role"] = reply["role"]
    changes: list[dict[str, Any]] = list(reply.get("changes") or [])
    facts["changes"] = changes
    facts["cut"] = reply.get("cut")
    if before is None or after is None:
        return Evidence.unmeasured("no checksum of the file was taken", facts)
    if before == after:
        extent = reply.get("written_extent") or [0, 0]
        why = "it holds no written byte" if extent[1] == 0 else "the flips cancelled out"
        return Evidence.none(f"{reply.get('file')} is unchanged ({why})", facts)
    if reply.get("cut"):
        what = f"cut {reply['cut']['bytes']:,} bytes at offset {reply['cut']['offset']:,}"
    else:
        offsets = sorted({c["offset"] for c in changes})
        what = f"flipped {len(changes)} bit(s) at offset(s) {', '.join(map(str, offsets[:8]))}"
    return Evidence.bit(f"{what} of {reply.get('file')}; sha256 {before[:12]} -> {after[:12]}", facts)
