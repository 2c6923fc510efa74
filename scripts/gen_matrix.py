#!/usr/bin/env python3
"""Write the docs pages of the durability matrices from their cell records, so they cannot drift.

    python3 scripts/gen_matrix.py           # (re)write the page each matrices/*.yaml names (`page:`)
    python3 scripts/gen_matrix.py --check   # exit 1, naming each stale page, if a page differs

A page is made from the matrix file and its records (``matrices/results/<matrix>/``) only: each
cell's records are graded through the ``brokerchaos_grade`` hook (the stored engine, no Spark,
no Docker), those made under another content key than this tree's marked stale (the image tags
are computed, nothing is built). ``brokerchaos matrix`` writes the same page after it runs cells.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "scripts"):  # the harness, and gen_docs beside this script
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from gen_docs import command  # noqa: E402

from harness.errors import BrokerChaosError  # noqa: E402
from harness.host import Host  # noqa: E402
from harness.matrix import grading, model  # noqa: E402
from harness.matrix.cells import docker_images, expand  # noqa: E402
from harness.matrix.command import render_page  # noqa: E402


def matrices(root: Path = ROOT) -> list[Path]:
    """The matrix files that name a page (a fault-class library is not a matrix)."""
    out = []
    for p in sorted((root / "matrices").glob("*.yaml")):
        data = yaml.safe_load(p.read_text())
        if isinstance(data, dict) and "configurations" in data and data.get("page"):
            out.append(p)
    return out


def render(root: Path = ROOT) -> dict[Path, str]:
    host = Host.load([])
    pages = {}
    for path in matrices(root):
        mx = model.load(path)
        assert mx.page is not None
        data = grading.grade_matrix(host, mx, expand(mx, host), docker_images(host))
        pages[mx.page.resolve()] = render_page(mx, data, root)
    return pages


def main(argv: list[str] | None = None) -> int:
    return command(
        argv, render, tool="gen_matrix", what="the durability matrices' pages", errors=(BrokerChaosError,)
    )


if __name__ == "__main__":
    sys.exit(main())
