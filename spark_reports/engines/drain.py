"""The final drain as both engines read it: its rounds, its status, the queues it left held for no one, and the split-brain copies it found."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.spec.results import (
    Drain,
    DrainOp,
    DrainRound,
    EmptyNode,
    StuckQueue,
)
from spark_reports.engines.common import NO_LIMIT_INDEX, load_json, outcome_of
from spark_reports.engines.liveness import (
    NS_PER_S,
)


@dataclass(frozen=True)
class DrainSpan:
    """A node that reported a drained queue empty, within one drain op's index range."""

    process: str
    queue: str | None
    lo: int  # the drain's invoke index
    hi: int  # its completion's index
    node: str
    empty_at_ns: int


def _node_view(v: Any) -> dict:
    view = v if isinstance(v, dict) else {}
    return {k: view.get(k) for k in ("consumed", "ready", "unacked", "empty_at_ns", "error")}


def _round(x: dict) -> DrainRound:
    errors = x.get("errors")
    empty = x.get("empty")
    return DrainRound(
        end_ns=_int_or(x.get("end_ns"), 0),
        consumed=_int_or(x.get("consumed"), 0),
        empty=[str(n) for n in empty] if isinstance(empty, list) else [],
        errors={str(n): str(e) for n, e in errors.items()} if isinstance(errors, dict) else {},
    )


