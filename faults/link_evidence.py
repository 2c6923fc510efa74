"""Evidence that a cut stopped its links: probes across each cut link while held and after the heal,
the Toxiproxy servers' own account of their proxies (toxics present, proxies disabled), and their
byte counters over the whole hold.

A link is one proxy in one sidecar (``faults.network``): the probe runs in that sidecar's network
namespace against the proxy's listen address, the address the broker itself dials
(``faults.node.probe``). A cut link must stall or refuse while held and pass again after the heal;
a link that passes while held is a cut that did not happen, whatever the API says.

The project's Toxiproxy server counts, per proxy and stream, the bytes its copy loop read from the
sender and wrote to the receiver (``tools/toxiproxy-server``: ``bytes`` in ``GET /proxies``). Read
right after the cut and right before the heal, they say what crossed each cut link while it was
held, the broker's own traffic included, not only at the instant of a probe: a cut stream writes
nothing (what reaches it is read and thrown away), a disabled proxy carries nothing. A cut link
that bytes crossed is a leak line; a cut whose every link leaked had no effect.

The server also counts, per proxy, the connections it accepted and those it closed at once because
the upstream connect failed (``connections``). A probe closed that way "passes" without the far end
hearing it: nothing listens behind the proxy (a peer that listens only at times). Such a probe, on a
link whose ``upstream_failed`` grew over the probe window while nothing crossed the cut stream, is
``unanswered``: neither a leak nor a stop; only the counters over the hold can prove that link cut.
A proxy that no longer carries the link accepts nothing, so its probes stay leaks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from faults.targets import on_each
from harness import FaultError
from harness.spec import Evidence

#: Seconds a probe waits for the far end (a stalled link costs this once per sidecar).
PROBE_WAIT = 1.5
STOPPED = ("stalled", "refused")


def link_key(link: Mapping[str, Any]) -> str:
    return f"{link['sidecar']}/{link['proxy']}"


def probe_links(cluster: Any, links: Sequence[Mapping[str, Any]], wait: float = PROBE_WAIT) -> dict[str, Any]:
    """Each link's probe result by ``sidecar/proxy`` (one exec per sidecar, its probes at once)."""
    listen = {
        (sidecar, p.name): p.listen
        for sidecar in {lk["sidecar"] for lk in links}
        for p in cluster.topology.proxies[sidecar]
    }
    by_sidecar: dict[str, list[str]] = {}
    for lk in links:
        address = listen.get((lk["sidecar"], lk["proxy"]))
        if address is not None and address not in by_sidecar.setdefault(lk["sidecar"], []):
            by_sidecar[lk["sidecar"]].append(address)

    def run(sidecar: str) -> dict[str, Any]:
        cmd = ["python3", "-m", "faults.node.probe", "--wait", str(wait), *by_sidecar[sidecar]]
        rc, out = cluster.nodes[sidecar].exec(cmd, timeout=60 + wait)
        try:
            return dict(json.loads(out.strip().splitlines()[-1])["probes"])
        except (ValueError, IndexError, KeyError):
            raise FaultError(
                f"{sidecar}: probing its proxies failed (exit {rc}): {out.strip()[-300:]}"
            ) from None

    replies, errors = on_each(sorted(by_sidecar), run)
    if errors:
        raise FaultError("; ".join(f"{n}: {e}" for n, e in sorted(errors.items())))
    out: dict[str, Any] = {}
    for lk in links:
        address = listen.get((lk["sidecar"], lk["proxy"]))
        found = replies.get(lk["sidecar"], {}).get(address) if address else None
        out[link_key(lk)] = {"address": address, **(found or {"result": "unknown", "error": "no such proxy"})}
    return out


