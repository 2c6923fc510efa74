"""Fault windows: when each fault held, and which windows a message's confirm falls in."""

from __future__ import annotations

from harness.spec.results import (
    FaultWindow,
)
from spark_reports.engines.common import load_json


def fault_windows(nemesis_rows: list[dict], end_ns: int) -> list[FaultWindow]:
    """Fault windows from the nemesis ops, which are few enough to handle anywhere.

    A window opens at the fault's invoke and closes at the ok of the first heal that
    names it; a fault nobody healed stays open to the end of the history. ``heal_start_ns`` is
    that heal's invoke (where recovery is measured from).
    """
    rows = sorted(nemesis_rows, key=lambda r: r["index"])
    windows: dict[str, dict] = {}
    order: list[str] = []
    heals: list[tuple[int, list[str]]] = []
    heal_invokes: list[tuple[int, list[str]]] = []
    for r in rows:
        value = load_json(r.get("value"))
        f = r.get("f") or "?"
        if f == "heal":
            ids = value.get("fault_ids") or []
            named = [str(i) for i in ids] if isinstance(ids, list) else []
            if r.get("type") == "ok":
                heals.append((r["time_ns"], named))
            elif r.get("type") == "invoke":
                heal_invokes.append((r["time_ns"], named))
            continue
        fid = str(value.get("fault_id") or f"{f}@{r['index']}")
        if r.get("type") == "invoke":
            if fid in windows:
                continue
            params = {k: v for k, v in value.items() if k not in ("fault_id", "kind")}
            windows[fid] = {
                "fault_id": fid,
                "kind": str(value.get("kind") or f),
                "node": r.get("node"),
                "start_ns": r["time_ns"],
                "applied": False,
                "params": params,
            }
            order.append(fid)
        elif fid in windows and r.get("type") == "ok":
            windows[fid]["applied"] = True
    out: list[FaultWindow] = []
    for fid in order:
        w = windows[fid]
        ends = [t for t, ids in heals if fid in ids and t >= w["start_ns"]]
        end = min(ends) if ends else None
        began = [t for t, ids in heal_invokes if fid in ids and end is not None and w["start_ns"] <= t <= end]
        out.append(
            FaultWindow(
                fault_id=fid,
                kind=w["kind"],
                node=w["node"],
                start_ns=w["start_ns"],
                end_ns=end if end is not None else max(end_ns, w["start_ns"]),
                heal_start_ns=max(began) if began else end,
                applied=w["applied"],
                healed=bool(ends),
                params=w["params"],
            )
        )
    return out


def overlapping(windows: list[FaultWindow], start_ns: int, end_ns: int) -> list[FaultWindow]:
    return [w for w in windows if w["start_ns"] <= end_ns and w["end_ns"] >= start_ns]


def kinds_for(windows: list[FaultWindow], confirm_ns: int, drain_end_ns: int) -> list[str]:
    """Fault kinds a confirmed message was exposed to; "none" when it met no fault."""
    kinds = sorted({w["kind"] for w in overlapping(windows, confirm_ns, drain_end_ns)})
    return kinds or ["none"]


def window_ids_at(windows: list[FaultWindow], t_ns: int) -> list[str]:
    return [w["fault_id"] for w in windows if w["start_ns"] <= t_ns <= w["end_ns"]]
