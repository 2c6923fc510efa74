"""What a process fault or a power cut measured of its own effect, from the node init's replies.

Pure functions of the replies ``faults.nodectl`` prints (``faults.nodeinit``): the kill's reply
lists the pids it signalled and whether the whole tree was gone after; ``status`` lists every
live process of the broker with its /proc state and the leader's exit; a power cut's reply
carries what the lazy filesystem dropped, per file and range.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.spec import Evidence

#: /proc states of a stopped process (SIGSTOP, a tracer, the cgroup freezer shows ``T``/``t``).
STOPPED = ("T", "t")


def _exit(status: Mapping[str, Any] | None) -> dict[str, Any] | None:
    last = (status or {}).get("last_exit")
    if not isinstance(last, Mapping):
        return None
    code = last.get("code")
    out = dict(last)
    if isinstance(code, int) and code < 0:
        import signal

        try:
            out["signal"] = signal.Signals(-code).name
        except ValueError:
            out["signal"] = str(-code)
    return out


def gone(reply: Mapping[str, Any], status: Mapping[str, Any] | None) -> Evidence:
    """A kill, stop or crash: the broker's whole process tree is gone, and with which exit."""
    alive = sorted((status or {}).get("alive") or {})
    if reply.get("note") and not reply.get("pids") and not reply.get("steps"):
        return Evidence.none(f"the broker was not running ({reply['note']})", {"reply_note": reply["note"]})
    steps = reply.get("steps") or [reply]
    pids = sorted({p for s in steps for p in s.get("pids") or []})
    facts: dict[str, Any] = {
        "pids": pids,
        "signals": [s.get("signal") for s in steps],
        "gone_at": reply.get("gone_at") or reply.get("stopped_at"),
        "exit": _exit(status),
        "alive_after": alive,
    }
    if alive:
        return Evidence.bit(
            f"signalled {len(pids)} process(es) but {len(alive)} still live: {', '.join(alive)}",
            facts,
            flags=(f"broker processes {', '.join(alive)} survived the kill",),
        )
    if not pids:
        return Evidence.none("no broker process was signalled", facts)
    ex = facts["exit"] or {}
    how = ex.get("signal") or (f"exit {ex['code']}" if ex.get("code") is not None else "exit unknown")
    return Evidence.bit(f"{len(pids)} broker process(es) gone ({how}) at {facts['gone_at']}", facts)


def back(evidence: Evidence, start: Mapping[str, Any], status: Mapping[str, Any] | None) -> Evidence:
    """The same evidence after the heal started the broker again: when, and whether it runs."""
    running = (status or {}).get("state") == "running" and bool((status or {}).get("pids"))
    facts = {**evidence.facts, "back_at": start.get("at"), "pid_after": (status or {}).get("pid")}
    summary = evidence.summary + (
        f"; back at {start.get('at')}" if running else "; not running after the heal"
    )
    return evidence.with_heal(summary, facts, running)


def stopped(reply: Mapping[str, Any], status: Mapping[str, Any] | None) -> Evidence:
    """A pause: every process of the broker is in a stopped state."""
    states = dict((status or {}).get("alive") or {})
    running = sorted(p for p, s in states.items() if s not in STOPPED)
    facts = {"pids": reply.get("pids") or [], "states": states}
    if not states:
        return Evidence.none("no broker process to stop", facts)
    if running:
        return Evidence.bit(
            f"{len(states) - len(running)} of {len(states)} process(es) stopped",
            facts,
            flags=(f"broker processes {', '.join(running)} kept running through the pause",),
        )
    return Evidence.bit(f"all {len(states)} broker process(es) stopped (state T)", facts)


def resumed(evidence: Evidence, status: Mapping[str, Any] | None) -> Evidence:
    states = dict((status or {}).get("alive") or {})
    still = sorted(p for p, s in states.items() if s in STOPPED)
    facts = {**evidence.facts, "states_after": states}
    summary = evidence.summary + (f"; {', '.join(still)} still stopped" if still else "; running again")
    return evidence.with_heal(summary, facts, not still)


def _files(fs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per file: the unsynced bytes dropped (and, for a torn cut, kept) and their ranges."""
    files: dict[str, dict[str, Any]] = {}
    for d in fs.get("dropped_data") or []:
        files[d["path"]] = {
            "path": d["path"],
            "dropped_bytes": int(d.get("unsynced_bytes") or 0),
            "kept_bytes": 0,
            "dropped_ranges": d.get("writes") or [],
            "truncates_dropped": d.get("truncates") or [],
        }
    for t in fs.get("torn") or []:
        f = files.setdefault(
            t["path"], {"path": t["path"], "dropped_bytes": 0, "kept_bytes": 0, "dropped_ranges": []}
        )
        f["kept_bytes"] += int(t.get("kept_bytes") or 0)
        f["dropped_bytes"] += int(t.get("unsynced_bytes") or 0) - int(t.get("kept_bytes") or 0)
        f["dropped_ranges"] = list(f["dropped_ranges"]) + list(t.get("dropped") or [])
        f["kept_ranges"] = t.get("kept") or []
        f["torn"] = bool(t.get("dropped"))
    return sorted(files.values(), key=lambda f: f["path"])


def power_cut(reply: Mapping[str, Any]) -> Evidence:
    """A power cut on one node: what its lazy filesystem threw away (and, torn, kept)."""
    fs = reply.get("lazyfs") or {}
    if not fs:
        return Evidence.unmeasured("the lazy filesystem reported nothing about the cut")
    files = _files(fs)
    dropped = int(fs.get("dropped_bytes") or 0)
    kept = int(fs.get("kept_bytes") or 0)
    names = list(fs.get("names_lost") or [])
    shortened = [f["path"] for f in files if f["dropped_bytes"]]
    facts = {
        "dropped_bytes": dropped,
        "kept_bytes": kept,
        "files": files,
        "shorter_or_torn": shortened,
        "names_lost": names,
        "fsyncs_cut": reply.get("fsyncs_cut"),
        "unsynced_saved": reply.get("unsynced_saved"),
    }
    if dropped == 0 and not names:
        return Evidence.none("nothing unsynced was dropped", facts)
    torn = sum(1 for f in files if f.get("torn"))
    summary = f"dropped {dropped:,} unsynced bytes in {len(shortened)} file(s)"
    if kept:
        summary += f", kept {kept:,} ({torn} file(s) torn)"
    if names:
        summary += f", {len(names)} name(s) lost"
    return Evidence.bit(summary, facts)
