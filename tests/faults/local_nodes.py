"""Node inits on this machine (real lazyfs, real nodectl) behind the cluster interface faults use.

A fault class only calls ``cluster.nodes[name].exec(cmd)``, ``cluster.wait_ready(names)`` and
``cluster.topology.data_dir``; here ``exec`` runs the command locally against the node's own init
socket, so a fault's apply and heal run for real without Docker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from faults.lazyfs import fuse_available
from tests.faults.test_nodeinit import CHILD, ENV, Init, wait_for


class LocalNode:
    def __init__(self, name: str, init: Init) -> None:
        self.name = name
        self.init = init

    def exec(self, cmd: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
        env = {**ENV, "BROKERCHAOS_NODE_SOCKET": self.init.sock}
        cmd = [sys.executable if c == "python3" else c for c in cmd]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout + r.stderr


class LocalCluster:
    def __init__(self, inits: dict[str, Init], lazyfs: bool = True) -> None:
        self.nodes = {n: LocalNode(n, i) for n, i in inits.items()}
        # One data directory for all, as in a real cluster (where each container has its own).
        dirs = {i.data for i in inits.values()}
        self.topology = SimpleNamespace(data_dir=dirs.pop() if len(dirs) == 1 else None, lazyfs=lazyfs)
        self.settings: dict[str, object] = {}  # the broker settings a plugin validated: none here

    def wait_ready(self, nodes: Sequence[str]) -> None:
        inits = [self.nodes[n].init for n in nodes]
        wait_for(
            lambda: all(i.log().rsplit(b"boot", 1)[1].count(b"tick") >= 1 for i in inits),
            f"{', '.join(nodes)} ticking",
        )


@contextmanager
def local_inits(names: Sequence[str], lazyfs: bool = True, child: str = CHILD) -> Iterator[dict[str, Init]]:
    """One node init per name, each in its own directory, terminated on exit (skips without FUSE)."""
    reason = fuse_available() if lazyfs else None
    if reason:
        pytest.skip(f"needs FUSE: {reason}")
    with tempfile.TemporaryDirectory(prefix="lcl") as tmp:
        inits: dict[str, Init] = {}
        try:
            for n in names:
                os.makedirs(f"{tmp}/{n}")
                inits[n] = Init(f"{tmp}/{n}", lazyfs, child)
            yield inits
        finally:
            for init in inits.values():
                init.terminate()
