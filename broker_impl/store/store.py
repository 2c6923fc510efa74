"""The store: owns the data directory, the abort marker and the scratch space for paging."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from broker_impl.store.config import StoreConfig

ABORT = "abort"
SPILL = "spill"


class Store:
    """One node's store. Open it with ``open_store``; close it on clean shutdown."""

    def __init__(self, data_dir: Path, config: StoreConfig) -> None:
        self.data_dir = data_dir
        self.config = config
        self.clean_start = True

    def _open(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        abort = self.data_dir / ABORT
        self.clean_start = not abort.exists()
        # Spilled bodies are scratch, never state: whatever a previous run left is garbage.
        shutil.rmtree(self.data_dir / SPILL, ignore_errors=True)
        abort.touch()

    def spill_dir(self, queue: str) -> Path:
        return self.data_dir / SPILL / queue_dirname(queue)

    def recovered_queues(self) -> set[str]:
        """Durable queues with persistent contents on disk (attach them with ``make_backing_queue``)."""
        return set()

    async def close(self) -> None:
        (self.data_dir / ABORT).unlink(missing_ok=True)


def queue_dirname(queue: str) -> str:
    """A file-system-safe, collision-free directory name for a queue name."""
    raw = queue.encode()
    if len(raw) <= 100 and raw.isascii() and all(c.isalnum() or c in "-_." for c in queue) and queue not in (".", ".."):
        return "q-" + queue
    return "x-" + raw.hex()[:200] + ("" if len(raw) <= 100 else "-" + _digest(raw))


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:32]


async def open_store(data_dir: Path, config: dict[str, Any] | StoreConfig | None = None) -> Store:
    """Open (and recover) the store in ``data_dir``; ``config`` is the broker's ``[store]`` table.

    Raises ``StoreConfigError`` with one line naming the bad key.
    """
    cfg = config if isinstance(config, StoreConfig) else StoreConfig.from_table(config)
    store = Store(Path(data_dir), cfg)
    store._open()
    return store
