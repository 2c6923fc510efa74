"""`python -m faults.lazyfs --backing DIR --mount DIR --control SOCKET [--foreground] [--single-thread]`."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from faults.lazyfs.model import NAMES
from faults.lazyfs.ops import serve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m faults.lazyfs",
        description="Mount a FUSE filesystem that keeps unsynced writes in memory, so a power cut can drop them.",
    )
    p.add_argument("--backing", required=True, help="directory holding the durable state (the 'disk')")
    p.add_argument("--mount", required=True, help="mount point programs write through")
    p.add_argument("--control", help="unix socket for status/flush/crash/torn commands")
    p.add_argument("--foreground", action="store_true", help="do not daemonize")
    p.add_argument(
        "--single-thread",
        action="store_true",
        help="serve one request at a time (default: a thread pool, so a held fsync stops nothing else)",
    )
    p.add_argument(
        "--max-threads",
        type=int,
        help="at most this many requests served at once (libfuse's default: 10); each held fsync takes one",
    )
    p.add_argument("--sync-backing", action="store_true", help="also fsync the backing files on persist")
    p.add_argument(
        "--names",
        choices=NAMES,
        default="strict",
        help="the filesystem model: strict (a name is durable only after its directory's fsync), "
        "ext4-ordered (any fsync also commits every name change so far; journal is its old name) "
        "or xfs (an fsync of an object with an uncommitted change commits them; no data written "
        "ahead of a rename over a file)",
    )
    p.add_argument(
        "--no-flush-on-unmount", action="store_true", help="a clean unmount drops unsynced data too"
    )
    p.add_argument("--debug", action="store_true", help="libfuse debug output")
    a = p.parse_args(argv)
    for path, what in ((a.backing, "backing"), (a.mount, "mount")):
        if not os.path.isdir(path):
            print(f"lazyfs: {what} directory {path} does not exist; create it first", file=sys.stderr)
            return 2
    if a.max_threads is not None and a.max_threads < 1:
        print("lazyfs: --max-threads must be at least 1", file=sys.stderr)
        return 2
    if os.path.samefile(a.backing, a.mount):
        print("lazyfs: --backing and --mount must be different directories", file=sys.stderr)
        return 2
    if not os.path.exists("/dev/fuse"):
        print(
            "lazyfs: /dev/fuse is missing (in Docker: --device /dev/fuse --cap-add SYS_ADMIN)",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.WARNING, format="lazyfs: %(message)s")
    try:
        serve(
            a.backing,
            a.mount,
            a.control,
            foreground=a.foreground,
            threads=not a.single_thread,
            max_threads=a.max_threads,
            sync_backing=a.sync_backing,
            names=a.names,
            flush_on_unmount=not a.no_flush_on_unmount,
            debug=a.debug,
        )
    except RuntimeError as e:
        print(
            f"lazyfs: mounting {a.mount} failed (libfuse error {e}); is it already mounted?", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
