"""The AMQP 0-9-1 client plugin: the workload driver for every broker plugin whose protocol is ``amqp091``."""

from __future__ import annotations

from plugins.amqp091.client import brokerchaos_register_clients

__all__ = ["brokerchaos_register_clients"]
