"""The contracts between the parts of brokerchaos, in one place.

``faults/``, ``plugins/``, ``spark_reports/`` and third-party plugins import these
(directly or through ``harness``), never the harness's internals.
"""

from __future__ import annotations

from harness.spec.history import (
    ABANDON_CAUSES,
    FIELDS,
    SCHEMA_VERSION,
    TYPES,
    arrow_schema,
    body_digest,
    message_body,
)

__all__ = [
    "ABANDON_CAUSES",
    "FIELDS",
    "SCHEMA_VERSION",
    "TYPES",
    "arrow_schema",
    "body_digest",
    "message_body",
]
