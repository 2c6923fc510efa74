"""The docs site's reference pages come from the code: a new fault kind, scenario field, hook
or command-line option without its documentation fails here, and so does a page nobody
regenerated after the code changed (``python3 scripts/gen_docs.py`` rewrites them)."""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from harness.spec import Fault
from harness.spec import hooks as hookspec

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = module
    spec.loader.exec_module(module)
    return module


gen = _gen_docs()


@pytest.mark.parametrize("name", sorted(gen.PAGES))
def test_the_generated_page_is_what_the_code_says(name: str) -> None:
    page = gen.REFERENCE / name
    want = gen.PAGES[name]()
    assert page.exists(), f"docs/reference/{name} is missing: run python3 scripts/gen_docs.py"
    assert page.read_text() == want, f"docs/reference/{name} is out of date: run python3 scripts/gen_docs.py"


def test_every_generated_page_is_in_the_site_nav() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    missing = [name for name in gen.PAGES if f"reference/{name}" not in nav]
    assert not missing, f"generated pages missing from mkdocs.yml's nav: {missing}"


def test_every_hook_is_documented_on_the_docs_site() -> None:
    """Moved here from the README: the hooks page lists every hook with its docstring."""
    hooks = [n for n, fn in vars(hookspec).items() if n.startswith("brokerchaos_") and callable(fn)]
    assert sorted(gen.hook_names()) == sorted(hooks)
    text = (DOCS / "reference" / "hooks.md").read_text()
    for name in hooks:
        assert f"## `{name}`" in text, f"{name} has no section in docs/reference/hooks.md"
        first = (getattr(hookspec, name).__doc__ or "").strip().splitlines()[0]
        assert gen._md(first) in text, f"{name}'s docstring is not on docs/reference/hooks.md"


def test_every_registered_fault_kind_has_a_section() -> None:
    from harness.host import Host

    text = (DOCS / "reference" / "faults.md").read_text()
    for name in Host.load().registry.faults:
        assert f"## `{name}`" in text, f"fault kind {name} is missing from docs/reference/faults.md"


def test_a_fault_kind_without_a_docstring_cannot_be_documented() -> None:
    class Undocumented(Fault):
        name = "undocumented"

    with pytest.raises(gen.DocsError, match="undocumented.*has no docstring"):
        gen._fault_doc("undocumented", Undocumented)


def test_an_option_without_help_cannot_be_documented() -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--quiet-one", action="store_true")
    with pytest.raises(gen.DocsError, match="--quiet-one has no help text"):
        gen._option_rows(parser, "x")


def test_a_field_comment_is_what_the_page_says() -> None:
    from harness.scenario import WorkloadSection

    comments = gen._comments(WorkloadSection)
    assert comments["in_flight"] == "unconfirmed publishes per producer"  # a trailing comment
    assert comments["producers"].startswith("Producer processes")  # the ``#:`` line above wins


def test_allowed_values_are_the_loaders_own() -> None:
    """The scenario page's 'allowed' column is what the loader answers, so it moves with it."""
    assert gen._allowed("broker.nodes") == "an integer from 1 to 9"
    assert gen._allowed("workload.consumer.requeue").startswith("a number from 0 to 1")
    assert "at most `workload.consumers`" in gen._allowed("workload.consumer.slow")


def test_every_shipped_scenario_is_listed() -> None:
    text = (DOCS / "reference" / "scenarios.md").read_text()
    missing = [
        p.name
        for p in sorted((REPO / "scenarios").iterdir())
        if p.suffix in (".yaml", ".toml") and p.name not in text
    ]
    assert not missing, f"scenarios missing from docs/reference/scenarios.md: {missing}"


def test_no_page_speaks_of_the_day() -> None:
    """Measurements say their load and cores, not which day's machine they ran on."""
    words = re.compile(r"\btoday\b|\bthis machine\b|\bthe day before\b|\bof the day\b", re.I)
    bad = [
        f"{p.relative_to(REPO)}: {line.strip()}"
        for p in [REPO / "README.md", *DOCS.rglob("*.md")]
        for line in p.read_text().splitlines()
        if words.search(line)
    ]
    assert not bad, "\n".join(bad)
