"""Master-slave replication of the commit log, RocketMQ style: the second replication mode.

GM mirrored queues (``broker_impl.cluster``) replicate each queue's operations
among peers that can all take over. This mode replicates the whole commit log
from one master to its slave(s), as RocketMQ 4.x does, and is chosen per node
with a ``[replication]`` table (``config.py``): ``role = "sync_master"``,
``"async_master"`` or ``"slave"``. A node has one mode or the other.

Taken from RocketMQ (store/ha: HAService, HAConnection, HAClient,
GroupTransferService; CommitLog.handleHA):

- The slave connects to the master's HA port, reports the offset its copy ends at,
  and the master streams its log from there; the slave writes the bytes at the same
  offsets and reports back after each batch and as a heartbeat. Either side drops a
  link that stays silent (haHousekeepingInterval). A slave with an empty replica starts
  at the master's first segment (RocketMQ starts it at the last one), so it holds
  everything the master still holds.
- ASYNC_MASTER confirms a publish once its own flush policy is met. SYNC_MASTER then
  also waits until a slave reported the message's end offset: no slave connected, or
  the best slave further behind than ``max_lag_bytes`` (haMaxGapNotInSync), is
  SLAVE_NOT_AVAILABLE at once; no report within ``sync_timeout_ms`` (syncFlushTimeout)
  is FLUSH_SLAVE_TIMEOUT. RocketMQ still returns a send result then; here both are a
  ``basic.nack``, never a confirm. The message stays in the master's log and may
  be delivered (the harness counts it "recovered", not lost).
- A slave does not take writes (RocketMQ: "message store is slave mode, so
  putMessage is forbidden"): a publish on a slave closes its channel with 403, so a
  client moves to the master. It learns the master's durable queues (RocketMQ's
  SlaveSynchronize copies topic configs) so a consumer can attach there.

Changed:

- A master whose last stop was abnormal (its store's abort marker was there) does
  not serve clients until a slave has connected and handed back whatever its replica
  holds beyond the master's log end. With ``flush = "async"`` a power loss cuts the
  master's log to what it had fsynced, confirmed messages included; RocketMQ 4.x
  (without DLedger) would then serve the shorter log and append new records at
  offsets the slave already holds, after which the slave refuses to follow. Here
  the master takes the lost tail back from the slave, fsyncs it, and only then loads
  its queues and opens its AMQP listener. So what an ASYNC master loses at a power
  cut is exactly what its slave had not pulled; a SYNC master confirmed nothing its
  slave had not reported, so it loses nothing while the slave lives. The cost is
  availability: such a master waits for its slave for as long as it takes.
- The slave reports an offset only once its own flush policy makes the copy safe
  (RocketMQ reports what it has written); with ``flush = "sync"`` on the slave, a
  SYNC master's confirm means the message is fsynced on the slave.
- Consumers do not read from the slave (RocketMQ's slaveReadEnable and its
  fallback to the slave while the master is down are not built): a slave's queues
  are empty placeholders. The slave's data reaches clients through its master,
  which takes it back when it returns; there is no automatic failover (RocketMQ
  4.x has none without DLedger either).
- Only the commit log is replicated: consumer progress (acks) stays on the master,
  so a master that loses acks at a power cut delivers those messages again.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from broker_impl.config import Config
from broker_impl.replication.config import ReplicationConfig
from broker_impl.store import Store, open_store

if TYPE_CHECKING:
    from broker_impl.replication.master import Master
    from broker_impl.replication.slave import Slave
    from broker_impl.vhost import VHost

log = logging.getLogger("broker_impl.replication")

REPLICA_DIR = "replica"

__all__ = ["REPLICA_DIR", "Replication", "ReplicationConfig"]


class ReplicationOwner(Protocol):
    """What replication needs from the node it runs on (``broker_impl.broker.Broker``)."""

    config: Config
    data_dir: Path
    vhosts: dict[str, VHost]

    def metadata(self) -> dict[str, Any]: ...

    def add_vhost(self, name: str) -> None: ...


class Replication:
    """What the broker sees of this mode: attach to the store, refuse writes on a slave, status, stop."""

    def __init__(self, broker: ReplicationOwner, cfg: ReplicationConfig) -> None:
        self.broker = broker
        self.cfg = cfg
        self.master: Master | None = None
        self.slave: Slave | None = None

    async def attach(self, store: Store) -> None:
        """Before the broker loads its queues: a master may first take back a lost tail."""
        if self.cfg.is_master:
            from broker_impl.replication.master import Master

            self.master = Master(self.cfg, store, self.broker.metadata)
            store.on_append = self.master.appended
            if self.cfg.role == "sync_master":
                store.replica_wait = self.master.wait_replicated
            await self.master.start(catch_up=not store.recovery_report.clean)
        else:
            from broker_impl.replication.slave import Slave

            replica = await open_store(self.broker.data_dir / REPLICA_DIR, self.broker.config.store)
            self.slave = Slave(self.cfg, replica, self._apply_metadata)
            self.slave.start()

    def publish_refusal(self) -> str | None:
        """Why this node takes no publishes (None: it does)."""
        if self.slave is None:
            return None
        host, _ = self.cfg.master or ("?", 0)
        return f"node {self.cfg.node} is a read-only slave of {host}; publish to the master"

    def metadata_changed(self) -> None:
        if self.master is not None:
            self.master.metadata_changed()

    def status(self) -> dict[str, Any]:
        if self.master is not None:
            return self.master.status()
        if self.slave is not None:
            return self.slave.status()
        return {"role": self.cfg.role}

    async def stop(self) -> None:
        if self.master is not None:
            await self.master.stop()
        if self.slave is not None:
            await self.slave.stop()

    async def _apply_metadata(self, meta: dict[str, Any]) -> None:
        """Declare the master's durable queues here (empty: see the module docstring)."""
        vhosts = meta.get("vhosts")
        if not isinstance(vhosts, dict):
            return
        for vname, vd in vhosts.items():
            if vname not in self.broker.vhosts:
                self.broker.add_vhost(vname)
            vh = self.broker.vhosts[vname]
            for q in vd.get("queues", []) if isinstance(vd, dict) else []:
                name = q.get("name") if isinstance(q, dict) else None
                if isinstance(name, str) and name and name not in vh.queues:
                    await vh.declare_queue(
                        name,
                        owner=None,
                        durable=True,
                        auto_delete=bool(q.get("auto_delete")),
                        arguments=dict(q.get("arguments") or {}),
                    )
                    log.info("queue %r in vhost %r declared from the master's metadata", name, vname)
