"""Generated histories with planted anomalies: the Python engine must find exactly
what was planted, and the Spark job must return exactly what the Python engine does.

The planted truth is read off the generated records by the definitions taken
literally (quadratic loops, no shared code with either engine).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harness.spec import body_digest, message_body
from spark_reports import check_python
from spark_reports.synth import HistoryBuilder
from tests.factories import fixture_settings

NODES = ["n1", "n2", "n3", None]
KINDS = ["partition", "kill", "pause", "power-loss"]
CAUSES = ["requeue", "recover", "close", "crash"]
SEED, SIZE = 11, 80
DRAIN_QUEUE = "q1"


_DELIVERY = st.fixed_dictionaries(
    {
        "consumer": st.sampled_from(["c1", "c2", "d1"]),
        "node": st.sampled_from(NODES),
        "queue": st.sampled_from(["q1", "q2", "q1.dead"]),  # q1.dead: q1's dead-letter queue
        "redelivered": st.booleans(),
        "ack": st.sampled_from(["ok", "ok", "info", "fail", None]),
        "abandon": st.sampled_from([None, None, *CAUSES]),
        "corrupt": st.sampled_from([False, False, False, True]),
    }
)
"""One delivery of a plan's message: to whom, from where, and how it ended."""


@st.composite
def plans(draw: st.DrawFn) -> dict:
    """A history plan: what each message went through, in an order hypothesis picks."""
    messages = _messages(draw)
    unexpected = [
        {"id": f"x{i}:{i}", "deliveries": draw(st.lists(_DELIVERY, min_size=1, max_size=2))}
        for i in range(draw(st.integers(0, 2)))
    ]
    faults = [
        {
            "id": f"f{i}",
            "kind": draw(st.sampled_from(KINDS)),
            "node": draw(st.sampled_from(NODES)),
            "healed": draw(st.booleans()),
            "applied": draw(st.booleans()),
        }
        for i in range(draw(st.integers(0, 3)))
    ]
    # stuck: the drain ends info with n1 still holding unacked deliveries for no consumer and the
    # other nodes empty (depth ops); stuck-open: the same, but a consumer connection still open;
    # gone: the drain ends ok because every node answered that the queue does not exist.
    drain = draw(
        st.sampled_from(["complete", "complete", "info", "incomplete", "none", "stuck", "stuck-open", "gone"])
    )
    return {
        "messages": messages,
        "unexpected": unexpected,
        "faults": faults,
        "stream": _stream(draw, messages, unexpected, faults, drain),
        "drain": drain,
        "empty_at": draw(st.lists(st.one_of(st.none(), st.floats(0, 1)), min_size=3, max_size=3)),
        "bodies": draw(st.booleans()),
        "dead_letter": draw(st.booleans()),  # the scenario asks for dead-lettering (workload.dead_letter)
        "budgets": {
            "duplicated": draw(st.sampled_from([None, 0, 1, 3])),
            "resurrected": draw(st.sampled_from([None, 0, 1])),
            "recovery_s": draw(st.sampled_from([None, None, 0.001, 2, {"partition": 0.5, "kill": 30}])),
        },
        "step": draw(st.sampled_from([1_000, 1_000_000, 700_000_001])),
        "holdings": _holdings(draw, [m["id"] for m in messages]),
    }


