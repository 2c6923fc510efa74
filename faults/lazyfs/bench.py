"""`python -m faults.lazyfs.bench`: commit-log throughput through lazyfs against a plain directory."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from faults.lazyfs.mount import LazyMount, fuse_available


def append_rate(directory: str, writes: int = 20000, size: int = 1024, fsync_every: int = 100) -> float:
    """Appends per second of `size`-byte records with an fsync every `fsync_every` records."""
    path = os.path.join(directory, "bench.log")
    rec = b"r" * size
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        for i in range(1, writes + 1):
            os.write(fd, rec)
            if i % fsync_every == 0:
                os.fsync(fd)
        os.fsync(fd)
    finally:
        os.close(fd)
    rate = writes / (time.perf_counter() - t0)
    os.unlink(path)
    return rate


def compare(writes: int = 20000, threads: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="lzb") as tmp:
        plain = os.path.join(tmp, "plain")
        os.mkdir(plain)
        with LazyMount(
            os.path.join(tmp, "b"), os.path.join(tmp, "m"), os.path.join(tmp, "c.sock"), threads=threads
        ) as lz:
            lazy = append_rate(lz.mountpoint, writes)
        base = append_rate(plain, writes)
    return {
        "writes": writes,
        "plain_per_s": round(base),
        "lazyfs_per_s": round(lazy),
        "ratio": round(lazy / base, 4),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faults.lazyfs.bench")
    p.add_argument("--writes", type=int, default=20000)
    p.add_argument("--threads", action="store_true")
    a = p.parse_args(argv)
    reason = fuse_available()
    if reason:
        print(f"lazyfs.bench: cannot mount: {reason}", file=sys.stderr)
        return 2
    print(json.dumps(compare(a.writes, a.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