def _int_or(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def drain_ops(drain_rows: list[dict]) -> tuple[list[DrainOp], list[DrainSpan]]:
    """Pair each drain invoke with the next completion of the same drainer and queue."""
    ops: list[DrainOp] = []
    spans: list[DrainSpan] = []
    open_ops: dict[tuple[str, str | None], list[tuple[int, DrainOp]]] = {}
    for r in sorted(drain_rows, key=lambda r: r["index"]):
        key = (r["process"], r.get("queue"))
        if r.get("type") == "invoke":
            op = DrainOp(
                process=r["process"],
                queue=r.get("queue"),
                outcome="open",
                error=None,
                consumed=None,
                nodes={},
                rounds=[],
                end_ns=None,
                gone={},
            )
            ops.append(op)
            open_ops.setdefault(key, []).append((r["index"], op))
            continue
        waiting = open_ops.get(key)
        if not waiting:
            continue
        lo, op = waiting.pop(0)
        value = load_json(r.get("value"))
        raw_nodes = value.get("nodes")
        nodes: dict = raw_nodes if isinstance(raw_nodes, dict) else {}
        consumed = value.get("consumed")
        op["outcome"] = outcome_of(r.get("type"))  # type: ignore[typeddict-item]
        op["error"] = r.get("error")
        op["consumed"] = consumed if isinstance(consumed, int) and not isinstance(consumed, bool) else None
        op["nodes"] = {str(n): _node_view(v) for n, v in sorted(nodes.items())}
        op["end_ns"] = r["time_ns"]
        gone = value.get("gone") if op["outcome"] == "ok" else None
        op["gone"] = {str(n): str(w) for n, w in sorted(gone.items())} if isinstance(gone, dict) else {}
        rounds = value.get("rounds")
        op["rounds"] = [_round(x) for x in rounds if isinstance(x, dict)] if isinstance(rounds, list) else []
        for n, v in op["nodes"].items():
            t = v["empty_at_ns"]
            if isinstance(t, int) and not isinstance(t, bool):
                spans.append(
                    DrainSpan(
                        process=r["process"],
                        queue=r.get("queue"),
                        lo=lo,
                        hi=r["index"],
                        node=n,
                        empty_at_ns=t,
                    )
                )
    return ops, spans


@dataclass(frozen=True)
class DrainRange:
    """One drain op's index range: an ack by its drainer on its queue inside it was the drain's read."""

    process: str
    queue: str | None
    lo: int  # the drain's invoke index
    hi: int  # its completion's index (NO_LIMIT_INDEX when it never completed)


def drain_ranges(drain_rows: list[dict]) -> list[DrainRange]:
    """Every drain op's (drainer, queue, invoke index, completion index)."""
    out: list[DrainRange] = []
    open_ops: dict[tuple[str, str | None], list[int]] = {}
    for r in sorted(drain_rows, key=lambda r: r["index"]):
        key = (r["process"], r.get("queue"))
        if r.get("type") == "invoke":
            open_ops.setdefault(key, []).append(r["index"])
        elif open_ops.get(key):
            out.append(DrainRange(key[0], key[1], open_ops[key].pop(0), r["index"]))
    out += [DrainRange(p, q, lo, NO_LIMIT_INDEX) for (p, q), los in open_ops.items() for lo in los]
    return sorted(out, key=lambda d: d.lo)


def drain_read(ranges: list[DrainRange], process: str, queue: str | None, index: int) -> bool:
    """Whether an ack (its process, queue and index) was a drain's read."""
    return any(d.process == process and d.queue == queue and d.lo < index < d.hi for d in ranges)


def drain_status(drain_rows: list[dict]) -> Drain:
    """A drain counts as complete only if every drain op's last completion, per drainer and queue, is ok."""
    ops, _ = drain_ops(drain_rows)
    last: dict[tuple[str, str | None], DrainOp] = {}
    for op in ops:
        last[(op["process"], op["queue"])] = op
    completed = bool(ops) and all(op["outcome"] == "ok" for op in last.values())
    oks = [r["time_ns"] for r in drain_rows if r.get("type") == "ok"]
    return Drain(invoked=len(ops), completed=completed, end_ns=max(oks) if oks else None, ops=ops)


def split_brain_nodes(
    spans: list[DrainSpan], process: str, queue: str | None, index: int, time_ns: int, node: str | None
) -> list[EmptyNode]:
    """The other nodes of the drain op holding this ack that had reported empty before it."""
    hits = {
        (s.empty_at_ns, s.node)
        for s in spans
        if s.process == process
        and s.queue == queue
        and s.lo < index < s.hi
        and s.node != node
        and time_ns > s.empty_at_ns
    }
    return [EmptyNode(node=n, empty_at_ns=t) for t, n in sorted(hits)]


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _held_for_no_one(look: dict) -> bool:
    """A look that found unacked deliveries nobody of the harness's could hold: no other client
    connection open on the queue, none held by the drain, nothing ready."""
    return (
        look["ready"] == 0
        and (look["unacked"] or 0) > 0
        and look["clients"] == 0
        and look["own_unacked"] == 0
    )


def stuck_queues(drain_rows: list[dict], depth_rows: list[dict]) -> tuple[list[StuckQueue], bool]:
    """Nodes whose last look (``depth`` op) within a drain that did not finish found deliveries held
    for no consumer, and whether that explains every drain that did not finish.

    A drain op (drainer, queue) whose last completion is not ok is explained when its completion
    names its nodes and each node's last look in it was ok and found the queue either empty
    (nothing ready or unacked) or held for no one (``_held_for_no_one``), at least one so. A
    node never looked at, a look that failed, or ready messages leave it unexplained: what the
    harness could not establish stays unknown.
    """
    looks = _looks(depth_rows)
    out: list[StuckQueue] = []
    unfinished = explained = 0
    for (process, queue), (lo, hi, outcome, names) in sorted(
        _last_ops(drain_rows).items(), key=lambda kv: kv[1][0]
    ):
        if outcome == "ok":
            continue
        unfinished += 1
        mine = [x for x in looks.get((process, queue), []) if lo < x["index"] < hi]
        found: list[StuckQueue] = []
        whole = bool(names)
        for node in names:
            at = [x for x in mine if x["node"] == node]
            last = at[-1] if at else None
            if last is None or not last["ok"]:
                whole = False
            elif _held_for_no_one(last):
                found.append(_stuck(queue, node, process, at))
            elif not (last["ready"] == 0 and last["unacked"] == 0):
                whole = False
        out += found
        explained += whole and bool(found)
    return out, bool(out) and unfinished > 0 and explained == unfinished


def _looks(depth_rows: list[dict]) -> dict[tuple[str, str | None], list[dict]]:
    """Per drain op (drainer, queue), its completed looks at a node's queue depth, in order."""
    looks: dict[tuple[str, str | None], list[dict]] = {}
    pending: dict[tuple[str, str | None, str | None], int] = {}
    for r in sorted(depth_rows, key=lambda r: r["index"]):
        key = (r["process"], r.get("queue"), r.get("node"))
        if r.get("type") == "invoke":
            pending[key] = r["index"]
            continue
        if pending.pop(key, None) is None:
            continue
        v = load_json(r.get("value")) if r.get("type") == "ok" else {}
        looks.setdefault((r["process"], r.get("queue")), []).append(
            {
                "index": r["index"],
                "time_ns": r["time_ns"],
                "node": r.get("node"),
                "ok": r.get("type") == "ok",
                "ready": _count(v.get("ready")),
                "unacked": _count(v.get("unacked")),
                "own_unacked": _count(v.get("own_unacked")),
                "clients": _count(v.get("clients")),
                "holders": v.get("holders") if isinstance(v.get("holders"), list) else None,
            }
        )
    return looks


def _last_ops(drain_rows: list[dict]) -> dict[tuple[str, str | None], tuple[int, int, str, list[str]]]:
    """Per drain op (drainer, queue), its last one: invoke index, completion index, outcome, nodes."""
    last_op: dict[tuple[str, str | None], tuple[int, int, str, list[str]]] = {}
    invoked: dict[tuple[str, str | None], int] = {}
    for r in sorted(drain_rows, key=lambda r: r["index"]):
        op = (r["process"], r.get("queue"))
        if r.get("type") == "invoke":
            invoked[op] = r["index"]
            last_op[op] = (r["index"], NO_LIMIT_INDEX, "open", [])
        elif op in invoked:
            nodes = load_json(r.get("value")).get("nodes")
            names = sorted(str(n) for n in nodes) if isinstance(nodes, dict) else []
            last_op[op] = (invoked.pop(op), r["index"], outcome_of(r.get("type")), names)
    return last_op


def _stuck(queue: str | None, node: str, process: str, at: list[dict]) -> StuckQueue:
    """A node's queue held for no one: since the first of the run of such looks that ends its last."""
    last = at[-1]
    run = []
    for x in reversed(at):
        if not (x["ok"] and _held_for_no_one(x)):
            break
        run.append(x)
    return StuckQueue(
        queue=queue,
        node=node,
        drainer=process,
        unacked=last["unacked"] or 0,
        ready=0,
        since_ns=run[-1]["time_ns"],
        last_ns=last["time_ns"],
        looks=len(run),
        holders=last["holders"],
    )


def held_text(stuck: list[StuckQueue]) -> str:
    """Where the stuck deliveries are, for a reason line: node, queue, count reported, since when."""
    return "; ".join(
        f"{q['node']} reported {q['unacked']:,} unacked on {q['queue']} from {q['since_ns'] / NS_PER_S:.1f} s "
        f"to {q['last_ns'] / NS_PER_S:.1f} s with no client connection of the harness open"
        for q in stuck
    )
