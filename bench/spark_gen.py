"""Generate a large synthetic history.parquet for the reconciliation benchmark.

Usage: python bench/spark_gen.py --ops 10000000 --out /tmp/brokerchaos-bench/ops-10M [--seed 1]
                                 [--message-size 64]

The history follows the contract, schema 2 (same Arrow schema, index = global
order, time monotonic): 8 producers, 4 consumers, 2 queues, 3 nodes, fault windows
of four kinds, a final drain per queue, every consumed message acked ok, and
planted anomalies at fixed rates (publish fail/info, unconfirmed-but-consumed,
duplicates: an ack of unknown outcome then a flagged redelivery acked elsewhere,
resurrections: a redelivery after the ack completed ok, corrupted bodies, losses
inside fault windows, a few ids consumed but never published). Deliveries carry
the digest of the body (``harness.spec.message_body`` for the id, the seed and the
message size), so the checkers verify bodies given out/scenario.json. It is built
column-wise in chunks with Arrow so 100M operations fit in a few GB.

out/generated.json records what was planted (``planted``), counted from the same
seeded plans while the rows were written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.spec.history import SCHEMA_VERSION, arrow_schema, body_digest, message_body  # noqa: E402

PRODUCERS, CONSUMERS, QUEUES, NODES = 8, 4, 2, 3
SLOT_NS = 50_000  # one message published per slot: 20k messages/s
LAG_SLOTS = 200  # a message is consumed this many slots after it was published
CHUNKS = 20
FAULTS = [
    (2, 3, "partition"),
    (6, 8, "kill"),
    (10, 11, "pause"),
    (14, 16, "power-loss"),
    (17, 18, "partition"),
]
RATES = {
    "fail": 0.002,
    "info": 0.002,
    "info_consumed": 0.5,
    "dup": 0.001,
    "lost_in_fault": 2e-5,
    "unexpected_of_fail": 0.001,
    "resurrected_of_dup": 0.2,
    "corrupt": 1e-4,
}
# publish invoke, publish completion; consume invoke, consume ok, ack invoke, ack completion;
# for a duplicate: a second consume invoke, consume ok (redelivered), ack invoke, ack ok
ROW_KINDS = 10
ROWS_PER_MESSAGE = 6  # the last four kinds only for duplicates
MESSAGE_SIZE = 64


def message_plan(m: np.ndarray, rng: np.random.Generator, chunk_of: np.ndarray) -> dict[str, np.ndarray]:
    """Fate of each message id m (outcome, consumed, duplicated, unexpected substitute)."""
    u = rng.random(len(m))
    outcome = np.where(
        u < RATES["fail"], 1, np.where(u < RATES["fail"] + RATES["info"], 2, 0)
    )  # 0 ok 1 fail 2 info
    in_fault = np.zeros(len(m), dtype=bool)
    for start, end, _ in FAULTS:
        in_fault |= (chunk_of >= start) & (chunk_of < end)
    u2 = rng.random(len(m))
    lost = (outcome == 0) & in_fault & (u2 < RATES["lost_in_fault"])
    consumed = (outcome == 0) & ~lost | (outcome == 2) & (u2 < RATES["info_consumed"])
    unexpected = (outcome == 1) & (
        u2 < RATES["unexpected_of_fail"]
    )  # its delivery carries a never-published id
    consumed |= unexpected
    dup = consumed & (rng.random(len(m)) < RATES["dup"])
    latency = np.minimum(
        rng.exponential(2_000 + 6_000 * in_fault, len(m)).astype(np.int64) + 200, SLOT_NS * 3 // 10
    )
    # Drawn after the draws above, so the plans spark_expect.py replays are unchanged.
    resurrected = dup & (rng.random(len(m)) < RATES["resurrected_of_dup"])
    corrupt = consumed & ~unexpected & (rng.random(len(m)) < RATES["corrupt"])
    return {
        "outcome": outcome,
        "consumed": consumed,
        "dup": dup,
        "unexpected": unexpected,
        "latency": latency,
        "resurrected": resurrected,
        "corrupt": corrupt,
    }


def _names(prefix: str, n: int) -> pa.Array:
    return pa.array([f"{prefix}{i + 1}" for i in range(n)])


def _ids(m: np.ndarray, unexpected: np.ndarray | None = None) -> pa.Array:
    producer = pc.take(_names("p", PRODUCERS), pa.array(m % PRODUCERS))
    if unexpected is not None:
        producer = pc.if_else(pa.array(unexpected), pa.scalar("p99"), producer)
    return pc.binary_join_element_wise(producer, pc.cast(pa.array(m // PRODUCERS), pa.string()), ":")


def _bodies(ids: list[str], seed: int, size: int, corrupt: np.ndarray) -> tuple[list, list, list]:
    """Per consumed id: the digest of the body sent, of a corrupted copy, and the detail a consumer records."""
    good: list[str | None] = []
    bad: list[str | None] = []
    detail: list[str | None] = []
    for mid, spoil in zip(ids, corrupt.tolist(), strict=True):
        body = None if mid is None else message_body(mid, seed, size)
        good.append(None if body is None else body_digest(body))
        if body is None or not spoil:
            bad.append(None)
            detail.append(None)
            continue
        flipped = bytearray(body)
        flipped[len(mid) + 1] ^= 1  # a digit of the check: still ASCII, no longer the body sent
        bad.append(body_digest(bytes(flipped)))
        detail.append(
            json.dumps(
                {"body": bytes(flipped[:200]).decode(errors="backslashreplace"), "length": len(flipped)}
            )
        )
    return good, bad, detail


def chunk_table(
    lo: int,
    hi: int,
    n_msgs: int,
    chunk_of_slot: np.ndarray,
    seed: int,
    first_index: int,
    message_size: int = MESSAGE_SIZE,
) -> pa.Table:
    """Rows of slots [lo, hi): slot s publishes message s and consumes message s - LAG_SLOTS."""
    s = np.arange(lo, hi, dtype=np.int64)
    pub_plan = _plan_for(s, seed, chunk_of_slot)
    c = s - LAG_SLOTS
    c_safe = np.maximum(c, 0)
    # The consumed message's plan is regenerated from its own chunk's seed, so chunks are independent.
    cons_plan = _plan_for(c_safe, seed, chunk_of_slot)
    cons_ok = (c >= 0) & (c < n_msgs) & cons_plan["consumed"]
    corrupt = cons_ok & cons_plan["corrupt"]
    grids = _kind_grids(s, n_msgs, pub_plan, cons_plan, cons_ok) | _place_grids(s, c_safe, corrupt)
    cons_ids = _ids(c_safe, cons_plan["unexpected"])
    good, bad, details = _bodies(
        pc.if_else(pa.array(cons_ok), cons_ids, pa.scalar(None, pa.string())).to_pylist(),
        seed,
        message_size,
        corrupt,
    )
    texts = {
        "value": pa.concat_arrays([_ids(s), cons_ids]),
        "error": pa.array(["connection lost before the ack was confirmed"]),
        "digest": pa.array(good + bad, pa.string()),
        "detail": pa.array(details, pa.string()),
    }
    return _rows_table(grids, texts, first_index)


def _kind_grids(
    s: np.ndarray,
    n_msgs: int,
    pub_plan: dict[str, np.ndarray],
    cons_plan: dict[str, np.ndarray],
    cons_ok: np.ndarray,
) -> dict[str, np.ndarray]:
    """Per slot and row kind: whether the row is written, its time, type, operation and error code."""
    n = len(s)
    present = np.zeros((n, ROW_KINDS), dtype=bool)
    present[:, 0:2] = (s < n_msgs)[:, None]
    dup = cons_ok & cons_plan["dup"]
    resurrected = cons_ok & cons_plan["resurrected"]
    present[:, 2:6] = cons_ok[:, None]
    present[:, 6:10] = dup[:, None]
    base = s * SLOT_NS
    t = np.empty((n, ROW_KINDS), dtype=np.int64)
    t[:, 0] = base
    t[:, 1] = base + pub_plan["latency"]
    for k in range(2, ROW_KINDS):
        t[:, k] = base + SLOT_NS * (k + 2) // 12
    type_codes = np.array([0, 1, 0, 1, 0, 1, 0, 1, 0, 1])[None, :].repeat(n, 0)  # 0 invoke 1 ok 2 fail 3 info
    type_codes[:, 1] = np.where(pub_plan["outcome"] == 1, 2, np.where(pub_plan["outcome"] == 2, 3, 1))
    # A duplicate's first ack ends info (the channel failed) and it comes back; a resurrection's ack
    # completed ok before it came back.
    type_codes[:, 5] = np.where(dup & ~resurrected, 3, 1)
    f_codes = np.array([0, 0, 1, 1, 2, 2, 1, 1, 2, 2])[None, :].repeat(n, 0)  # publish consume ack
    error = np.full((n, ROW_KINDS), -1, dtype=np.int64)
    error[:, 5] = np.where(type_codes[:, 5] == 3, 0, -1)
    return {"present": present, "time": t, "type": type_codes, "f": f_codes, "error": error}


def _place_grids(s: np.ndarray, c_safe: np.ndarray, corrupt: np.ndarray) -> dict[str, np.ndarray]:
    """Per slot and row kind: who wrote the row, where, on which queue, and which id, flag and body it carries."""
    n = len(s)
    proc = np.empty((n, ROW_KINDS), dtype=np.int64)
    proc[:, 0:2] = (s % PRODUCERS)[:, None]
    proc[:, 2:6] = PRODUCERS + (c_safe % CONSUMERS)[:, None]
    proc[:, 6:10] = PRODUCERS + ((c_safe + 1) % CONSUMERS)[:, None]
    node = np.empty((n, ROW_KINDS), dtype=np.int64)
    node[:, 0:2] = (s % NODES)[:, None]
    node[:, 2:6] = ((c_safe // 7) % NODES)[:, None]
    node[:, 6:10] = ((c_safe // 7 + 1) % NODES)[:, None]
    queue = np.empty((n, ROW_KINDS), dtype=np.int64)
    queue[:, 0:2] = ((s % PRODUCERS) % QUEUES)[:, None]
    queue[:, 2:10] = ((c_safe % PRODUCERS) % QUEUES)[:, None]
    value = np.empty((n, ROW_KINDS), dtype=np.int64)  # 0..n-1 publish ids, n..2n-1 consumed ids, -1 null
    value[:, 0:2] = np.arange(n)[:, None]
    value[:, 2:10] = (n + np.arange(n))[:, None]
    value[:, [2, 6]] = -1
    redelivered = np.full((n, ROW_KINDS), 2, dtype=np.int8)  # 2 = null
    redelivered[:, 3] = 0
    redelivered[:, 7] = 1
    digest = np.full((n, ROW_KINDS), -1, dtype=np.int64)  # 0..n-1 digests sent, n..2n-1 corrupted, -1 null
    digest[:, 3] = np.where(corrupt, n + np.arange(n), np.arange(n))
    digest[:, 7] = np.arange(n)
    detail = np.full((n, ROW_KINDS), -1, dtype=np.int64)
    detail[:, 3] = np.where(corrupt, np.arange(n), -1)
    return {
        "process": proc,
        "node": node,
        "queue": queue,
        "value": value,
        "redelivered": redelivered,
        "digest": digest,
        "detail": detail,
    }


def _rows_table(grids: dict[str, np.ndarray], texts: dict[str, pa.Array], first_index: int) -> pa.Table:
    """The rows present, in slot then kind order: codes in ``grids`` turned into the history's columns."""
    keep = grids["present"].ravel()

    def pick(values: pa.Array, codes: np.ndarray) -> pa.Array:
        flat = codes.ravel()[keep]
        return pc.take(values, pa.array(flat, mask=flat < 0))

    times = grids["time"].ravel()[keep]
    rows = len(times)
    procs = pa.concat_arrays([_names("p", PRODUCERS), _names("c", CONSUMERS)])
    red = grids["redelivered"].ravel()[keep]
    return pa.Table.from_arrays(
        [
            pa.array(first_index + np.arange(rows, dtype=np.int64)),
            pa.array(times),
            pc.strftime(pa.array(times.astype("datetime64[ns]")), format="%Y-%m-%dT%H:%M:%S"),
            pc.take(procs, pa.array(grids["process"].ravel()[keep])),
            pc.take(_names("n", NODES), pa.array(grids["node"].ravel()[keep])),
            pc.take(pa.array(["invoke", "ok", "fail", "info"]), pa.array(grids["type"].ravel()[keep])),
            pc.take(pa.array(["publish", "consume", "ack"]), pa.array(grids["f"].ravel()[keep])),
            pc.take(_names("q", QUEUES), pa.array(grids["queue"].ravel()[keep])),
            pick(texts["value"], grids["value"]),
            pa.array(red == 1, mask=red == 2),
            pick(texts["error"], grids["error"]),
            pick(texts["digest"], grids["digest"]),
            pick(texts["detail"], grids["detail"]),
            pa.array(np.full(rows, SCHEMA_VERSION, dtype=np.int32)),
        ],
        schema=arrow_schema(),
    )


