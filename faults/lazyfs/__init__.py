"""Power loss for a node: a FUSE filesystem that keeps unsynced writes in its own memory (see README.md)."""

from __future__ import annotations

from faults.lazyfs.model import STATE_DIR, LazyState
from faults.lazyfs.mount import LazyMount, MountError, force_unmount, fuse_available, is_mounted

__all__ = [
    "STATE_DIR",
    "LazyMount",
    "LazyState",
    "MountError",
    "force_unmount",
    "fuse_available",
    "is_mounted",
]
