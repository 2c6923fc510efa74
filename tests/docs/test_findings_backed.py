"""Every findings page says which commit and seeds back it, and when: a "**Backed by:**" paragraph
under its title naming a commit (in backticks), the seeds (or "no seeds") and a date (YYYY-MM-DD). The generated
matrix page says it per cell instead (a seed, commit and date column in every cell's table)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FINDINGS = sorted((REPO / "docs" / "findings").glob("*.md"))
#: pages whose findings are not under docs/findings/ but carry one
OTHER_PAGES = [REPO / "docs" / "explanation" / "liveness.md"]
#: generated from cell records, which carry each seed's commit and date
GENERATED = {"matrix.md"}

MARK = "**Backed by:**"
COMMIT = re.compile(r"`[0-9a-f]{7,40}`")
#: the seeds, or "no seeds" said outright (a cluster test of subprocess nodes takes none)
SEED = re.compile(r"\bseeds? \d|\bno seeds\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def backed_by(text: str) -> list[str]:
    """Each "Backed by" paragraph of a page (the marked line and the lines after it, up to a blank)."""
    paragraphs = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(MARK):
            para = [line]
            for rest in lines[i + 1 :]:
                if not rest.strip():
                    break
                para.append(rest)
            paragraphs.append(" ".join(para))
    return paragraphs


def missing(paragraph: str) -> list[str]:
    """What a "Backed by" paragraph lacks of commit, seeds and date."""
    wants = {"a commit in backticks": COMMIT, "its seeds": SEED, "a date (YYYY-MM-DD)": DATE}
    return [what for what, pattern in wants.items() if not pattern.search(paragraph)]


@pytest.mark.parametrize(
    "page", [p for p in FINDINGS if p.name not in GENERATED] + OTHER_PAGES, ids=lambda p: p.name
)
def test_every_findings_page_says_the_commit_seeds_and_date_behind_it(page: Path) -> None:
    paragraphs = backed_by(page.read_text())
    rel = page.relative_to(REPO)
    assert paragraphs, f"{rel}: no '{MARK}' paragraph (the commit, seeds and date behind its findings)"
    for para in paragraphs:
        lacks = missing(para)
        assert not lacks, f"{rel}: '{MARK}' paragraph without {', '.join(lacks)}: {para[:120]}"


def test_the_generated_matrix_page_gives_each_seed_its_commit_and_date() -> None:
    for name in GENERATED:
        text = (REPO / "docs" / "findings" / name).read_text()
        assert "| seed | verdict | confirmed | lost | seconds | commit | date |" in text, name


def test_a_paragraph_without_seeds_is_named() -> None:
    assert missing("**Backed by:** commit `abc1234` (2026-11-28)") == ["its seeds"]
    assert missing("**Backed by:** commit `abc1234`, seeds 1-3, 2026-11-28") == []
    assert backed_by("# T\n\n**Backed by:** a\nb\n\nc\n") == ["**Backed by:** a b"]
