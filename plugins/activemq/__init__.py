"""ActiveMQ Classic from Debian's ``activemq`` package (5.17, KahaDB, STOMP 1.2), as a brokerchaos plugin.

Three topologies (``broker.settings.topology``):

- ``single``: each node a broker of its own on its own KahaDB directory, not connected to the
  others (one node is the usual run; with several, the drain still reads every node).
- ``network``: a network of brokers: every node forwards to every other node over OpenWire
  (``networkConnector static:``, store-and-forward on demand). Messages are never copied: each
  lives on exactly one node at a time, forwarded to where a consumer is.
- ``shared-storage``: shared-file-system master/slave: every node is a broker on one KahaDB
  directory, a shared volume (``SharedVolume``). The first to take the store's file lock is the
  master and opens its transport connectors; the others wait on the lock (``slave mode``) with
  no connector open, and one of them takes over when the master dies or loses the lock.

KahaDB's journal sync is a setting (``journal_sync``: ``always`` fsyncs every write before the
broker answers; ``periodic`` every ``journal_sync_interval_ms``; ``never``). Each node binds its
STOMP port to its own address and 127.0.0.1 (where the client proxy forwards), and OpenWire to
its own address (peer links cross the proxies). JMX is off: the depth the drain asks for is a
queue browser's count (``HeldTotal``), run inside the node (``browse.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import (
    BROKER_ROLE,
    BrokerPlugin,
    ClusterError,
    Feature,
    HeldTotal,
    ImageRecipe,
    LogEvent,
    NodeHandle,
    NodeInfo,
    NodeSpec,
    Role,
    ScenarioError,
    SharedVolume,
    hookimpl,
)
from plugins.activemq.client import DLQ, brokerchaos_register_clients

__version__ = "0.1.0"
__all__ = ["ActiveMQ", "brokerchaos_register_brokers", "brokerchaos_register_clients"]

STOMP_PORT = 61613
OPENWIRE_PORT = 61616
CONF_DIR = "/etc/brokerchaos-activemq"
START_SCRIPT = "/usr/local/bin/brokerchaos-activemq"
BROWSE = "/usr/local/lib/brokerchaos-activemq/browse.py"
LOG_DIR = "/var/log/activemq"
LOG_FILE = f"{LOG_DIR}/activemq.log"
DATA_DIR = "/var/lib/activemq/data"
SHARED_DIR = "/var/lib/activemq/shared"  # shared-storage: the one KahaDB directory of every node
TOPOLOGIES = ("single", "network", "shared-storage")

#: log4j2's line prefix in ``activemq.log``: ``2026-11-28 20:31:02,123 | INFO  | ...`` (UTC in the container).
_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \| ")

FEATURES: tuple[Feature, ...] = (
    Feature(
        "KahaDB journal, fsync on every write",
        "journalDiskSyncStrategy=always: a persistent send is answered once its journal write is synced",
        {"journal_sync": ("always",)},
        wanted=("kill", "power-loss"),
    ),
    Feature(
        "KahaDB journal, periodic sync",
        "journalDiskSyncStrategy=periodic: a send is answered before the journal is synced",
        {"journal_sync": ("periodic", "never")},
        wanted=("power-loss",),
    ),
    Feature(
        "network of brokers",
        "store-and-forward between nodes: each message on one node, forwarded on demand",
        {"topology": ("network",)},
        nodes=(2, None),
        wanted=("partition", "kill", "pause"),
    ),
    Feature(
        "shared-storage master/slave",
        "one KahaDB directory on a shared volume, the slaves waiting on its file lock",
        {"topology": ("shared-storage",)},
        nodes=(2, None),
        wanted=("kill", "partition", "pause"),
    ),
)

LOG_EVENTS: tuple[LogEvent, ...] = (
    LogEvent("slave-waiting", r"is now in slave mode waiting a lock to be acquired"),
    LogEvent("broker-started", r"Apache ActiveMQ \S+ \(.*\) started"),
    LogEvent("kahadb-recovery", r"Recovering from the journal|Recovery replayed"),
    LogEvent("bridge-started", r"Network connection between .* has been established"),
    LogEvent("bridge-down", r"Network connection between .* shutdown|Network bridge .* failed"),
    LogEvent("kahadb-corrupt", r"[Cc]orrupt|Checksum|Failed to load"),
)

# Debian builds ActiveMQ against log4j 1.2 (``liblog4j1.2-java``): its properties, not log4j2's.
LOG4J = f"""log4j.rootLogger=INFO, console, file
log4j.logger.org.springframework=WARN
log4j.logger.org.apache.xbean=WARN
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d | %-5p | %m | %c | %t%n
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={LOG_FILE}
log4j.appender.file.Append=true
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d | %-5p | %m | %c | %t%n
"""

# The node's own address is known only once the container runs in its sidecar's namespace.
START = rf"""#!/bin/sh
set -eu
ip=$(getent hosts "$(hostname)" | awk '{{print $1; exit}}')
sed "s/@IP@/$ip/g" {CONF_DIR}/activemq.xml.in > {CONF_DIR}/activemq.xml
mkdir -p {LOG_DIR}
exec java -Xms@HEAP@m -Xmx@HEAP@m -Djava.awt.headless=true \
  -Dactivemq.home=/usr/share/activemq -Dactivemq.base=/var/lib/activemq \
  -Dactivemq.conf={CONF_DIR} -Dactivemq.data={LOG_DIR} \
  -Dlog4j.configuration=file:{CONF_DIR}/log4j.properties \
  -jar /usr/share/activemq/bin/activemq.jar start xbean:file:{CONF_DIR}/activemq.xml
