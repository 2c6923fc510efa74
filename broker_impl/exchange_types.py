"""Every exchange type this broker has, by the name an ``exchange.declare`` gives.

The routing types live in ``broker_impl.exchange``; ``x-delayed-message``
(``broker_impl.delayed``) wraps one of them, so the factory that knows both sits
above the two.
"""

from __future__ import annotations

from typing import Any

from broker_impl.delayed import DELAYED_TYPE, DelayedExchange
from broker_impl.exchange import Exchange, make_routing_exchange


def make_exchange(type_: str, name: str, **kwargs: Any) -> Exchange:
    """Raise KeyError for an unknown type (the caller turns it into 503 COMMAND_INVALID), ValueError
    for arguments the type refuses (406 PRECONDITION_FAILED)."""
    if type_ == DELAYED_TYPE:
        return DelayedExchange(name, **kwargs)
    return make_routing_exchange(type_, name, **kwargs)
