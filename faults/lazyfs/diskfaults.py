"""Disk faults inside the lazy filesystem: rules added and removed while the broker runs.

A rule matches files by a glob over their path in the mount (``fnmatch``: ``*`` also crosses
``/``; the path has no leading slash, e.g. ``store/commitlog/00000000``), and acts on some
operations:

- ``eio``: ``read``, ``write`` and/or ``fsync`` of a matching file fail with EIO. A failed fsync
  persists nothing: the file's unsynced writes stay unsynced (a later power cut drops them).
- ``enospc``: writes to matching files succeed for ``after_bytes`` more bytes, then fail with
  ENOSPC (disk full); unless ``df`` is false, ``statfs`` reports only what is left, so a broker
  that watches its free space (a disk alarm) sees the disk fill up before any write fails.
- ``slow-fsync``: every fsync of a matching file or directory takes ``delay_ms`` longer: a slow
  flush, not a hung disk. The fsync covers what was written before it started; while it waits,
  the node's other reads, writes and name operations go on, stay unsynced, and need the next
  fsync (through FUSE, the kernel still makes writes to the very file being fsynced, or listing
  and naming in the directory being fsynced, wait for it: it holds that inode's lock). It
  persists at the end of the delay; a power cut before then persists nothing of it, and
  clearing the rule ends the delay of fsyncs still waiting.
- ``fsync-lie``: fsync of a matching file or directory reports success and persists nothing
  (a drive that acknowledges a cache flush it never did); the data stays unsynced until a later
  honest fsync, and a power cut meanwhile drops it.

Each rule counts what it did (operations hit, bytes, the paths, first and last time), and the
control replies carry those counts, so the history says exactly what the broker was refused.
"""

from __future__ import annotations

import errno
import fnmatch
import os
from dataclasses import dataclass, field
from typing import Any

from faults.node.wire import now_iso

KINDS = ("eio", "enospc", "slow-fsync", "fsync-lie")
OPS = ("read", "write", "fsync")
#: Paths listed per rule in a report (the count of operations is always exact).
SHOWN_PATHS = 20


@dataclass
class Rule:
    id: str
    kind: str
    glob: str = "*"
    ops: tuple[str, ...] = ("fsync",)
    after_bytes: int = 0
    delay_ms: float = 0.0
    df: bool = True
    hits: int = 0
    bytes: int = 0  # enospc: bytes let through before the disk filled
    #: fsync-lie: per path, the unsynced bytes its latest lying fsync left behind.
    lied: dict[str, int] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    first: str | None = None
    last: str | None = None
    added: str = field(default_factory=now_iso)

    @classmethod
    def parse(cls, spec: dict[str, Any]) -> Rule:
        kind = spec.get("kind")
        if kind not in KINDS:
            raise ValueError(f"rule kind {kind!r}: use one of {', '.join(KINDS)}")
        if not spec.get("id"):
            raise ValueError("a rule needs an id")
        ops = tuple(spec.get("ops") or (("fsync",) if kind != "enospc" else ("write",)))
        bad = [o for o in ops if o not in OPS]
        if bad:
            raise ValueError(f"rule ops {bad}: use {', '.join(OPS)}")
        if kind == "enospc":
            ops = ("write",)
        elif kind in ("slow-fsync", "fsync-lie"):
            ops = ("fsync",)
        rule = cls(
            id=str(spec["id"]),
            kind=kind,
            glob=str(spec.get("glob") or "*"),
            ops=ops,
            after_bytes=int(spec.get("after_bytes", 0)),
            delay_ms=float(spec.get("delay_ms", 0.0)),
            df=bool(spec.get("df", True)),
        )
        if rule.after_bytes < 0 or rule.delay_ms < 0:
            raise ValueError("after_bytes and delay_ms must not be negative")
        return rule

    def matches(self, op: str, path: str) -> bool:
        return op in self.ops and fnmatch.fnmatchcase(path.lstrip("/"), self.glob)

    def hit(self, path: str) -> None:
        self.hits += 1
        self.last = now_iso()
        self.first = self.first or self.last
        if path not in self.paths and len(self.paths) < SHOWN_PATHS:
            self.paths.append(path)

    def report(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "kind": self.kind,
            "glob": self.glob,
            "ops": list(self.ops),
            "hits": self.hits,
            "paths": list(self.paths),
            "first_hit": self.first,
            "last_hit": self.last,
            "added": self.added,
        }
        if self.kind == "enospc":
            out.update(after_bytes=self.after_bytes, df=self.df, written_before_full=self.bytes)
        elif self.kind == "slow-fsync":
            out.update(delay_ms=self.delay_ms, delayed_ms_total=round(self.hits * self.delay_ms, 3))
        elif self.kind == "fsync-lie":
            out.update(unsynced_bytes_lied_about=sum(self.lied.values()))
        return out


class DiskFaults:
    """The active rules; the filesystem asks it before each read, write and fsync (under its lock)."""

    def __init__(self) -> None:
        self.rules: dict[str, Rule] = {}

    def __bool__(self) -> bool:
        return bool(self.rules)

    def add(self, spec: dict[str, Any]) -> dict[str, Any]:
        rule = Rule.parse(spec)
        if rule.id in self.rules:
            raise ValueError(f"a rule {rule.id!r} is already active")
        self.rules[rule.id] = rule
        return rule.report()

    def clear(self, rule_id: str | None = None) -> list[dict[str, Any]]:
        """Remove one rule (or all) and return their final counts."""
        ids = list(self.rules) if rule_id is None else [rule_id]
        return [self.rules.pop(i).report() for i in ids if i in self.rules]

    def list(self) -> list[dict[str, Any]]:
        return [r.report() for r in self.rules.values()]

    def on_read(self, path: str) -> None:
        for r in self.rules.values():
            if r.kind == "eio" and r.matches("read", path):
                r.hit(path)
                raise OSError(errno.EIO, os.strerror(errno.EIO))

    def on_write(self, path: str, size: int) -> None:
        for r in self.rules.values():
            if r.kind == "eio" and r.matches("write", path):
                r.hit(path)
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        for r in self.rules.values():
            if r.kind == "enospc" and r.matches("write", path):
                if r.bytes + size > r.after_bytes:
                    r.hit(path)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                r.bytes += size

    def on_fsync(self, path: str, unsynced: int) -> tuple[float, bool, tuple[str, ...]]:
        """Raise EIO, or return (seconds to wait, whether to skip persisting: a lie, the slow rules' ids)."""
        delay = 0.0
        lie = False
        slow: list[str] = []
        for r in self.rules.values():
            if not r.matches("fsync", path):
                continue
            if r.kind == "eio":
                r.hit(path)
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            if r.kind == "slow-fsync":
                r.hit(path)
                delay += r.delay_ms / 1000
                slow.append(r.id)
            elif r.kind == "fsync-lie":
                r.hit(path)
                r.lied[path] = unsynced
                lie = True
        return delay, lie, tuple(slow)

    def free_bytes(self) -> int | None:
        """What an ENOSPC rule leaves of the disk (None: no such rule)."""
        left = [max(0, r.after_bytes - r.bytes) for r in self.rules.values() if r.kind == "enospc" and r.df]
        return min(left) if left else None
