"""The durability matrices' pages are what their cell records grade to (``scripts/gen_matrix.py``
rewrites them; ``brokerchaos matrix`` does after a run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_matrix_page_is_up_to_date_with_its_records() -> None:
    spec = importlib.util.spec_from_file_location("gen_matrix", REPO / "scripts" / "gen_matrix.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    sys.modules["gen_matrix"] = gen
    spec.loader.exec_module(gen)
    pages = gen.render()
    assert pages, "no matrix under matrices/ names a page"
    for path, text in pages.items():
        rel = path.relative_to(REPO)
        assert path.exists(), f"{rel} is missing: run python3 scripts/gen_matrix.py"
        assert path.read_text() == text, f"{rel} is out of date: run python3 scripts/gen_matrix.py"
