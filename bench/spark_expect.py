"""What bench/spark_gen.py planted, recomputed from its seeded plans without reading the history.

Usage: python bench/spark_expect.py RUN_DIR   (compares with RUN_DIR/results.spark.json if present)

An independent check for sizes the pure-Python checker cannot hold in memory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import spark_gen as g  # noqa: E402


def expected(run_dir: Path) -> dict:
    meta = json.loads((run_dir / "generated.json").read_text())
    n_msgs = meta["messages"]
    total_slots = n_msgs + g.LAG_SLOTS
    bounds = np.linspace(0, total_slots, g.CHUNKS + 1).astype(np.int64)
    padded = (total_slots // g.PLAN_BLOCK + 1) * g.PLAN_BLOCK
    chunk_of_slot = np.searchsorted(bounds, np.arange(padded), side="right") - 1
    out = {"confirmed": 0, "lost": 0, "duplicated": 0}
    unexpected_ids: set[int] = set()
    for lo in range(0, n_msgs, g.PLAN_BLOCK):
        m = np.arange(lo, min(lo + g.PLAN_BLOCK, n_msgs), dtype=np.int64)
        plan = g.message_plan(
            np.arange(lo, lo + g.PLAN_BLOCK, dtype=np.int64),
            np.random.default_rng([meta["seed"], lo]),
            chunk_of_slot[lo : lo + g.PLAN_BLOCK],
        )
        plan = {k: v[: len(m)] for k, v in plan.items()}
        ok = plan["outcome"] == 0
        out["confirmed"] += int(ok.sum())
        out["lost"] += int((ok & ~plan["consumed"]).sum())
        out["duplicated"] += int(plan["dup"].sum())
        unexpected_ids.update((m[plan["unexpected"]] // g.PRODUCERS).tolist())
    out["unexpected"] = len(unexpected_ids)
    return out


def main() -> None:
    run_dir = Path(sys.argv[1])
    exp = expected(run_dir)
    print(json.dumps({"expected": exp}))
    res_file = run_dir / "results.spark.json"
    if res_file.is_file():
        counts = json.loads(res_file.read_text())["counts"]
        got = {k: counts[k] for k in exp}
        print(json.dumps({"spark": got, "match": got == exp}))


if __name__ == "__main__":
    main()