def readback(cluster: Any, links: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What each link's Toxiproxy server says of its proxy: enabled, its toxics, and its byte
    counters per stream (None: not counted)."""
    sidecars = sorted({lk["sidecar"] for lk in links})
    proxies, errors = on_each(sidecars, lambda n: cluster.nodes[n].toxiproxy.proxies())
    out: dict[str, Any] = {}
    for lk in links:
        p = (proxies.get(lk["sidecar"]) or {}).get(lk["proxy"])
        out[link_key(lk)] = (
            {
                "enabled": p["enabled"],
                "toxics": p["toxics"],
                "bytes": p.get("bytes"),
                "connections": p.get("connections"),
            }
            if p
            else {"missing": errors.get(lk["sidecar"], "no such proxy")}
        )
    return out


def _counted(link: Mapping[str, Any], counters: Any) -> dict[str, int] | None:
    """``read`` and ``written`` of the link's stream, summed over both for a disabled proxy."""
    if not isinstance(counters, Mapping):
        return None
    streams = [link["stream"]] if "stream" in link else ["upstream", "downstream"]
    try:
        return {k: sum(int(counters[s][k]) for s in streams) for k in ("read", "written")}
    except (KeyError, TypeError, ValueError):
        return None


def _delta(after: Any, before: Any) -> dict[str, int] | None:
    if not isinstance(after, Mapping) or not isinstance(before, Mapping):
        return None
    return {k: int(after[k]) - int(before[k]) for k in ("read", "written")}


def counted_now(cluster: Any, links: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each link's proxy's counters by ``sidecar/proxy``; a server that does not answer leaves None
    (the counters are evidence, never a reason for a fault or its heal to fail)."""
    try:
        api = readback(cluster, links)
    except Exception:  # noqa: BLE001 - a sidecar that does not answer: not counted
        return {link_key(lk): None for lk in links}
    return {key: _with_connections(row) for key, row in api.items()}


def _with_connections(row: Mapping[str, Any]) -> Any:
    """The row's byte counters with its proxy's connection counts beside them (key ``connections``)."""
    counters = row.get("bytes")
    if not isinstance(counters, Mapping):
        return counters
    return {**counters, "connections": row.get("connections")}


def _failed_connects(after: Any, before: Any) -> int | None:
    """How many of the proxy's upstream connects failed between two readings (None: not counted)."""
    try:
        return int(after["upstream_failed"]) - int(before["connections"]["upstream_failed"])
    except (KeyError, TypeError, ValueError):
        return None


def _unanswered(row: Mapping[str, Any]) -> bool:
    """A probe that passed with a close or a reset while the proxy failed to connect upstream over
    the probe window and wrote nothing across the cut stream: nothing listened behind the proxy."""
    written = _delta(row["bytes"]["held"], row["bytes"]["at_cut"])
    return (
        row["held"].get("result") == "passes"
        and row["held"].get("reply") != "bytes"
        and (row["connections"]["upstream_failed"] or 0) > 0
        and written is not None
        and written["written"] == 0
    )


def _in_place(link: Mapping[str, Any], api: Mapping[str, Any]) -> bool:
    if "toxic" in link:
        return link["toxic"] in (api.get("toxics") or [])
    return api.get("enabled") is False


def _crossed_line(row: Mapping[str, Any], crossed: int) -> str:
    stream = f" ({row['stream']})" if "stream" in row else ""
    return (
        f"{row['cut']}: {crossed} byte(s) crossed {row['sidecar']}'s proxy {row['proxy']}{stream} while cut"
    )


def held_evidence(
    links: Sequence[Mapping[str, Any]],
    probes: Mapping[str, Any],
    api: Mapping[str, Any],
    at_cut: Mapping[str, Any] | None = None,
) -> Evidence:
    """Right after the cut: which links stopped, which still carried bytes, which lack their toxic.
    ``at_cut``: each link's counters read before the probes (what crossed since is in ``bytes``)."""
    at_cut = at_cut or {}
    rows = [
        {
            **lk,
            "held": probes[link_key(lk)],
            "api": _shown(api[link_key(lk)]),
            "in_place": _in_place(lk, api[link_key(lk)]),
            "bytes": {
                "at_cut": _counted(lk, at_cut.get(link_key(lk))),
                "held": _counted(lk, api[link_key(lk)].get("bytes")),
            },
            "connections": {
                "upstream_failed": _failed_connects(
                    api[link_key(lk)].get("connections"), at_cut.get(link_key(lk))
                )
            },
        }
        for lk in links
    ]
    for r in rows:
        r["unanswered"] = _unanswered(r)
    stopped = [r for r in rows if r["held"].get("result") in STOPPED]
    unanswered = [r for r in rows if r["unanswered"]]
    flags = tuple(
        f"{r['cut']} still carried bytes through {r['sidecar']}'s proxy {r['proxy']} while cut"
        for r in rows
        if r["held"].get("result") == "passes" and not r["unanswered"]
    ) + tuple(
        f"{r['cut']}: {r['sidecar']}'s proxy {r['proxy']} does not show the cut ({r['api']})"
        for r in rows
        if not r["in_place"]
    )
    facts = {"links": rows}
    if not rows:
        return Evidence.unmeasured("no link to probe", facts)
    if not stopped and unanswered and len(unanswered) == len(rows):
        return Evidence.unmeasured(
            f"no probe could tell whether the cut held: nothing listened behind the proxy of any of the "
            f"{len(rows)} cut link(s); the counters over the hold decide",
            facts,
            flags=flags,
        )
    if not stopped:
        return Evidence.none(
            f"no connection across the cut was stopped: all {len(rows)} probe(s) passed", facts, flags=flags
        )
    quiet = f", {len(unanswered)} unanswered (nothing listened behind the proxy)" if unanswered else ""
    return Evidence.bit(
        f"{len(stopped)} of {len(rows)} cut link(s) stopped while held{quiet}", facts, flags=flags
    )


def _shown(api: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in api.items() if k not in ("bytes", "connections")}


def _whole_hold(rows: list[dict[str, Any]], before_heal: Mapping[str, Any]) -> None:
    """Each row's counters over the whole hold, from right after the cut to right before the heal:
    ``while_cut``, ``written`` (what crossed the cut stream: 0 when the cut held) and ``read`` (what
    reached it; ``read - written`` was held back and thrown away)."""
    for r in rows:
        counted = dict(r.get("bytes") or {})
        counted["before_heal"] = _counted(r, before_heal.get(link_key(r)))
        counted["while_cut"] = _delta(counted["before_heal"], counted.get("at_cut"))
        r["bytes"] = counted


def healed_evidence(
    applied: Evidence,
    after: Mapping[str, Any],
    before_heal: Mapping[str, Any] | None = None,
    after_heal: Mapping[str, Any] | None = None,
) -> Evidence:
    """After the heal: a link that stalled while held and passes now was cut; one that stalls both
    times cannot be told from a peer that answers a probe with silence, unless the byte counters
    (``before_heal``, read before the toxics went) show that nothing crossed it while bytes met it.
    A link that bytes crossed while cut is a line of its own; when every link leaked, no effect."""
    rows = [dict(r, after=after.get(link_key(r), {})) for r in applied.facts.get("links") or []]
    _whole_hold(rows, before_heal or {})
    for r in rows:
        r["bytes"]["after_heal"] = _counted(r, (after_heal or {}).get(link_key(r)))
    hold = [r["bytes"]["while_cut"] for r in rows]
    counted = bool(rows) and all(h is not None for h in hold)
    leaked = [r for r in rows if (r["bytes"]["while_cut"] or {}).get("written", 0) > 0]
    proven = [
        r
        for r in rows
        if (_counters_held(r) and (r["held"].get("result") in STOPPED or r.get("unanswered")))
        or (r["held"].get("result") in STOPPED and r["after"].get("result") == "passes")
    ]
    silent = [
        r
        for r in rows
        if r["held"].get("result") == "stalled" and r["after"].get("result") == "stalled" and r not in proven
    ]
    results_after = [r["after"].get("result") for r in rows]
    restored = (
        True if all(x == "passes" for x in results_after) else False if "refused" in results_after else None
    )
    facts = {**applied.facts, "links": rows}
    flags = applied.flags + tuple(_crossed_line(r, r["bytes"]["while_cut"]["written"]) for r in leaked)
    first = applied.summary
    if applied.effect is None and proven:  # every link unanswered at the cut: the counters decide
        first = f"{len(proven)} of {len(rows)} cut link(s) proved cut by the counters over the hold (probes unanswered)"
    summary = f"{first}; {len(proven)} confirmed by a probe that passes after the heal or by the counters"
    if counted:
        crossed = sum(h["written"] for h in hold if h)
        summary += (
            f"; while cut {crossed} byte(s) crossed the cut links, {sum(h['read'] for h in hold if h) - crossed} "
            "were held back"
        )
    if counted and len(leaked) == len(rows):
        return Evidence.none(
            f"bytes crossed every cut link while cut ({sum(h['written'] for h in hold if h)} in all)",
            facts,
            flags=flags,
            restored=restored,
        )
    if applied.effect is True and not proven and silent:
        return Evidence.unmeasured(
            f"probes inconclusive: {len(silent)} link(s) stalled while cut and after the heal too "
            "(the far end answers a probe with silence)",
            facts,
            flags=flags,
            restored=restored,
        )
    if applied.effect is None and proven:
        return Evidence.bit(summary, facts, flags=flags, restored=restored)
    return replace(applied.with_heal(summary, facts, restored), flags=flags)


def _counters_held(row: Mapping[str, Any]) -> bool:
    """Nothing crossed the link's cut stream over the hold while bytes met it."""
    hold = row["bytes"]["while_cut"] or {}
    return hold.get("written", 1) == 0 < hold.get("read", 0)