"""

BEANS = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans
    http://www.springframework.org/schema/beans/spring-beans.xsd
    http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
{broker}
</beans>
"""


class ActiveMQ(BrokerPlugin):
    name = "activemq"
    version = __version__
    protocol = "stomp"
    capabilities = frozenset({"kill", "pause", "stop", "power-loss", "partition"})
    client_port = STOMP_PORT
    peer_ports = (OPENWIRE_PORT,)
    data_dir = DATA_DIR
    log_paths = (LOG_FILE,)
    event_logs = ("logs/*.log",)
    # KahaDB checks each journal record's checksum on recovery and skips a damaged one
    # (checksumJournalFiles, on by default since 5.9; ignoreMissingJournalfiles off).
    corruption_response = "recover"
    username = "admin"
    password = "admin"
    vhost = ""
    ready_timeout = 120.0  # a JVM's start on a loaded 2-core machine
    features = FEATURES
    log_events = LOG_EVENTS
    dead_letter_queues = (DLQ,)
    settings_schema = {
        "topology": ("single", TOPOLOGIES),
        "journal_sync": ("always", ("always", "periodic", "never")),
        "journal_sync_interval_ms": (1000, int),
        "heap_mb": (256, int),
    }

    def validate_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        out = super().validate_settings(settings)
        for key, low in (("journal_sync_interval_ms", 1), ("heap_mb", 64)):
            if out[key] < low:
                raise ScenarioError(f"broker.settings.{key}: {out[key]} is out of range; allowed >= {low}")
        return out

    def image(self) -> ImageRecipe:
        return ImageRecipe(
            name="brokerchaos/activemq",
            debian_packages=("activemq",),
            copy={str(Path(__file__).with_name("browse.py")): BROWSE},
        )

    def roles(self, nodes: int, settings: Mapping[str, Any]) -> tuple[Role, ...]:
        if settings.get("topology") == "shared-storage":
            # Every node's store is the shared directory: a power cut there would need the lazy
            # filesystem mounted once for every node (refused with a clear error until then).
            return (Role(BROKER_ROLE, nodes, data_dir=SHARED_DIR),)
        return (Role(BROKER_ROLE, nodes),)

    def shared_volumes(self, settings: Mapping[str, Any]) -> tuple[SharedVolume, ...]:
        if settings.get("topology") == "shared-storage":
            return (SharedVolume("kahadb", SHARED_DIR),)
        return ()

    def store_dir(self, settings: Mapping[str, Any]) -> str:
        return f"{SHARED_DIR if settings['topology'] == 'shared-storage' else DATA_DIR}/kahadb"

    def broker_xml(self, node: NodeInfo) -> str:
        s = node.settings
        connectors = [
            f'<transportConnector name="stomp-local" uri="stomp://127.0.0.1:{STOMP_PORT}"/>',
            f'<transportConnector name="stomp" uri="stomp://@IP@:{STOMP_PORT}"/>',
        ]
        network = []
        if s["topology"] == "network":
            connectors.append(f'<transportConnector name="openwire" uri="tcp://@IP@:{OPENWIRE_PORT}"/>')
            network = [
                f'<networkConnector name="{node.name}-to-{peer}" uri="static:(tcp://{peer}:{OPENWIRE_PORT})" '
                'duplex="false" networkTTL="3" conduitSubscriptions="true" '
                'decreaseNetworkConsumerPriority="true"/>'
                for peer in node.peers
            ]
        lines = [
            f'<broker xmlns="http://activemq.apache.org/schema/core" brokerName="{node.name}" useJmx="false"',
            f'        persistent="true" dataDirectory="{DATA_DIR}" schedulerSupport="false">',
            "  <destinationPolicy><policyMap><policyEntries>",
            '    <policyEntry queue=">"><networkBridgeFilterFactory>',
            '      <conditionalNetworkBridgeFilterFactory replayWhenNoConsumers="true"/>',
            "    </networkBridgeFilterFactory></policyEntry>",
            "  </policyEntries></policyMap></destinationPolicy>",
            "  <persistenceAdapter>",
            f'    <kahaDB directory="{self.store_dir(s)}" journalDiskSyncStrategy="{s["journal_sync"]}"'
            f' journalDiskSyncInterval="{s["journal_sync_interval_ms"]}"/>',
            "  </persistenceAdapter>",
            f"  <networkConnectors>{''.join(network)}</networkConnectors>" if network else "",
            f"  <transportConnectors>{''.join(connectors)}</transportConnectors>",
            "</broker>",
        ]
        return BEANS.format(broker="\n".join(line for line in lines if line))

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        files = {
            START_SCRIPT: START.replace("@HEAP@", str(node.settings["heap_mb"])),
            f"{CONF_DIR}/activemq.xml.in": self.broker_xml(node),
            f"{CONF_DIR}/log4j.properties": LOG4J,
        }
        return NodeSpec(command=["/bin/sh", START_SCRIPT], files=files)

    def is_ready(self, node: NodeHandle) -> bool:
        """Serving STOMP; in a shared-storage pair a slave waiting on the store's lock is ready too
        (it serves nothing until it takes over: that is what it is for)."""
        if node.exec(["python3", BROWSE, str(STOMP_PORT), "brokerchaos.ready"], timeout=20)[0] == 0:
            return True
        # Since this start (every start logs its persistence adapter before it tries the lock).
        script = "/Using Persistence Adapter/{s=0} /slave mode waiting a lock/{s=1} END{exit !s}"
        return node.exec(["awk", script, LOG_FILE], timeout=10)[0] == 0

    def form_cluster(self, nodes: Sequence[NodeHandle], settings: Mapping[str, Any]) -> None:
        """Nothing to join: network connectors dial their peers on their own, retrying; a
        shared-storage pair has its master once one node took the lock (``is_ready``)."""

    def client_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {"topology": settings.get("topology", "single")}

    def queue_depth(self, node: NodeHandle, queue: str) -> HeldTotal | None:
        """What a queue browser on this node counts (ready and unacknowledged together)."""
        rc, out = node.exec(["python3", BROWSE, str(STOMP_PORT), queue], timeout=30)
        if rc != 0:
            raise ClusterError(f"{node.name}: browsing {queue}: {out.strip()[-200:]}")
        return HeldTotal(int(out.strip().splitlines()[-1]))

    def log_time(self, line: str) -> datetime | None:
        m = _TIME.match(line)
        if m is None:
            return None
        return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    register.add_broker(ActiveMQ())
