"""The reference AMQP 0-9-1 broker: a standalone program (``python -m broker_impl --config FILE``).

Layers, bottom up: ``codec`` (bytes <-> frames), ``protocol`` (asyncio transport,
back-pressure), ``connection`` and ``channel`` (state machines), ``exchange`` and
``queue`` (routing, consumers), ``vhost``/``broker`` (entities, metadata store),
``flow`` (credit flow), ``server`` (listening, alarms, shutdown), ``ctl`` (admin CLI).
Message storage sits behind ``backing_queue`` (``backing``, ``store``).
"""

from __future__ import annotations

__all__: list[str] = []
