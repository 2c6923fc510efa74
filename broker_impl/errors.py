"""The broker's one operator-facing error, in a leaf module every part may import."""

from __future__ import annotations


class BrokerError(Exception):
    """An operator request that cannot be done (unknown user, bad regex); one line for the CLI."""