def _plan_for(m: np.ndarray, seed: int, chunk_of_slot: np.ndarray) -> dict[str, np.ndarray]:
    """Regenerate message_plan for arbitrary ids by replaying the generator of each id's chunk."""
    out: dict[str, np.ndarray] = {}
    step = PLAN_BLOCK
    blocks = np.unique(m // step)
    parts = []
    for b in blocks:
        ids = np.arange(b * step, (b + 1) * step, dtype=np.int64)
        plan = message_plan(ids, np.random.default_rng([seed, int(b * step)]), chunk_of_slot[ids])
        sel = (m >= b * step) & (m < (b + 1) * step)
        parts.append((sel, m[sel] - b * step, plan))
    for key in ("outcome", "consumed", "dup", "unexpected", "latency", "resurrected", "corrupt"):
        arr = np.zeros(len(m), dtype=parts[0][2][key].dtype)
        for sel, local, plan in parts:
            arr[sel] = plan[key][local]
        out[key] = arr
    return out


PLAN_BLOCK = 250_000
"""Slots are generated in blocks of this size; each block's plan comes from (seed, block start)."""


def nemesis_rows(kind: str, fault: tuple[int, int, str], i: int, t: int, index: int) -> list[dict]:
    if kind == "fault":
        value = json.dumps({"fault_id": f"f{i + 1}", "kind": fault[2], "target": f"n{i % NODES + 1}"})
        f, node = fault[2], f"n{i % NODES + 1}"
    else:
        value, f, node = json.dumps({"fault_ids": [f"f{i + 1}"]}), "heal", None
    return [
        {
            "index": index + j,
            "time_ns": t + j,
            "process": "nemesis",
            "node": node,
            "type": ty,
            "f": f,
            "value": value,
        }
        for j, ty in enumerate(("invoke", "ok"))
    ]


def small_table(rows: list[dict]) -> pa.Table:
    from harness.spec.history import FIELDS, SCHEMA_VERSION

    full = [
        {name: r.get(name) for name in FIELDS} | {"schema": SCHEMA_VERSION, "wall_time": ""} for r in rows
    ]
    return pa.Table.from_pylist(full, schema=arrow_schema())


def generate(ops: int, out: Path, seed: int = 1, message_size: int = MESSAGE_SIZE) -> dict:
    """Write out/history.parquet (and the scenario.json the checkers need) with about `ops` operations."""
    out.mkdir(parents=True, exist_ok=True)
    n_msgs = max(ops // ROWS_PER_MESSAGE, CHUNKS)
    total_slots = n_msgs + LAG_SLOTS
    bounds = np.linspace(0, total_slots, CHUNKS + 1).astype(np.int64)
    # Plans are drawn per PLAN_BLOCK of slots, so the chunk of each slot must be known for all slots.
    padded = (total_slots // PLAN_BLOCK + 1) * PLAN_BLOCK
    chunk_of_slot = np.searchsorted(bounds, np.arange(padded), side="right") - 1
    planted = dict.fromkeys(("confirmed", "lost", "duplicated", "resurrected", "corrupted"), 0)
    unexpected: set[int] = set()
    index = 0
    started = time.monotonic()
    with pq.ParquetWriter(out / "history.parquet", arrow_schema(), compression="snappy") as w:
        for ci in range(CHUNKS):
            small = _fault_rows(ci, int(bounds[ci]) * SLOT_NS - 100, index)
            if small:
                w.write_table(small_table(small))
                index += len(small)
            for lo in range(int(bounds[ci]), int(bounds[ci + 1]), PLAN_BLOCK):
                hi = min(lo + PLAN_BLOCK, int(bounds[ci + 1]))
                table = chunk_table(lo, hi, n_msgs, chunk_of_slot, seed, index, message_size)
                w.write_table(table, row_group_size=1 << 20)
                index += table.num_rows
                m = np.arange(lo, min(hi, n_msgs), dtype=np.int64)
                if len(m):
                    _count(planted, unexpected, m, _plan_for(m, seed, chunk_of_slot))
            print(
                f"spark_gen: chunk {ci + 1}/{CHUNKS} rows={index:,} t={time.monotonic() - started:.0f}s",
                file=sys.stderr,
                flush=True,
            )
        drain = _drain_rows(index, total_slots * SLOT_NS)
        w.write_table(small_table(drain))
        index += len(drain)
    planted["unexpected"] = len(unexpected)
    meta = {
        "ops": index,
        "messages": n_msgs,
        "seed": seed,
        "message_size": message_size,
        "rates": RATES,
        "faults": FAULTS,
        "planted": planted,
    }
    (out / "generated.json").write_text(json.dumps(meta, indent=1))
    (out / "scenario.json").write_text(
        json.dumps(
            {"name": "spark-bench", "seed": seed, "workload": {"message_size": message_size}}, indent=1
        )
    )
    return meta


def _fault_rows(ci: int, t0: int, index: int) -> list[dict]:
    """The nemesis rows at the start of chunk ``ci``: heals of faults ending there, then faults starting."""
    small: list[dict] = []
    for i, fault in enumerate(FAULTS):
        if fault[1] == ci:
            small += nemesis_rows("heal", fault, i, t0 + len(small), index + len(small))
        if fault[0] == ci:
            small += nemesis_rows("fault", fault, i, t0 + len(small), index + len(small))
    return small


def _drain_rows(index: int, t_end: int) -> list[dict]:
    """One drain op per queue (drainer dN), each node reporting the queue empty; nothing left to drain."""
    nodes = {
        f"n{k + 1}": {
            "consumed": 0,
            "ready": 0,
            "unacked": 0,
            "empty_at_ns": t_end + 500_000,
            "error": None,
        }
        for k in range(NODES)
    }
    drain = [
        {
            "index": index + q,
            "time_ns": t_end + q,
            "process": f"d{q + 1}",
            "type": "invoke",
            "f": "drain",
            "queue": f"q{q + 1}",
        }
        for q in range(QUEUES)
    ]
    drain += [
        {
            "index": index + QUEUES + q,
            "time_ns": t_end + 1_000_000 + q,
            "process": f"d{q + 1}",
            "type": "ok",
            "f": "drain",
            "queue": f"q{q + 1}",
            "value": json.dumps({"consumed": 0, "nodes": nodes}),
        }
        for q in range(QUEUES)
    ]
    return drain


def _count(planted: dict[str, int], unexpected: set[int], m: np.ndarray, plan: dict[str, np.ndarray]) -> None:
    """What the checkers must find for messages m, from the plans the rows were written from."""
    ok = plan["outcome"] == 0
    planted["confirmed"] += int(ok.sum())
    planted["lost"] += int((ok & ~plan["consumed"]).sum())
    # Consumed twice means acked ok twice: a duplicate whose first ack ended unknown is consumed once;
    # only the resurrected ones (first ack ok, then a redelivery acked ok) are duplicated.
    planted["duplicated"] += int(plan["resurrected"].sum())
    planted["resurrected"] += int(plan["resurrected"].sum())
    planted["corrupted"] += int(plan["corrupt"].sum())
    unexpected.update((m[plan["unexpected"]] // PRODUCERS).tolist())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--message-size", type=int, default=MESSAGE_SIZE)
    args = ap.parse_args()
    meta = generate(args.ops, args.out, args.seed, args.message_size)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
