"""Backing queues and the factory the broker uses to get one.

Usage (the broker owns one store per node)::

    store = await open_store(node_data_dir / "store", cfg.store)   # [store] table
    for name in store.recovered_queues(): ...                      # durable queues with contents
    bq = make_backing_queue(name, durable, store, ram_budget_bytes=...)
    ...
    await store.close()                                            # clean shutdown

Which class you get: a durable queue with a store gets ``PersistentBackingQueue``
(persistent messages in the commit log, transient ones in memory); everything else
gets ``MemoryBackingQueue`` (paged to a spill file beyond its RAM budget, gone on
restart).
"""

from __future__ import annotations

from broker_impl.backing.memory import DEFAULT_RAM_BUDGET, MemoryBackingQueue
from broker_impl.backing.persistent import PersistentBackingQueue
from broker_impl.store import Store, StoreConfig, StoreConfigError, open_store

__all__ = [
    "DEFAULT_RAM_BUDGET",
    "MemoryBackingQueue",
    "PersistentBackingQueue",
    "Store",
    "StoreConfig",
    "StoreConfigError",
    "make_backing_queue",
    "open_store",
    "store_queue_key",
]


def store_queue_key(vhost: str, queue: str) -> str:
    """The store's name for a queue: plain for the default vhost, length-prefixed otherwise."""
    return queue if vhost == "/" else f"{len(vhost)}:{vhost}:{queue}"


def make_backing_queue(
    name: str, durable: bool, store: Store | None, *, ram_budget_bytes: int = DEFAULT_RAM_BUDGET
) -> MemoryBackingQueue:
    """The backing queue for a declared queue (call once per queue and store: a second
    persistent instance would load the same recovered messages again)."""
    if durable and store is not None:
        return PersistentBackingQueue(name, store, ram_budget_bytes=ram_budget_bytes)
    spill_dir = store.spill_dir(name) if store is not None else None
    return MemoryBackingQueue(name, durable, ram_budget_bytes=ram_budget_bytes, spill_dir=spill_dir)
