"""The broker's one operator-facing error, in a leaf module every part may import."""

from __future__ import annotations


class BrokerError(Exception):
    """An operator request that cannot be done (unknown user, bad regex); one line for the CLI."""


def cannot_listen(what: str, setting: str, host: str, port: int, exc: OSError) -> BrokerError:
    """A listener that cannot bind, as one line naming the listener, its address and its setting (a
    node has up to four listeners: naming the client port for a cluster port's clash misleads)."""
    reason = (exc.strerror or str(exc)).rsplit(": ", 1)[-1]
    return BrokerError(
        f"cannot listen for {what} on {host}:{port}: {reason}; stop what holds it or set another {setting}"
    )
