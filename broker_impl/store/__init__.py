"""The commit-log store (RocketMQ style): one append-only log, a consume queue per queue.

Public surface: ``open_store``, ``Store``, ``StoreConfig``, ``StoreConfigError``.
The broker reaches it through ``broker_impl.backing``; nothing else should need
the modules below directly.
"""

from __future__ import annotations

from broker_impl.store.config import StoreConfig, StoreConfigError
from broker_impl.store.store import Store, open_store

__all__ = ["Store", "StoreConfig", "StoreConfigError", "open_store"]
