"""The hook spec is the plugin contract: every hook documented, options exactly as documented.

That the docs site lists every hook is checked in ``tests/docs/test_reference.py``."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from harness.spec import hooks as hookspec

REPO = Path(__file__).resolve().parents[2]
HOOKS = {name: fn for name, fn in vars(hookspec).items() if name.startswith("brokerchaos_") and callable(fn)}


def _opts(fn: Any) -> dict[str, Any]:
    return fn.brokerchaos_spec


def test_there_are_hooks() -> None:
    assert {"brokerchaos_register_brokers", "brokerchaos_register_faults", "brokerchaos_configure"} <= set(
        HOOKS
    )


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_every_hook_has_a_docstring(name: str) -> None:
    doc = inspect.getdoc(HOOKS[name])
    assert doc and len(doc) > 20, f"{name} needs a docstring saying when it is called and what it may do"


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_every_hook_is_a_spec(name: str) -> None:
    assert _opts(HOOKS[name]) is not None


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_historic_and_firstresult_exactly_where_documented(name: str) -> None:
    doc = inspect.getdoc(HOOKS[name]) or ""
    opts = _opts(HOOKS[name])
    assert bool(opts["historic"]) == bool(re.search(r"\bhistoric\b", doc, re.I)), name
    assert bool(opts["firstresult"]) == bool(re.search(r"\bfirst[ -]?result\b|first non-None", doc, re.I)), (
        name
    )


def test_configure_is_the_historic_one() -> None:
    historic = sorted(n for n, fn in HOOKS.items() if _opts(fn)["historic"])
    assert historic == ["brokerchaos_configure"]


def test_hooks_take_keyword_friendly_arguments_only() -> None:
    for name, fn in HOOKS.items():
        for p in inspect.signature(fn).parameters.values():
            assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, (name, p)


def test_every_hook_the_harness_calls_exists() -> None:
    """A typo in a call (``pm.hook.brokerchaos_fualt``) would only fail at run time."""
    called = set()
    for path in (REPO / "harness").glob("*.py"):
        called |= set(re.findall(r"\b(brokerchaos_[a-z_]*[a-z])\b", path.read_text()))
    assert called, "the harness calls no hooks?"
    assert called <= set(HOOKS), sorted(called - set(HOOKS))


def test_every_hook_is_called_by_the_host() -> None:
    text = (REPO / "harness" / "host.py").read_text()
    for name in HOOKS:
        assert name in text, f"{name} is specified but the host never calls it"
