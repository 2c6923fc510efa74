"""`python -m faults.node.corrupt --root DIR --plan JSON`: corrupt one of the broker's data files.

Runs inside the node container (standard library only) while the broker is down. The plan
says which file and where as fractions drawn by the harness from the run's seed, so the same
plan picks the same file and offsets from the same directory contents:

    {"mode": "bitflip", "glob": "**/*", "file": 0.41, "flips": [[0.13, 5], [0.87, 0]]}
    {"mode": "truncate", "glob": "**/*", "file": 0.41, "cut": 0.62}          # keep 62 % of it
    {"mode": "truncate", "glob": "**/*", "file": 0.41, "bytes": 100}         # drop the last 100 bytes

``glob`` may also be a list (a file role's globs): a file matching any of them is a candidate.
Candidates are the regular, non-empty files under DIR matching the glob, sorted by path; the
file is ``candidates[int(file * len)]``. Offsets are fractions of the file's written bytes (its
non-zero spans, holes skipped: a preallocated tail of zeros is never read as data), which the
record names beside the size; a file of zeros only has nothing written, and a flip there is
left undone (the evidence names it "no effect"). The change is written and fsynced (through the
lazy filesystem too, so it is on its "disk"), and one JSON line says exactly what was done: the
file, its size before and after, its written extent, its sha256 before and after, and every
changed byte's offset with its value before and after (for a truncation, the digest and first
bytes of what was cut).

``--verify JSON`` (a previous reply) says instead whether the file still holds the corruption:
its current sha256 against the one the corruption left (``gone``, ``changed`` or ``intact``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

#: Bytes of a cut tail shown in the record (its full length and digest are always there).
SHOWN = 64


def candidates(root: Path, patterns: str | list[str]) -> list[str]:
    """Non-empty regular files under ``root`` matching any of ``patterns``, as sorted relative paths."""
    out = set()
    for pattern in [patterns] if isinstance(patterns, str) else patterns:
        for p in root.glob(pattern):
            try:
                if p.is_file() and not p.is_symlink() and p.stat().st_size > 0:
                    out.add(p.relative_to(root).as_posix())
            except OSError:
                continue
    return sorted(out)


def _index(u: float, n: int) -> int:
    return min(int(u * n), n - 1)


def written_ranges(fd: int, size: int, block: int = 1 << 16) -> list[tuple[int, int]]:
    """The parts of a file that hold data: its non-zero spans, holes skipped (``SEEK_DATA``). A
    broker that preallocates its files (KahaDB's 32 MiB journal, a few hundred KB of it written,
    an end-of-file mark at its very end) leaves the rest zeros or a hole it never reads as data:
    an offset drawn over the whole size would mostly corrupt nothing. A file of zeros only counts
    as nothing written (no range)."""
    ranges: list[tuple[int, int]] = []
    pos = 0
    while pos < size:
        try:
            pos = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:  # past the last data (ENXIO), or a filesystem without holes
            break
        chunk = os.pread(fd, min(block, size - pos), pos)
        body = chunk.strip(b"\0")
        if body:
            lo = pos + chunk.index(body[:1])
            hi = pos + len(chunk.rstrip(b"\0"))
            if ranges and lo - ranges[-1][1] < block:  # zeros inside the data: still the data
                ranges[-1] = (ranges[-1][0], hi)
            else:
                ranges.append((lo, hi))
        pos += len(chunk) or 1
    return ranges


def sha256_of(fd: int) -> str:
    h = hashlib.sha256()
    off = 0
    while chunk := os.pread(fd, 1 << 20, off):
        h.update(chunk)
        off += len(chunk)
    return h.hexdigest()


def verify(record: dict[str, Any]) -> dict[str, Any]:
    """Whether the corrupted file still holds what the corruption left."""
    path = record["file"]
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return {"file": path, "state": "gone"}
    try:
        now = sha256_of(fd)
    finally:
        os.close(fd)
    return {
        "file": path,
        "state": "intact" if now == record.get("sha256_after") else "changed",
        "sha256": now,
    }


def _at(u: float, ranges: list[tuple[int, int]]) -> int:
    """The file offset a fraction ``u`` of the written bytes falls on."""
    k = _index(u, sum(b - a for a, b in ranges))
    for a, b in ranges:
        if k < b - a:
            return a + k
        k -= b - a
    return ranges[-1][1] - 1


def corrupt(root: Path, plan: dict[str, Any]) -> dict[str, Any]:
    files = candidates(root, plan.get("glob") or "**/*")
    if not files:
        role = f" (file role {plan['role']})" if plan.get("role") else ""
        raise ValueError(f"no non-empty file under {root} matches {plan.get('glob') or '**/*'!r}{role}")
    rel = files[_index(float(plan["file"]), len(files))]
    path = root / rel
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        ranges = written_ranges(fd, size)
        done: dict[str, Any] = {
            "file": str(path),
            **({"role": plan["role"]} if plan.get("role") else {}),
            "candidates": len(files),
            "size_before": size,
            "written": [list(r) for r in ranges[:8]],  # the data offsets are drawn over
            "written_bytes": sum(b - a for a, b in ranges),
            "written_extent": [ranges[0][0], ranges[-1][1]] if ranges else [0, 0],
            "sha256_before": sha256_of(fd),
        }
        if plan["mode"] == "bitflip":
            changes = []
            for u, bit in plan["flips"] if ranges else []:  # an all-zero file: nothing was written
                off = _at(float(u), ranges)
                before = os.pread(fd, 1, off)[0]
                after = before ^ (1 << int(bit))
                os.pwrite(fd, bytes([after]), off)
                changes.append(
                    {"offset": off, "bit": int(bit), "before": f"{before:02x}", "after": f"{after:02x}"}
                )
            done["changes"] = changes
        elif plan["mode"] == "truncate":
            keep = (
                max(0, size - int(plan["bytes"]))
                if plan.get("bytes") is not None
                else _at(float(plan["cut"]), ranges or [(0, size)])
            )
            tail = os.pread(fd, size - keep, keep)
            os.ftruncate(fd, keep)
            done["cut"] = {
                "offset": keep,
                "bytes": len(tail),
                "sha256": hashlib.sha256(tail).hexdigest(),
                "first_bytes": tail[:SHOWN].hex(),
            }
        else:
            raise ValueError(f"unknown mode {plan['mode']!r}")
        os.fsync(fd)
        done["sha256_after"] = sha256_of(fd)
        done["size_after"] = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faults.node.corrupt")
    p.add_argument("--root", help="the broker's data directory")
    p.add_argument("--plan", help="JSON: mode, glob, file and flips/cut/bytes")
    p.add_argument("--verify", help="JSON: a previous reply; say whether its file still holds the corruption")
    a = p.parse_args(argv)
    if not a.verify and not (a.root and a.plan):
        p.error("give --root and --plan, or --verify")
    try:
        if a.verify:
            reply = {"ok": True, **verify(json.loads(a.verify))}
        else:
            reply = {"ok": True, **corrupt(Path(a.root), json.loads(a.plan))}
    except (OSError, ValueError, KeyError, TypeError) as e:
        reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(reply, sort_keys=True))
    return 0 if reply["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
