"""Store throughput and event-loop lag: concurrent publishers through PersistentBackingQueue.

    python -m bench.store_bench --seconds 3 --publishers 50 --flush sync

Reports messages/s, log fsyncs (group commit: far fewer than messages) and the
worst event-loop stall seen by a 1 ms ticker (fsync runs off the loop).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from pamqp import commands

from broker_impl.backing import make_backing_queue, open_store
from broker_impl.message import Message


async def run(seconds: float, publishers: int, flush: str, size: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=".") as d:
        store = await open_store(Path(d), {"flush": flush})
        q = make_backing_queue("bench", True, store)
        props = commands.Basic.Properties(delivery_mode=2)
        body = b"x" * size
        done = 0
        stop = time.monotonic() + seconds
        worst_lag = 0.0

        async def ticker() -> None:
            nonlocal worst_lag
            while time.monotonic() < stop:
                t = time.monotonic()
                await asyncio.sleep(0.001)
                worst_lag = max(worst_lag, time.monotonic() - t - 0.001)

        async def publisher() -> None:
            nonlocal done
            while time.monotonic() < stop:
                await q.publish(Message("", "bench", props, body))
                done += 1
                await asyncio.sleep(0)  # a real publisher yields while reading its socket

        await asyncio.gather(ticker(), *(publisher() for _ in range(publishers)))
        result = {
            "msgs_per_s": done / seconds,
            "messages": done,
            "log_fsyncs": store.stats["log_fsyncs"],
            "worst_loop_stall_ms": worst_lag * 1000,
        }
        await q.close()
        await store.close()
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--publishers", type=int, default=50)
    ap.add_argument("--flush", choices=["sync", "async"], default="sync")
    ap.add_argument("--size", type=int, default=1024)
    a = ap.parse_args()
    r = asyncio.run(run(a.seconds, a.publishers, a.flush, a.size))
    print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
