"""Run as a subprocess by the crash tests: append forever, print what is confirmed, wait for SIGKILL."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from broker_impl.store import open_store


async def main(data_dir: str, flush: str) -> None:
    store = await open_store(Path(data_dir), {"flush": flush, "segment_bytes": 64 * 1024})
    out = sys.stdout
    counter = 0

    async def publisher(pid: int) -> None:
        nonlocal counter
        while True:
            counter += 1
            payload = b"msg-%d-%d" % (pid, counter) + b"." * 200
            offset, size, _ = store.append(f"q{pid % 3}", payload)
            await store.wait_durable(offset + size)  # returns at once with flush=async
            out.write(f"{offset} {size} {payload[:20].decode()}\n")
            out.flush()
            if flush == "async":
                await asyncio.sleep(0)

    await asyncio.gather(*(publisher(p) for p in range(8)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
