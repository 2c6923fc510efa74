"""`python -m faults.lazyfs.bench`: commit-log throughput through lazyfs, its thread-pool loop against
its one-request-at-a-time loop (and a plain directory), measured in the same run.

Each round mounts both loops in turn and appends through each, then through a plain directory;
the rounds alternate the order, so a change of the machine's load hits both loops alike. The
figure that matters is the ratio of the two loops in the same round (the median over rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from faults.lazyfs.mount import LazyMount, fuse_available

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def append_rate(
    directory: str, writes: int = 20000, size: int = 1024, fsync_every: int = 100, writers: int = 1
) -> float:
    """Appends per second of `size`-byte records with an fsync every `fsync_every` records, by
    `writers` threads each appending to its own file (`writes` records in all)."""
    rec = b"r" * size
    each = writes // writers

    def one(k: int) -> None:
        path = os.path.join(directory, f"bench-{k}.log")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        try:
            for i in range(1, each + 1):
                os.write(fd, rec)
                if i % fsync_every == 0:
                    os.fsync(fd)
            os.fsync(fd)
        finally:
            os.close(fd)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(writers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = each * writers / (time.perf_counter() - t0)
    for k in range(writers):
        os.unlink(os.path.join(directory, f"bench-{k}.log"))
    return rate


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _through(
    tmp: str, name: str, threads: bool, writes: int, writers: int, max_threads: int | None = None
) -> tuple[float, float]:
    """(appends per second, lazyfs CPU microseconds per append) through a fresh mount."""
    with LazyMount(
        os.path.join(tmp, f"{name}-b"),
        os.path.join(tmp, f"{name}-m"),
        os.path.join(tmp, f"{name}.sock"),
        threads=threads,
        max_threads=max_threads if threads else None,
    ) as lz:
        assert lz.pid is not None
        cpu = _cpu_seconds(lz.pid)
        rate = append_rate(lz.mountpoint, writes, writers=writers)
        return rate, (_cpu_seconds(lz.pid) - cpu) * 1e6 / writes


def compare(
    writes: int = 20000, writers: int = 1, rounds: int = 3, max_threads: int | None = None
) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="lzb") as tmp:
        plain = os.path.join(tmp, "plain")
        os.mkdir(plain)
        for r in range(rounds):
            order = [("pool", True), ("single", False)]
            if r % 2:
                order.reverse()
            row: dict[str, float] = {}
            for name, threads in order:
                row[name], row[f"{name}_cpu_us"] = _through(tmp, name, threads, writes, writers, max_threads)
            row["plain"] = append_rate(plain, writes, writers=writers)
            rows.append(row)
    ratios = [row["pool"] / row["single"] for row in rows]
    return {
        "writes": writes,
        "writers": writers,
        "rounds": [{k: round(v, 1) for k, v in row.items()} for row in rows],
        "pool_per_s": round(statistics.median(row["pool"] for row in rows)),
        "single_per_s": round(statistics.median(row["single"] for row in rows)),
        "plain_per_s": round(statistics.median(row["plain"] for row in rows)),
        "ratio_pool_vs_single": round(statistics.median(ratios), 3),
        "ratios": [round(x, 3) for x in ratios],
        # CPU time of the lazyfs process per append: steadier than a rate on a loaded machine.
        "pool_cpu_us": round(statistics.median(row["pool_cpu_us"] for row in rows), 1),
        "single_cpu_us": round(statistics.median(row["single_cpu_us"] for row in rows), 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faults.lazyfs.bench", description=__doc__.split("\n")[0])
    p.add_argument("--writes", type=int, default=20000, help="records appended per measurement")
    p.add_argument(
        "--writers", default="1,4", help="comma-separated thread counts, each appending to its own file"
    )
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per thread count")
    p.add_argument("--max-threads", type=int, help="cap of the thread pool (default: libfuse's, 10)")
    p.add_argument("--out", help="also write the results here (.json and .md)")
    a = p.parse_args(argv)
    reason = fuse_available()
    if reason:
        print(f"lazyfs.bench: cannot mount: {reason}", file=sys.stderr)
        return 2
    try:
        writers = [int(w) for w in a.writers.split(",")]
    except ValueError:
        print(f"lazyfs.bench: --writers {a.writers!r}: give thread counts such as 1,4", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    results = [compare(a.writes, w, a.rounds, a.max_threads) for w in writers]
    out = {
        "command": "python -m faults.lazyfs.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cores": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "results": results,
    }
    print(json.dumps(out))
    if a.out:
        Path(a.out).with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
        Path(a.out).with_suffix(".md").write_text(_markdown(out))
    return 0


def _markdown(out: dict[str, Any]) -> str:
    lines = [
        "# lazyfs throughput: thread-pool loop vs one request at a time",
        "",
        f"Command: `{out['command']}`  ",
        f"Machine: {out['cores']} cores, load average (1, 5, 15 min) {out['load_before']} before and "
        f"{out['load_after']} after the run.",
        "",
        "1 KiB appends with an fsync every 100, each writer thread on its own file. Per round both loops",
        "are measured one after the other (the order alternates); the ratio is the median of the",
        "per-round ratios. CPU is the lazyfs process's user + system time per append (median), which",
        "a loaded machine disturbs less than a rate. The plain directory fsyncs to the real disk and",
        "is shown for scale only.",
        "",
        "| writers | pool appends/s | single appends/s | ratio pool/single (rounds) | CPU µs/append pool / single | plain dir appends/s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in out["results"]:
        lines.append(
            f"| {r['writers']} | {r['pool_per_s']} | {r['single_per_s']} | "
            f"**{r['ratio_pool_vs_single']}** ({', '.join(map(str, r['ratios']))}) | "
            f"{r['pool_cpu_us']} / {r['single_cpu_us']} | {r['plain_per_s']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
