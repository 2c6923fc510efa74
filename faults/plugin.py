"""Registers the shipped fault kinds, through the same hook any fault package uses."""

from __future__ import annotations

from typing import Any

from faults.clock import CLOCK_FAULTS
from faults.corrupt import CorruptFile
from faults.disk import DISK_FAULTS
from faults.membership import MemberRemove
from faults.network import LinkToxic, Partition
from faults.packets import PACKET_FAULTS
from faults.power import PowerLossCoordinated
from faults.process import Kill, Pause, PowerLoss, RollingRestart, Stop
from harness import hookimpl


@hookimpl
def brokerchaos_register_faults(register: Any) -> None:
    for fault in (
        Partition,
        LinkToxic,
        Kill,
        Pause,
        Stop,
        PowerLoss,
        RollingRestart,
        PowerLossCoordinated,
        CorruptFile,
        MemberRemove,
        *DISK_FAULTS,
    ):
        register.add_fault(fault)
    for fault in (*CLOCK_FAULTS, *PACKET_FAULTS):
        register.add_fault(fault)
