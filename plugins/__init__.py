"""Broker plugins shipped with brokerchaos. Each registers through the ``brokerchaos`` entry points."""
