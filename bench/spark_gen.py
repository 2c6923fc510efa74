"""Generate a large synthetic history.parquet for the reconciliation benchmark.

Usage: python bench/spark_gen.py --ops 10000000 --out /tmp/brokerchaos-bench/ops-10M [--seed 1]

The history follows the contract (same Arrow schema, index = global order, time
monotonic): 8 producers, 4 consumers, 2 queues, 3 nodes, fault windows of four
kinds, a final drain, and planted anomalies at fixed rates (publish fail/info,
unconfirmed-but-consumed, duplicates with the redelivered flag, losses inside fault
windows, a few ids consumed but never published). It is built column-wise in
chunks with Arrow so 100M operations fit in a few GB and a few minutes.
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
from harness.spec.history import SCHEMA_VERSION, arrow_schema  # noqa: E402

PRODUCERS, CONSUMERS, QUEUES, NODES = 8, 4, 2, 3
SLOT_NS = 50_000  # one message published per slot: 20k messages/s
LAG_SLOTS = 200  # a message is consumed this many slots after it was published
CHUNKS = 20
FAULTS = [(2, 3, "partition"), (6, 8, "kill"), (10, 11, "pause"), (14, 16, "power-loss"), (17, 18, "partition")]
RATES = {"fail": 0.002, "info": 0.002, "info_consumed": 0.5, "dup": 0.001, "lost_in_fault": 2e-5,
         "unexpected_of_fail": 0.001}
ROW_KINDS = 6  # publish invoke, publish completion, consume invoke, consume ok, ack invoke, ack ok


def message_plan(m: np.ndarray, rng: np.random.Generator, chunk_of: np.ndarray) -> dict[str, np.ndarray]:
    """Fate of each message id m (outcome, consumed, duplicated, unexpected substitute)."""
    u = rng.random(len(m))
    outcome = np.where(u < RATES["fail"], 1, np.where(u < RATES["fail"] + RATES["info"], 2, 0))  # 0 ok 1 fail 2 info
    in_fault = np.zeros(len(m), dtype=bool)
    for start, end, _ in FAULTS:
        in_fault |= (chunk_of >= start) & (chunk_of < end)
    u2 = rng.random(len(m))
    lost = (outcome == 0) & in_fault & (u2 < RATES["lost_in_fault"])
    consumed = (outcome == 0) & ~lost | (outcome == 2) & (u2 < RATES["info_consumed"])
    unexpected = (outcome == 1) & (u2 < RATES["unexpected_of_fail"])  # its delivery carries a never-published id
    consumed |= unexpected
    dup = consumed & (rng.random(len(m)) < RATES["dup"])
    latency = np.minimum(rng.exponential(2_000 + 6_000 * in_fault, len(m)).astype(np.int64) + 200, SLOT_NS * 2 // 5)
    return {"outcome": outcome, "consumed": consumed, "dup": dup, "unexpected": unexpected, "latency": latency}


def _names(prefix: str, n: int) -> pa.Array:
    return pa.array([f"{prefix}{i + 1}" for i in range(n)])


def _ids(m: np.ndarray, unexpected: np.ndarray | None = None) -> pa.Array:
    producer = pc.take(_names("p", PRODUCERS), pa.array(m % PRODUCERS))
    if unexpected is not None:
        producer = pc.if_else(pa.array(unexpected), pa.scalar("p99"), producer)
    return pc.binary_join_element_wise(producer, pc.cast(pa.array(m // PRODUCERS), pa.string()), ":")


def chunk_table(lo: int, hi: int, n_msgs: int, chunk_of_slot: np.ndarray, seed: int, first_index: int) -> pa.Table:
    """Rows of slots [lo, hi): slot s publishes message s and consumes message s - LAG_SLOTS."""
    s = np.arange(lo, hi, dtype=np.int64)
    pub_plan = _plan_for(s, seed, chunk_of_slot)
    c = s - LAG_SLOTS
    c_safe = np.maximum(c, 0)
    # The consumed message's plan is regenerated from its own chunk's seed, so chunks are independent.
    cons_plan = _plan_for(c_safe, seed, chunk_of_slot)
    n = len(s)
    present = np.zeros((n, ROW_KINDS), dtype=bool)
    present[:, 0:2] = (s < n_msgs)[:, None]
    cons_ok = (c >= 0) & (c < n_msgs) & cons_plan["consumed"]
    present[:, 2:6] = cons_ok[:, None]
    base = s * SLOT_NS
    t = np.empty((n, ROW_KINDS), dtype=np.int64)
    t[:, 0] = base
    t[:, 1] = base + pub_plan["latency"]
    for k in range(2, ROW_KINDS):
        t[:, k] = base + SLOT_NS * (k + 3) // 10
    dup = cons_plan["dup"]
    type_codes = np.array([0, 1, 0, 1, 0, 1])[None, :].repeat(n, 0)  # 0 invoke 1 ok 2 fail 3 info
    type_codes[:, 1] = np.where(pub_plan["outcome"] == 1, 2, np.where(pub_plan["outcome"] == 2, 3, 1))
    f_codes = np.array([0, 0, 1, 1, 2, 2])[None, :].repeat(n, 0)  # publish consume ack
    f_codes[dup, 4:6] = 1
    proc = np.empty((n, ROW_KINDS), dtype=np.int64)
    proc[:, 0:2] = (s % PRODUCERS)[:, None]
    proc[:, 2:6] = PRODUCERS + (c_safe % CONSUMERS)[:, None]
    node = np.empty((n, ROW_KINDS), dtype=np.int64)
    node[:, 0:2] = (s % NODES)[:, None]
    node[:, 2:6] = ((c_safe // 7) % NODES)[:, None]
    queue = np.empty((n, ROW_KINDS), dtype=np.int64)
    queue[:, 0:2] = ((s % PRODUCERS) % QUEUES)[:, None]
    queue[:, 2:6] = ((c_safe % PRODUCERS) % QUEUES)[:, None]
    value = np.empty((n, ROW_KINDS), dtype=np.int64)  # 0..n-1 publish ids, n..2n-1 consumed ids, -1 null
    value[:, 0:2] = np.arange(n)[:, None]
    value[:, 2] = -1
    value[:, 3:6] = (n + np.arange(n))[:, None]
    redelivered = np.full((n, ROW_KINDS), 2, dtype=np.int8)  # 2 = null
    redelivered[:, 3] = 0
    redelivered[dup, 5] = 1

    keep = present.ravel()
    idx_vals = pa.concat_arrays([_ids(s), _ids(c_safe, cons_plan["unexpected"])])
    flat_value = value.ravel()[keep]
    value_arr = pc.take(idx_vals, pa.array(flat_value, mask=flat_value < 0))
    times = t.ravel()[keep]
    rows = len(times)
    procs = pa.concat_arrays([_names("p", PRODUCERS), _names("c", CONSUMERS)])
    red = redelivered.ravel()[keep]
    return pa.Table.from_arrays([
        pa.array(first_index + np.arange(rows, dtype=np.int64)),
        pa.array(times),
        pc.strftime(pa.array(times.astype("datetime64[ns]")), format="%Y-%m-%dT%H:%M:%S"),
        pc.take(procs, pa.array(proc.ravel()[keep])),
        pc.take(_names("n", NODES), pa.array(node.ravel()[keep])),
        pc.take(pa.array(["invoke", "ok", "fail", "info"]), pa.array(type_codes.ravel()[keep])),
        pc.take(pa.array(["publish", "consume", "ack"]), pa.array(f_codes.ravel()[keep])),
        pc.take(_names("q", QUEUES), pa.array(queue.ravel()[keep])),
        value_arr,
        pa.array(red == 1, mask=red == 2),
        pa.nulls(rows, pa.string()),
        pa.nulls(rows, pa.string()),
        pa.nulls(rows, pa.string()),
        pa.array(np.full(rows, SCHEMA_VERSION, dtype=np.int32)),
    ], schema=arrow_schema())


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
    for key in ("outcome", "consumed", "dup", "unexpected", "latency"):
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
    return [{"index": index + j, "time_ns": t + j, "process": "nemesis", "node": node, "type": ty, "f": f,
             "value": value} for j, ty in enumerate(("invoke", "ok"))]


def small_table(rows: list[dict]) -> pa.Table:
    from harness.spec.history import FIELDS, SCHEMA_VERSION

    full = [{name: r.get(name) for name in FIELDS} | {"schema": SCHEMA_VERSION, "wall_time": ""} for r in rows]
    return pa.Table.from_pylist(full, schema=arrow_schema())


def generate(ops: int, out: Path, seed: int = 1) -> dict:
    """Write out/history.parquet with about `ops` operations; return what was planted."""
    out.mkdir(parents=True, exist_ok=True)
    n_msgs = max(ops // ROW_KINDS, CHUNKS)
    total_slots = n_msgs + LAG_SLOTS
    bounds = np.linspace(0, total_slots, CHUNKS + 1).astype(np.int64)
    # Plans are drawn per PLAN_BLOCK of slots, so the chunk of each slot must be known for all slots.
    padded = (total_slots // PLAN_BLOCK + 1) * PLAN_BLOCK
    chunk_of_slot = np.searchsorted(bounds, np.arange(padded), side="right") - 1
    index = 0
    started = time.monotonic()
    with pq.ParquetWriter(out / "history.parquet", arrow_schema(), compression="snappy") as w:
        for ci in range(CHUNKS):
            t0 = int(bounds[ci]) * SLOT_NS - 100
            small: list[dict] = []
            for i, fault in enumerate(FAULTS):
                if fault[1] == ci:
                    small += nemesis_rows("heal", fault, i, t0 + len(small), index + len(small))
                if fault[0] == ci:
                    small += nemesis_rows("fault", fault, i, t0 + len(small), index + len(small))
            if small:
                w.write_table(small_table(small))
                index += len(small)
            for lo in range(int(bounds[ci]), int(bounds[ci + 1]), PLAN_BLOCK):
                hi = min(lo + PLAN_BLOCK, int(bounds[ci + 1]))
                table = chunk_table(lo, hi, n_msgs, chunk_of_slot, seed, index)
                w.write_table(table, row_group_size=1 << 20)
                index += table.num_rows
            print(f"spark_gen: chunk {ci + 1}/{CHUNKS} rows={index:,} t={time.monotonic() - started:.0f}s",
                  file=sys.stderr, flush=True)
        t_end = total_slots * SLOT_NS
        drain = [{"index": index, "time_ns": t_end, "process": "d1", "node": "n1", "type": "invoke",
                  "f": "drain", "value": "{}"},
                 {"index": index + 1, "time_ns": t_end + 1_000_000, "process": "d1", "node": "n1", "type": "ok",
                  "f": "drain", "value": json.dumps({"consumed": 0})}]
        w.write_table(small_table(drain))
        index += 2
    meta = {"ops": index, "messages": n_msgs, "seed": seed, "rates": RATES, "faults": FAULTS}
    (out / "generated.json").write_text(json.dumps(meta, indent=1))
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    meta = generate(args.ops, args.out, args.seed)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
