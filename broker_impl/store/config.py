"""The ``[store]`` table of the broker config, validated with one clear line per mistake."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


class StoreConfigError(ValueError):
    """A ``[store]`` key is unknown or out of range; the message names the key."""


@dataclass(slots=True, frozen=True)
class StoreConfig:
    """Store tuning. Defaults follow RocketMQ where it has one (sizes scaled down)."""

    flush: str = "sync"  # sync = group commit before confirm; async = confirm after write
    flush_timeout_ms: int = 5000  # sync: publisher waits this long for fsync (RocketMQ 5 s)
    flush_interval_ms: int = 500  # async: background flusher period
    flush_min_pages: int = 4  # async: flush only when this many 4 KiB pages are dirty ...
    full_flush_interval_ms: int = 10_000  # ... or when this long passed since the last flush
    checkpoint_interval_ms: int = 1000  # consume queues, ack logs and checkpoint
    segment_bytes: int = 128 * 1024 * 1024  # commit-log segment size (RocketMQ: 1 GiB)
    cq_entries_per_file: int = 300_000  # consume-queue segment size in entries (as RocketMQ)
    retention_interval_ms: int = 10_000  # how often fully consumed segments are deleted
    spill_segment_bytes: int = 64 * 1024 * 1024  # paging scratch files per queue

    @classmethod
    def from_table(cls, table: dict[str, Any] | None) -> StoreConfig:
        table = dict(table or {})
        known = {f.name: f for f in fields(cls)}
        for key in table:
            if key not in known:
                raise StoreConfigError(f"[store] unknown key {key!r}; allowed: {', '.join(sorted(known))}")
        flush = table.get("flush", "sync")
        if flush not in ("sync", "async"):
            raise StoreConfigError(f"[store] flush = {flush!r}: allowed values are 'sync' and 'async'")
        for key, value in table.items():
            if key == "flush":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise StoreConfigError(f"[store] {key} = {value!r}: must be a positive integer")
        if table.get("segment_bytes", 4096) < 4096:
            raise StoreConfigError(
                f"[store] segment_bytes = {table['segment_bytes']!r}: must be at least 4096"
            )
        return cls(**table)
