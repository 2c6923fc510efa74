"""The scenario's values the checkers read (seed, message size, budgets), checked once, and the body a message id was sent with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.spec.history import body_digest, message_body
from harness.spec.results import (
    Budgets,
)
from spark_reports.engines.common import ScenarioError

EXCERPT_CHARS = 200
"""The expected body shown beside a corrupted one: as much as a consumer records of what it got."""


@dataclass(frozen=True)
class Params:
    """What the checkers take from the scenario: how bodies were made, and the budgets."""

    seed: int | None
    message_size: int | None
    budgets: Budgets
    delays: bool = False  # workload.delay: delayed publishes are outside the per-producer order check
    #: workload.consumers > 0: someone was asked to consume while the workload ran (a backlog
    #: scenario, ``consumers: 0``, leaves everything to the drain: no consume demand, no window)
    consumers: bool = True
    #: workload.dead_letter: the scenario expects dead-lettering; without it a message the broker
    #: dead-lettered (into its own dead-letter queue or the workload's) makes the run DEAD_LETTERED
    dead_letter: bool = False

    @property
    def bodies_known(self) -> bool:
        return self.seed is not None and self.message_size is not None


def _whole(value: Any, where: str, *, null_ok: bool) -> int | None:
    if value is None and null_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        allowed = "a whole number >= 0" + (" or null" if null_ok else "")
        raise ScenarioError(f"scenario {where} must be {allowed}, not {value!r}: fix the scenario file")
    return value


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ScenarioError(
            f"scenario {where} must be a number of seconds > 0, not {value!r}: fix the scenario file"
        )
    return float(value)


def recovery_budget_of(value: Any) -> float | dict[str, float] | None:
    """``budgets.recovery_s``: seconds for every fault kind, or a mapping from fault kind to seconds."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {str(k): _seconds(v, f"budgets.recovery_s.{k}") for k, v in sorted(value.items())}
    return _seconds(value, "budgets.recovery_s")


def scenario_params(scenario: dict | None) -> Params:
    """Read seed, workload.message_size and budgets from a scenario dict.

    Accepts the scenario itself or a run directory's scenario.json, which wraps it as
    ``{"scenario": {...}, "seed": ...}``. A missing seed or size leaves bodies unverified
    (the results say so); a malformed one is the user's to fix.
    """
    s = scenario or {}
    if isinstance(s.get("scenario"), dict):
        s = s["scenario"]
    w = s.get("workload")
    workload: dict = w if isinstance(w, dict) else {}
    seed = _whole(s["seed"], "seed", null_ok=True) if "seed" in s else None
    size = (
        _whole(workload["message_size"], "workload.message_size", null_ok=True)
        if "message_size" in workload
        else None
    )
    raw = s.get("budgets")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError(f"scenario budgets must be a mapping, not {raw!r}: fix the scenario file")
    unknown = sorted(set(raw) - {"duplicated", "resurrected", "recovery_s"})
    if unknown:
        raise ScenarioError(
            f"scenario budgets: unknown key(s) {', '.join(map(str, unknown))}; "
            "use duplicated, resurrected and recovery_s"
        )
    budgets = Budgets(
        duplicated=_whole(raw.get("duplicated"), "budgets.duplicated", null_ok=True),
        resurrected=_whole(raw.get("resurrected"), "budgets.resurrected", null_ok=True),
        recovery_s=recovery_budget_of(raw.get("recovery_s")),
    )
    return Params(
        seed=seed,
        message_size=size,
        budgets=budgets,
        delays=isinstance(workload.get("delay"), dict),
        consumers=workload.get("consumers") != 0,
        dead_letter=workload.get("dead_letter") is True,
    )


def expected_body(msg_id: str, params: Params) -> str:
    """The body the producer sent for msg_id, as text (message_body is ASCII apart from the id)."""
    assert params.seed is not None and params.message_size is not None
    return message_body(msg_id, params.seed, params.message_size).decode()


def expected_digest(msg_id: str, params: Params) -> str:
    assert params.seed is not None and params.message_size is not None
    return body_digest(message_body(msg_id, params.seed, params.message_size))