def _messages(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Each producer's messages: the outcomes of their publishes and their deliveries."""
    messages: list[dict[str, Any]] = []
    for p in range(1, draw(st.integers(1, 3)) + 1):
        for seq in range(1, draw(st.integers(0, 7)) + 1):
            outcomes = draw(st.lists(st.sampled_from(["ok", "fail", "info", None]), min_size=1, max_size=2))
            messages.append(
                {
                    "id": f"p{p}:{seq}",
                    "outcomes": outcomes,
                    "deliveries": draw(st.lists(_DELIVERY, max_size=3)),
                    "node": draw(st.sampled_from(NODES)),
                    "queue": draw(st.sampled_from(["q1", "q2"])),
                }
            )
    return messages


def _stream(
    draw: st.DrawFn, messages: list[dict], unexpected: list[dict], faults: list[dict], drain: str
) -> list:
    """One event stream: publishes in seq order per producer; a delivery's own steps (ack written,
    ack completed, abandon) after it; everything else placed anywhere by drawing each position."""
    events: list[tuple] = [("publish", m) for m in messages]
    for m in messages + unexpected:
        for k, d in enumerate(m["deliveries"]):
            events.append(("deliver", m["id"], k, d))
            if d["ack"] is not None:
                events += [("ack_invoke", m["id"], k, d), ("ack_done", m["id"], k, d)]
            if d["abandon"] is not None:
                events.append(("abandon", m["id"], k, d))
    ids = [m["id"] for m in messages]
    if ids:  # ordered readers' reads and seeks, placed anywhere like the rest
        read = st.tuples(
            st.sampled_from(["r1", "r2"]), st.integers(1, 8), st.sampled_from(ids), st.booleans()
        )
        events += [("read", x) for x in draw(st.lists(read, max_size=6))]
    events += [("fault", f) for f in faults]
    events += [("heal", f) for f in faults if f["healed"]]
    if drain != "none":
        events.append(("drain_invoke",))
    order = draw(st.permutations(range(len(events))))
    stream: list = [events[i] for i in order]
    _keep_in_order(
        stream,
        lambda e: e[0] == "publish",
        lambda e: e[1]["id"].split(":")[0],
        lambda e: int(e[1]["id"].split(":")[1]),
    )
    _keep_in_order(
        stream, lambda e: e[0] in ("fault", "heal"), lambda e: e[1]["id"], lambda e: e[0] == "heal"
    )
    rank = {"deliver": 0, "ack_invoke": 1, "abandon": 1, "ack_done": 2}
    _keep_in_order(stream, lambda e: e[0] in rank, lambda e: (e[1], e[2]), lambda e: rank[e[0]])
    return stream


def _holdings(draw: st.DrawFn, ids: list[str]) -> dict:
    """Each node's copy after the drain: none recorded, "info", or (offset, id) entries."""
    return {
        n: draw(
            st.one_of(
                st.none(),
                st.just("info"),
                st.lists(st.tuples(st.integers(1, 8), st.sampled_from(ids)), max_size=6)
                if ids
                else st.just([]),
            )
        )
        for n in ("n1", "n2", "n3")
    }


def _keep_in_order(stream: list, member, group, key) -> None:
    """Within each group, put the members back in key order at the positions the group holds."""
    slots: dict = {}
    for pos, e in enumerate(stream):
        if member(e):
            slots.setdefault(group(e), []).append(pos)
    for positions in slots.values():
        for pos, e in zip(positions, sorted((stream[p] for p in positions), key=key), strict=True):
            stream[pos] = e


def _p1(seq: int, *outcomes: str) -> dict[str, Any]:
    return {"id": f"p1:{seq}", "outcomes": list(outcomes), "deliveries": [], "node": "n1", "queue": "q1"}


_LAST_FAILS = [_p1(1, "ok"), _p1(2, "ok"), _p1(3, "ok"), _p1(4, "ok", "fail")]
LAST_PUBLISH_FAILS: dict[str, Any] = {
    "messages": _LAST_FAILS,
    "unexpected": [],
    "faults": [],
    "stream": [*(("publish", m) for m in _LAST_FAILS), ("drain_invoke",)],
    "drain": "complete",
    "empty_at": [None, None, None],
    "bodies": False,
    "dead_letter": False,
    "budgets": {"duplicated": None, "resurrected": None, "recovery_s": None},
    "step": 700_000_001,
    "holdings": {"n1": None, "n2": None, "n3": None},
}
"""Found by hypothesis: one producer, publishes confirmed at 1.4 s to 5.6 s, a retry of the last one
failing at 7.0 s (the workload's last op), no consume, no fault, then a drain that completed (every
node empty) at 8.4 s. Consume has a window from 0.7 s to 7.0 s that runs to its span's end; every
publish ok in it is within the outage threshold of its start, so the whole queue was quiet over it
and the drain answered after it: the queue came back after the workload ended, not UNAVAILABLE
(LOST 4 for what the drain did not find)."""


def _d1(consumer: str = "c1") -> dict[str, Any]:
    return {
        "consumer": consumer,
        "node": "n2",
        "queue": "q1",
        "redelivered": False,
        "ack": "ok",
        "abandon": None,
        "corrupt": False,
    }


_BRACKETED = [
    {**_p1(1, "ok"), "deliveries": [_d1()]},
    {**_p1(2, "ok"), "deliveries": [_d1()]},
    _p1(3, "fail"),
    _p1(4, "fail"),
]
_BRACKETED_D = [("deliver", m["id"], 0, m["deliveries"][0]) for m in _BRACKETED[:2]]
QUIET_BETWEEN_ACKS: dict[str, Any] = {
    **LAST_PUBLISH_FAILS,
    "messages": _BRACKETED,
    "stream": [
        ("publish", _BRACKETED[0]),
        ("publish", _BRACKETED[1]),
        _BRACKETED_D[0],
        ("ack_invoke", *_BRACKETED_D[0][1:]),
        ("publish", _BRACKETED[2]),
        ("ack_done", *_BRACKETED_D[0][1:]),
        _BRACKETED_D[1],
        ("ack_invoke", *_BRACKETED_D[1][1:]),
        ("publish", _BRACKETED[3]),
        ("ack_done", *_BRACKETED_D[1][1:]),
        ("drain_invoke",),
    ],
}
"""The last publish confirmed at 2.8 s, publishes refused until 10.5 s (the workload's last publish
record), acks at 7.0 s and 11.2 s (4.2 s apart: no gap over the threshold between them), then a
completed drain. No ack from the threshold past the publish window's start (7.8 s) to its end, so
the whole queue was quiet there, and the later ack and the drain answer it: no queue that never
came back, though the two acks less than the threshold apart bracket that stretch (the engine
once decided from the gaps over the threshold alone and said UNAVAILABLE)."""


def scenario(plan: dict) -> dict:
    s: dict = {"budgets": plan["budgets"], "workload": {"dead_letter": plan.get("dead_letter", True)}}
    if plan["bodies"]:
        s |= {"seed": SEED, "workload": {**s["workload"], "message_size": SIZE}}
    return s


def build(plan: dict) -> HistoryBuilder:
    b = HistoryBuilder(step_ns=plan["step"], seed=SEED, message_size=SIZE)
    for e in plan["stream"]:
        if e[0] == "publish":
            m = e[1]
            for o in m["outcomes"]:
                b.publish(m["id"], o, node=m["node"], queue=m["queue"])
        elif e[0] == "fault":
            f = e[1]
            b.fault(f["id"], f["kind"], node=f["node"], applied=f["applied"])
        elif e[0] == "heal":
            b.heal(e[1]["id"])
        elif e[0] == "drain_invoke":
            b.drain_invoke(queue=DRAIN_QUEUE)
        elif e[0] == "read":
            reader, offset, mid, seek = e[1]
            if seek:
                b.seek(offset, reader=reader, queue=DRAIN_QUEUE)
            else:
                b.read(mid, offset, reader=reader, queue=DRAIN_QUEUE)
        else:
            mid, d = e[1], e[3]
            where = {"node": d["node"], "queue": d["queue"]}
            if e[0] == "deliver":
                body = b.body(mid)[: len(mid) + 3] if d["corrupt"] else None
                b.deliver(mid, consumer=d["consumer"], redelivered=d["redelivered"], body=body, **where)
            elif e[0] == "ack_invoke":
                b.op(d["consumer"], "invoke", "ack", mid, **where)
            elif e[0] == "ack_done":
                b.op(d["consumer"], d["ack"], "ack", mid, **where)
            else:
                b.abandon(mid, d["abandon"], consumer=d["consumer"], **where)
    if plan["drain"].startswith("stuck"):
        clients = 1 if plan["drain"] == "stuck-open" else 0
        b.depth("n1", 0, 4, clients=clients, queue=DRAIN_QUEUE)
        b.depth("n2", 0, 0, clients=clients, queue=DRAIN_QUEUE)
        b.depth("n3", 0, 0, clients=clients, queue=DRAIN_QUEUE)
        b.depth("n1", 0, 4, clients=clients, queue=DRAIN_QUEUE)
    if plan["drain"] in ("complete", "info", "stuck", "stuck-open", "gone"):
        end = b.t
        nodes = {
            f"n{i + 1}": {
                "consumed": 0,
                "ready": 0,
                "unacked": 0,
                "error": None,
                "empty_at_ns": None if x is None else int(x * end),
            }
            for i, x in enumerate(plan["empty_at"])
        }
        b.drain_done(
            queue=DRAIN_QUEUE,
            outcome="ok" if plan["drain"] in ("complete", "gone") else "info",
            nodes=nodes,
            gone={n: "no such queue" for n in nodes} if plan["drain"] == "gone" else None,
        )
    for node, held in plan["holdings"].items():
        if held is not None:
            b.holdings(node, None if held == "info" else held, queue=DRAIN_QUEUE)
    return b


def truth(plan: dict, rows: list[dict]) -> dict:
    """What was planted, by the definitions read literally over the records."""
    ids = [m["id"] for m in plan["messages"]] + [u["id"] for u in plan["unexpected"]]
    attempted = {m["id"] for m in plan["messages"]}
    confirmed = {m["id"] for m in plan["messages"] if "ok" in m["outcomes"]}
    of = {mid: [r for r in rows if r["value"] == mid] for mid in ids}
    drain = [r for r in rows if r["f"] == "drain"]
    out: dict = {
        k: []
        for k in (
            "lost",
            "ack_unknown",
            "unexpected",
            "recovered",
            "duplicated",
            "resurrected",
            "corrupted",
            "split_brain",
        )
    }
    out["causes"], out["unflagged"], out["dead_lettered"] = {}, 0, 0
    for mid in ids:
        rs = of[mid]
        deliveries = [r for r in rs if r["f"] == "consume" and r["type"] == "ok"]
        ack_oks = [r for r in rs if r["f"] == "ack" and r["type"] == "ok"]
        abandons = [r for r in rs if r["f"] == "abandon" and r["type"] == "invoke"]
        consumed = bool(ack_oks)
        out["dead_lettered"] += any(r["queue"].endswith(".dead") for r in ack_oks)
        if mid in confirmed and not consumed:
            if any(all(d["index"] < a["index"] for d in deliveries) for a in _unknown_acks(rs)):
                out["ack_unknown"].append(mid)
            else:
                out["lost"].append(mid)
                out["causes"][mid] = _loss_cause(deliveries, abandons)
        if mid not in attempted and consumed:
            out["unexpected"].append(mid)
        if mid in attempted and mid not in confirmed and consumed:
            out["recovered"].append(mid)
        if len(ack_oks) > 1:  # consumed twice; redeliveries a consumer asked for are not duplicates
            out["duplicated"].append(mid)
        if any(d["index"] > a["index"] for d in deliveries for a in ack_oks):
            out["resurrected"].append(mid)
        if plan["bodies"] and mid in attempted:
            want = body_digest(message_body(mid, SEED, SIZE))
            if any(d["digest"] is not None and d["digest"] != want for d in deliveries):
                out["corrupted"].append(mid)
        out["unflagged"] += sum(
            1
            for d in deliveries
            if d["redelivered"] is not True and any(a["index"] < d["index"] for a in abandons)
        )
        if ack_oks and len(drain) == 2 and _acked_past_an_empty_node(ack_oks, drain):
            out["split_brain"].append(mid)
    return {k: sorted(v) if isinstance(v, list) else v for k, v in out.items()}


def _unknown_acks(rs: list[dict]) -> list[dict]:
    """The ack invokes of one message whose completion was ``info``, paired per process in order."""
    unknown_acks = []
    for r in rs:
        if r["f"] == "ack" and r["type"] == "info":
            same = [x for x in rs if x["f"] == "ack" and x["process"] == r["process"]]
            nth = [x for x in same if x["type"] != "invoke" and x["index"] <= r["index"]]
            invokes = [x for x in same if x["type"] == "invoke" and x["index"] < r["index"]]
            if len(invokes) >= len(nth):
                unknown_acks.append(invokes[len(nth) - 1])
    return unknown_acks


def _loss_cause(deliveries: list[dict], abandons: list[dict]) -> str:
    """Why a lost message was lost, told from its deliveries and the abandons after the last one."""
    last_d = max((d["index"] for d in deliveries), default=None)
    later = [a for a in abandons if last_d is not None and a["index"] > last_d]
    return (
        "never delivered"
        if not deliveries
        else "abandoned delivery never redelivered"
        if later
        else "delivered, never acked"
    )


def _acked_past_an_empty_node(ack_oks: list[dict], drain: list[dict]) -> bool:
    """The first ack came from the drainer during the drain, after another node had reported the queue empty."""
    a = min(ack_oks, key=lambda r: r["index"])
    inv, done = drain
    nodes = _json(done["value"])["nodes"]
    return (
        a["process"] == "d1"
        and a["queue"] == DRAIN_QUEUE
        and inv["index"] < a["index"] < done["index"]
        and any(
            n != a["node"] and v["empty_at_ns"] is not None and a["time_ns"] > v["empty_at_ns"]
            for n, v in nodes.items()
        )
    )


def _json(text: str) -> dict:
    import json

    return json.loads(text)


def anomaly_truth(plan: dict, t: dict, rows: list[dict]) -> dict:
    """Jepsen's classes by their definitions read literally over the records."""
    confirmed = {m["id"] for m in plan["messages"] if "ok" in m["outcomes"]}
    got = {r["value"] for r in rows if r["f"] in ("consume", "ack") and r["type"] == "ok"}
    out = dict.fromkeys(("lost_prefix", "lost_middle", "lost_postfix"), 0)
    if plan["drain"] in ("complete", "gone"):
        for mid in t["lost"]:
            p, seq = mid.split(":")
            alive = [int(x.split(":")[1]) for x in got if x.split(":")[0] == p]
            if alive and int(seq) < min(alive):
                out["lost_prefix"] += 1
            elif alive and int(seq) < max(alive):
                out["lost_middle"] += 1
            else:
                out["lost_postfix"] += 1
    copies = {n: h for n, h in plan["holdings"].items() if isinstance(h, list)}
    held = {mid for h in copies.values() for _o, mid in h}
    out["lost_on_node"] = sum(
        1 for h in copies.values() for mid in held & confirmed if mid not in {m for _o, m in h}
    )
    reads = [r for r in rows if r["f"] == "read" and r["type"] == "ok"]
    seen = {(o, m, n) for n, h in copies.items() for o, m in h}
    seen |= {(_json(r["detail"])["stream_seq"], r["value"], r["process"]) for r in reads}
    offsets = {o for o, _m, _s in seen}
    out["inconsistent_offsets"] = sum(1 for o in offsets if len({m for oo, m, _s in seen if oo == o}) > 1)
    out["duplicate"] = sum(
        1 for mid in {m for _o, m, _s in seen} if len({o for o, m, _s in seen if m == mid}) > 1
    )
    out["poll_skip"] = out["nonmonotonic_poll"] = 0
    for reader in ("r1", "r2"):
        steps = [
            (_json(r["detail"])["stream_seq"] - (r["f"] == "seek"), r["f"] == "seek")
            for r in rows
            if r["process"] == reader and r["type"] == "ok"
        ]
        for (lo, _), (off, seek) in zip(steps, steps[1:], strict=False):
            if seek:
                continue
            if off <= lo:
                out["nonmonotonic_poll"] += 1
            elif any(lo < o < off for o in offsets):
                out["poll_skip"] += 1
    read_ids = {r["value"] for r in reads}
    out["unseen"] = len({mid for mid in held & confirmed if mid not in got and mid not in read_ids})
    return out


def brute_force_order_violations(rows: list[dict]) -> int:
    """The definition read literally: a first delivery below an earlier one's seq, same consumer/queue/producer."""
    seen: list[tuple] = []
    n = 0
    for r in rows:
        if r["f"] != "consume" or r["type"] != "ok" or r["redelivered"] is True:
            continue
        producer, seq = r["value"].rsplit(":", 1)
        key = (r["process"], r["queue"], producer)
        if any(k == key and s > int(seq) for k, s in seen):
            n += 1
        seen.append((key, int(seq)))
    return n


THRESHOLD_NS = 5_000_000_000


def live_truth(plan: dict, rows: list[dict]) -> dict:
    """Liveness by its definitions read literally: per healed fault and queue, the first publish ok
    and the first consume (ack ok, or the queue's drain ok) at or after the heal; the queues with no
    ok of any kind after the last heal; the gaps of more than the threshold between oks."""
    client = [r for r in rows if r["process"] != "nemesis" and r["value"] is not None and r["queue"]]
    queues = sorted(
        {
            r["queue"]
            for r in client
            if r["f"] in ("publish", "ack") and (r["f"] == "publish" or r["type"] == "ok")
        }
    )
    drains = [r for r in rows if r["f"] == "drain" and r["type"] != "invoke"]
    heals = _heals(plan, [r for r in rows if r["process"] == "nemesis"])
    recovery, over, demands = _recovery(plan, heals, queues, client, drains)
    end = max((r["time_ns"] for r in rows), default=0)
    gaps, stops = _gaps(queues, client, drains, end)
    answers = (drains, [h for _f, _k, h in heals])
    down = []
    if heals:
        last = max(h for _f, _k, h in heals)
        fid = next(f for f, _k, h in heals if h == last)
        for q in queues:
            recovered, pub0, cons0, _took = recovery[(fid, q)]
            if recovered:
                continue
            demand, asked = demands[(fid, q)]
            missing = (["publish"] if demand and pub0 is None else []) + (
                ["consume"] if asked and cons0 is None else []
            )
            if [k for k in missing if not _answered_later(client, answers, q, k, last, stops[(q, k)])]:
                down.append(q)
    down += sorted(
        {
            g[0]
            for g in gaps
            if not g[4] and g[0] not in down and not _answered_later(client, answers, g[0], g[1], g[2], g[3])
        }
    )
    return {"recovery": recovery, "over": over, "down": sorted(down), "gaps": sorted(gaps)}


def _oks(client: list[dict], q: str, kind: str) -> list[int]:
    """The times of queue ``q``'s publishes (``publish``) or acks (``consume``) that ended ok."""
    f = "publish" if kind == "publish" else "ack"
    return sorted(r["time_ns"] for r in client if r["queue"] == q and r["f"] == f and r["type"] == "ok")


def _answered_later(
    client: list[dict], answers: tuple[list[dict], list[int]], q: str, kind: str, a: int, b: int
) -> bool:
    """Failing only while the whole queue was quiet (no ok of the other kind from the outage
    threshold past the last heal that began inside the window, or past its start: an ok sooner than
    that, such as the delivery of the last confirmed publish, is no kind served), and the queue
    answered after: an ok of the other kind, or a drain whose last op ended ok because every node
    reported the queue empty (not because every node said it does not exist)."""
    drains, heal_starts = answers
    since = max((h for h in heal_starts if a <= h <= b), default=a) + THRESHOLD_NS
    other = _oks(client, q, "consume" if kind == "publish" else "publish")
    mine = sorted((r["time_ns"], _answer(r)) for r in drains if r["queue"] == q)
    drained = bool(mine) and mine[-1][1] and mine[-1][0] > b
    return not any(since <= x <= b for x in other) and (drained or any(x > b for x in other))


def _answer(drain: dict) -> bool:
    """A drain completion that is the queue's answer: ok, and no node said the queue does not exist."""
    return drain["type"] == "ok" and not _json(drain["value"]).get("gone")


def _heals(plan: dict, nemesis: list[dict]) -> list[tuple[str, str, int]]:
    """Each healed fault's id, kind and the invoke of its heal (recovery is measured from it)."""
    heals: list[tuple[str, str, int]] = []
    for f in plan["faults"]:
        start = min(
            r["time_ns"]
            for r in nemesis
            if r["f"] == f["kind"] and _json(r["value"]).get("fault_id") == f["id"]
        )
        ends = _heal_times(nemesis, f["id"], "ok", start)
        if ends:
            began = _heal_times(nemesis, f["id"], "invoke", start, min(ends))
            heals.append((f["id"], f["kind"], max(began)))
    return heals


def _heal_times(nemesis: list[dict], fault_id: str, type_: str, lo: int, hi: float = math.inf) -> list[int]:
    """When the heals of ``fault_id`` were written as ``type_`` (invoke or ok), from ``lo`` to ``hi``."""
    return [
        r["time_ns"]
        for r in nemesis
        if r["f"] == "heal"
        and r["type"] == type_
        and fault_id in _json(r["value"])["fault_ids"]
        and lo <= r["time_ns"] <= hi
    ]


def _recovery(
    plan: dict, heals: list[tuple[str, str, int]], queues: list[str], client: list[dict], drains: list[dict]
) -> tuple[dict, list[str], dict[tuple[str, str], tuple[bool, bool]]]:
    """Per heal and queue: whether it recovered, its first publish and consume after the heal, how
    long it took; the pairs over the budget; whether a publish (demand) and a consume were asked."""
    drain_ok = {q: [r["time_ns"] for r in drains if _answer(r) and r["queue"] == q] for q in queues}
    budget = plan["budgets"]["recovery_s"]
    recovery, over = {}, []
    demands: dict[tuple[str, str], tuple[bool, bool]] = {}
    for fid, kind, h in heals:
        for q in queues:
            pub = [t - h for t in _oks(client, q, "publish") if t >= h]
            cons = [t - h for t in _oks(client, q, "consume") + drain_ok[q] if t >= h]
            demand = any(
                r["f"] == "publish"
                and r["type"] == "invoke"
                and r["queue"] == q
                and r["time_ns"] - h > THRESHOLD_NS
                for r in client
            )
            before_pub = [t for t in _oks(client, q, "publish") if t < h]
            before_cons = [t for t in _oks(client, q, "consume") if t < h]
            asked = bool(pub) or (
                bool(before_pub) and (not before_cons or max(before_pub) > max(before_cons))
            )
            recovered = (bool(cons) or not asked) and (bool(pub) or not demand)
            times = ([min(cons)] if asked and cons else []) + ([min(pub)] if demand and pub else [])
            took = max(times) if recovered and times else None
            b = budget.get(kind) if isinstance(budget, dict) else budget
            if b is not None and (not recovered or (took is not None and took > b * 1e9)):
                over.append(f"{fid} {q}")
            recovery[(fid, q)] = (recovered, min(pub) if pub else None, min(cons) if cons else None, took)
            demands[(fid, q)] = (demand, asked)
    return recovery, over, demands


def _gaps(
    queues: list[str], client: list[dict], drains: list[dict], end: int
) -> tuple[set[tuple], dict[tuple[str, str], int]]:
    """The gaps of more than the threshold between a queue's oks of a kind (``by_ok``: ended by
    one), and each queue and kind's span end."""
    gaps = set()
    stops: dict[tuple[str, str], int] = {}
    for q in queues:
        pubs = [r for r in client if r["queue"] == q and r["f"] == "publish"]
        invokes = [r["time_ns"] for r in pubs if r["type"] == "invoke"]
        for kind in ("publish", "consume"):
            ts = _oks(client, q, kind)
            everything = _oks(client, q, "publish") + _oks(client, q, "consume")
            start = min(invokes) if invokes else min(everything)
            if kind == "publish":
                stop = max(r["time_ns"] for r in pubs) if pubs else start
            else:
                mine = [r for r in drains if r["queue"] == q]
                if mine and _answer(mine[-1]):
                    stop = max([r["time_ns"] for r in pubs] + _oks(client, q, "consume"), default=start)
                else:
                    stop = max(r["time_ns"] for r in mine) if mine else end
            stop = stops[(q, kind)] = max(stop, start)
            points = (
                [(start, False), *[(t, True) for t in ts], (stop, False)]
                if ts
                else [(start, True), (stop, False)]
            )
            for (a, _), (b, by_ok) in zip(points, points[1:], strict=False):
                if kind == "consume" and pubs and by_ok:
                    # no consume is asked after the workload's end (its last publish record)
                    workload_end = max(r["time_ns"] for r in pubs)
                    if a >= workload_end:
                        continue
                    b = min(b, workload_end)
                if b - a > THRESHOLD_NS:
                    gaps.add((q, kind, a, b, by_ok))
    return gaps, stops


def expected_verdict(plan: dict, t: dict, live: dict, anomalies: dict | None = None) -> tuple:
    if t["lost"] and plan["drain"] in ("complete", "stuck", "gone"):
        return False, "LOST"  # after a finished drain, or held unacked by no consumer (stuck)
    stream = ("lost_on_node", "inconsistent_offsets", "duplicate", "poll_skip", "nonmonotonic_poll")
    if t["unexpected"] or t["corrupted"] or any((anomalies or {}).get(k) for k in stream):
        return False, "INTEGRITY"
    if t["dead_lettered"] and not plan.get("dead_letter", True):
        return False, "DEAD_LETTERED"
    budgets = plan["budgets"]
    for name, verdict in (("resurrected", "RESURRECTED"), ("duplicated", "DUPLICATED")):
        if budgets[name] is not None and len(t[name]) > budgets[name]:
            return False, verdict
    if live["down"] or live["over"]:
        return False, "UNAVAILABLE"
    if t["lost"]:
        return "unknown", "unknown"
    return True, "durable"


@settings(max_examples=200, deadline=None)
@given(plans())
@example(LAST_PUBLISH_FAILS)
@example(QUIET_BETWEEN_ACKS)
def test_python_finds_exactly_what_was_planted(plan: dict) -> None:
    b = build(plan)
    t = truth(plan, b.rows)
    with tempfile.TemporaryDirectory() as d:
        r = check_python(b.write(Path(d), jsonl=False), scenario(plan))
    if plan["drain"] == "stuck":  # what the drain could not obtain is stuck, not lost
        assert (r["lost"], r["lost_detail"], r["counts"]["lost"]) == ([], [], 0)
        assert sorted(d["id"] for d in r["stuck_detail"]) == t["lost"]
        assert r["counts"]["stuck"] == len(t["lost"])
        assert {d["cause"] for d in r["stuck_detail"]} <= {"held unacked by no consumer"}
        assert [(q["node"], q["unacked"], q["looks"]) for q in r["stuck"]] == [("n1", 4, 2)]
    else:
        assert sorted(r["lost"]) == t["lost"]
        assert {d["id"]: d["cause"] for d in r["lost_detail"]} == t["causes"]
        assert r["counts"]["stuck"] == 0 and r["stuck_detail"] == []
        assert r["stuck"] == []  # with a consumer connection open nothing is held for no one
    assert sorted(d["id"] for d in r["ack_unknown"]) == t["ack_unknown"]
    assert sorted(r["unexpected"]) == t["unexpected"]
    assert sorted(d["id"] for d in r["recovered"]) == t["recovered"]
    assert sorted(d["id"] for d in r["duplicated"]) == t["duplicated"]
    assert sorted(d["id"] for d in r["resurrected"]) == t["resurrected"]
    assert sorted(d["id"] for d in r["corrupted"]) == t["corrupted"]
    assert sorted(d["id"] for d in r["split_brain"]) == t["split_brain"]
    assert r["counts"]["unflagged_redeliveries"] == t["unflagged"] == len(r["unflagged_redeliveries"])
    assert r["counts"]["confirmed"] == len([m for m in plan["messages"] if "ok" in m["outcomes"]])
    assert r["counts"]["order_violations"] == brute_force_order_violations(b.rows)
    assert r["counts"]["dead_lettered"] == t["dead_lettered"]
    live = live_truth(plan, b.rows)
    anomalies = anomaly_truth(plan, t, b.rows)
    assert {k: r["anomalies"]["counts"][k] for k in anomalies} == anomalies
    assert (r["valid"], r["verdict"]) == expected_verdict(plan, t, live, anomalies)
    lv = r["liveness"]
    got = {
        (x["fault_id"], x["queue"]): (
            x["recovered"],
            x["publish_ok_ns"],
            x["consume_ok_ns"],
            x["recovery_ns"],
        )
        for x in lv["recovery"]
        if x["healed"]
    }
    assert got == live["recovery"]
    assert sorted(lv["over_budget"]) == sorted(live["over"])
    assert [u["queue"] for u in lv["unavailable"]] == live["down"]
    windows = sorted(
        (w["queue"], w["kind"], w["start_ns"], w["end_ns"], w["ended_by_ok"]) for w in lv["windows"]
    )
    assert windows == live["gaps"]
    exposure = {e["fault_kind"]: e for e in r["attribution"]["exposure"]}
    for status in ("lost", "unreachable", "stuck"):  # each attributed under the class the counts give it
        rows = [row for row in r["attribution"]["rows"] if row["status"] == status]
        assert sum(row["count"] for row in rows) == sum(e[status] for e in exposure.values())
        assert bool(rows) == bool(r["counts"][status]), status  # every missing id meets a kind ("none")
    assert {m["status"] for m in r["attribution"]["messages"]} <= {
        s for s in ("lost", "unreachable", "stuck") if r["counts"][s]
    }
    assert all(e["confirmed"] <= r["counts"]["confirmed"] for e in exposure.values())


@pytest.mark.spark
@pytest.mark.slow
@fixture_settings(10, deadline=None)
@given(plan=plans())
def test_spark_agrees_with_python_exactly(plan: dict, spark_engine) -> None:
    b = build(plan)
    with tempfile.TemporaryDirectory() as d:
        b.write(Path(d), jsonl=False)
        expected = dict(check_python(Path(d), scenario(plan)))
        # Both passes (the hash aggregate, and the ordered pass for the ids that need it), then every
        # id through the ordered pass (what a small history gets): the same results.
        got = dict(spark_engine(Path(d), scenario(plan), passes="both"))
        ordered = dict(spark_engine(Path(d), scenario(plan), passes="ordered"))
    assert (got.pop("engine"), expected.pop("engine"), ordered.pop("engine")) == ("spark", "python", "spark")
    assert got == expected
    assert ordered == got
