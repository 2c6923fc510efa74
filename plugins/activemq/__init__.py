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
- ``jdbc``: JDBC master/slave: the brokers keep their store in PostgreSQL, a ``storage`` node of
  its own (Debian's ``postgresql`` on the same base, no clients), through the
  ``jdbcPersistenceAdapter`` and its lease locker: the master holds a lease row in
  ``ACTIVEMQ_LOCK`` and renews it; a slave takes it over once it expires.

KahaDB's journal sync is a setting (``journal_sync``: ``always`` fsyncs every write before the
broker answers; ``periodic`` every ``journal_sync_interval_ms``; ``never``). Each node binds its
STOMP port to its own address and 127.0.0.1 (where the client proxy forwards), and OpenWire to
its own address (peer links cross the proxies). JMX is off: the depth the drain asks for is a
queue browser's count (``HeldTotal``), run inside the node (``browse.py``). In a JDBC pair the
durability is PostgreSQL's (``db_fsync``, ``db_synchronous_commit``), and power loss aims at the
storage node, whose data directory is the one store of every broker.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import (
    BROKER_ROLE,
    BrokerEvent,
    BrokerPlugin,
    Feature,
    HeldTotal,
    ImageRecipe,
    LogEvent,
    NodeHandle,
    NodeInfo,
    NodeSpec,
    NotYet,
    Role,
    ScenarioError,
    SharedVolume,
    hookimpl,
    node_role,
    poll,
    run_or_fail,
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
TOPOLOGIES = ("single", "network", "shared-storage", "jdbc")
KAHADB_TOPOLOGIES = ("single", "network", "shared-storage")  # a JDBC pair keeps no KahaDB journal
PG_PORT = 5432
PG_DATA = "/var/lib/postgresql/brokerchaos"  # jdbc: the storage node's cluster (on lazyfs under power loss)
PG_START = "/usr/local/bin/brokerchaos-postgresql"
STORAGE_ROLE = "storage"
#: The storage node's image: PostgreSQL from Debian on the project's base, nothing of ActiveMQ.
PG_IMAGE = ImageRecipe(name="brokerchaos/activemq-postgresql", debian_packages=("postgresql",))

#: PostgreSQL's default ``log_line_prefix`` (``%m [%p] ``): ``2026-11-28 20:31:02.123 UTC [12] LOG: ...``.
_PG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) UTC \[")

#: log4j2's line prefix in ``activemq.log``: ``2026-11-28 20:31:02,123 | INFO  | ...`` (UTC in the container).
_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \| ")

FEATURES: tuple[Feature, ...] = (
    Feature(
        "KahaDB journal, fsync on every write",
        "journalDiskSyncStrategy=always: a persistent send is answered once its journal write is synced",
        {"journal_sync": ("always",), "topology": KAHADB_TOPOLOGIES},
        wanted=("kill", "power-loss"),
    ),
    Feature(
        "KahaDB journal, periodic sync",
        "journalDiskSyncStrategy=periodic: a send is answered before the journal is synced",
        {"journal_sync": ("periodic", "never"), "topology": KAHADB_TOPOLOGIES},
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
    Feature(
        "JDBC master/slave",
        "both brokers on one PostgreSQL database, the master holding a lease row in ACTIVEMQ_LOCK",
        {"topology": ("jdbc",)},
        nodes=(2, None),
        wanted=("kill", "partition", "power-loss"),
    ),
    Feature(
        "PostgreSQL synchronous commit",
        "synchronous_commit=on: the database answers a commit once its WAL record is flushed",
        {"topology": ("jdbc",), "db_synchronous_commit": ("on",)},
        wanted=("power-loss",),
    ),
    Feature(
        "PostgreSQL asynchronous commit",
        "synchronous_commit=off: the database answers a commit before its WAL record is flushed",
        {"topology": ("jdbc",), "db_synchronous_commit": ("off",)},
        wanted=("power-loss",),
    ),
)

LOG_EVENTS: tuple[LogEvent, ...] = (
    LogEvent("slave-waiting", r"is now in slave mode waiting a lock to be acquired"),
    LogEvent("broker-started", r"Apache ActiveMQ \S+ \(.*\) started"),
    LogEvent("kahadb-recovery", r"Recovering from the journal|Recovery replayed"),
    LogEvent("bridge-started", r"Network connection between .* has been established"),
    LogEvent("bridge-down", r"Network connection between .* shutdown|Network bridge .* failed"),
    LogEvent("kahadb-corrupt", r"[Cc]orrupt|Checksum|Failed to load"),
    LogEvent("lease-master", r"becoming master with lease expiry"),
    LogEvent("lease-lost", r"no longer able to keep the exclusive lock"),
    LogEvent("db-ready", r"database system is ready to accept connections"),
    LogEvent("db-recovery", r"database system was (not properly shut down|interrupted)|redo starts at"),
)

# Debian builds ActiveMQ against log4j 1.2 (``liblog4j1.2-java``): its properties, not log4j2's.
LOG4J = f"""log4j.rootLogger=INFO, console, file
log4j.logger.org.springframework=WARN
log4j.logger.org.apache.xbean=WARN
# A JDBC slave says it waits only at DEBUG ("Lease held by n1 till ..."): readiness reads it.
log4j.logger.org.apache.activemq.store.jdbc.LeaseDatabaseLocker=DEBUG
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
@WAIT@exec java -Xms@HEAP@m -Xmx@HEAP@m -Djava.awt.headless=true \
  -Dactivemq.home=/usr/share/activemq -Dactivemq.base=/var/lib/activemq \
  -Dactivemq.conf={CONF_DIR} -Dactivemq.data={LOG_DIR} \
  -Dlog4j.configuration=file:{CONF_DIR}/log4j.properties \
  -jar /usr/share/activemq/bin/activemq.jar start xbean:file:{CONF_DIR}/activemq.xml
"""

# jdbc: ActiveMQ picks its SQL dialect from the driver it finds connected at start (without a
# database it falls back to the generic one, whose BLOB PostgreSQL lacks): wait for the database.
WAIT_DB = """db=@DB@
until pg_isready -q -h "$db" -p @PORT@ -U postgres -t 5; do
  echo "waiting for the database on $db" >&2
  sleep 1
done
"""

# jdbc, the storage node: one PostgreSQL cluster in the data directory, made on the first start
# (a restart after a kill or a power cut recovers the one there). Its own address and 127.0.0.1,
# never the wildcard (the sidecar listens on the peers' loopback addresses); trust for the run's
# network (a throwaway cluster on a private bridge).
PG_START_SCRIPT = rf"""#!/bin/sh
set -eu
ip=$(getent hosts "$(hostname)" | awk '{{print $1; exit}}')
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
mkdir -p /var/run/postgresql
chown postgres:postgres {PG_DATA} /var/run/postgresql
chmod 700 {PG_DATA}
if [ ! -s {PG_DATA}/PG_VERSION ]; then
  runuser -u postgres -- "$bin/initdb" -D {PG_DATA} -U postgres --auth=trust --no-locale -E UTF8
  printf 'local all all trust\nhost all all 0.0.0.0/0 trust\n' > {PG_DATA}/pg_hba.conf
fi
exec runuser -u postgres -- "$bin/postgres" -D {PG_DATA} -c "listen_addresses=$ip,127.0.0.1"   -c port={PG_PORT} -c fsync=@FSYNC@ -c synchronous_commit=@SYNC@ -c full_page_writes=on
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
    # A broker's events are in its activemq.log; the database of a JDBC pair logs to its output.
    event_logs = ("logs/*.log", "broker.log")
    # KahaDB checks each journal record's checksum on recovery and skips a damaged one
    # (checksumJournalFiles, on by default since 5.9; ignoreMissingJournalfiles off).
    corruption_response = "recover"
    username = "admin"
    password = "admin"
    vhost = ""
    # A JVM's start on a loaded 2-core machine; in a JDBC pair after the database's first initdb
    # (on the lazy filesystem under power loss), which the brokers wait for.
    ready_timeout = 300.0
    features = FEATURES
    log_events = LOG_EVENTS
    dead_letter_queues = (DLQ,)
    settings_schema = {
        "topology": ("single", TOPOLOGIES),
        "journal_sync": ("always", ("always", "periodic", "never")),
        "journal_sync_interval_ms": (1000, int),
        "heap_mb": (256, int),
        # network: a node with no consumer left sends what it holds back towards one
        # (conditionalNetworkBridgeFilterFactory replayWhenNoConsumers); off, such messages
        # stay where they are until a consumer reaches that node (stranded)
        "replay_when_no_consumers": (True, bool),
        # jdbc: PostgreSQL's durability (the database's, not ActiveMQ's, in this topology)
        "db_fsync": (True, bool),
        "db_synchronous_commit": ("on", ("on", "off")),
        # jdbc: the lease a master holds (lockAcquireSleepInterval; it renews it every half)
        "lease_ms": (10000, int),
    }

    def validate_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        out = super().validate_settings(settings)
        for key, low in (("journal_sync_interval_ms", 1), ("heap_mb", 64), ("lease_ms", 1000)):
            if out[key] < low:
                raise ScenarioError(f"broker.settings.{key}: {out[key]} is out of range; allowed >= {low}")
        return out

    def image(self) -> ImageRecipe:
        return ImageRecipe(
            name="brokerchaos/activemq",
            # jdbc: ActiveMQ's JDBC store is in the package (lib/activemq-jdbc-store.jar), the
            # driver is not; pg_isready (postgresql-client) waits for the database.
            debian_packages=("activemq", "libpostgresql-jdbc-java", "postgresql-client"),
            copy={str(Path(__file__).with_name("browse.py")): BROWSE},
            run=("ln -s /usr/share/java/postgresql.jar /usr/share/activemq/lib/optional/postgresql.jar",),
        )

    def roles(self, nodes: int, settings: Mapping[str, Any]) -> tuple[Role, ...]:
        if settings.get("topology") == "shared-storage":
            # Every node's store is the shared directory. Under power loss the harness mounts the
            # lazy filesystem there once, for both nodes: a cut kills both and drops what it held.
            return (Role(BROKER_ROLE, nodes, data_dir=SHARED_DIR),)
        if settings.get("topology") == "jdbc":
            # Declared last: the database is the node after the brokers (n3 beside n1 and n2).
            return (
                Role(BROKER_ROLE, nodes),
                Role(STORAGE_ROLE, 1, image=PG_IMAGE, clients=False, data_dir=PG_DATA),
            )
        return (Role(BROKER_ROLE, nodes),)

    def disjoint_nodes(self, settings: Mapping[str, Any]) -> bool:
        # A network of brokers forwards a message, never copies it; separate single brokers share
        # nothing. A shared-storage pair serves one store from one master at a time: two masters
        # serving it at once would be a real split brain, so it declares nothing.
        return settings.get("topology") in ("single", "network")

    def peer_ports_for(self, index: int) -> tuple[int, ...]:
        # A broker reaches the database through its sidecar like a peer (so partitions cut it);
        # nothing listens on 5432 on a broker node, nor on 61616 outside a network of brokers.
        return (OPENWIRE_PORT, PG_PORT)

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
        store = (
            f'    <kahaDB directory="{self.store_dir(s)}" journalDiskSyncStrategy="{s["journal_sync"]}"'
            f' journalDiskSyncInterval="{s["journal_sync_interval_ms"]}"/>'
        )
        if s["topology"] == "jdbc":
            store = (
                f'    <jdbcPersistenceAdapter dataSource="#postgres-ds" dataDirectory="{DATA_DIR}"'
                f' lockKeepAlivePeriod="{s["lease_ms"] // 2}">\n'
                f'      <locker><lease-database-locker lockAcquireSleepInterval="{s["lease_ms"]}"/></locker>\n'
                "    </jdbcPersistenceAdapter>"
            )
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
            "      <conditionalNetworkBridgeFilterFactory replayWhenNoConsumers="
            f'"{str(s["replay_when_no_consumers"]).lower()}"/>',
            "    </networkBridgeFilterFactory></policyEntry>",
            "  </policyEntries></policyMap></destinationPolicy>",
            "  <persistenceAdapter>",
            store,
            "  </persistenceAdapter>",
            f"  <networkConnectors>{''.join(network)}</networkConnectors>" if network else "",
            f"  <transportConnectors>{''.join(connectors)}</transportConnectors>",
            "</broker>",
        ]
        if s["topology"] == "jdbc":
            lines += self.datasource(self.storage_node(node))
        return BEANS.format(broker="\n".join(line for line in lines if line))

    @staticmethod
    def storage_node(node: NodeInfo) -> str:
        """The database's node: the last of the cluster (``roles`` declares it after the brokers)."""
        return f"n{len(node.peers) + 1}"

    @staticmethod
    def datasource(host: str) -> list[str]:
        """A plain PostgreSQL data source (a new connection per use: nothing pooled survives a cut
        to be found dead later), with timeouts, so a silent link fails a statement instead of
        holding it forever (seconds)."""
        props = {
            "serverNames": host,
            "portNumbers": str(PG_PORT),
            "databaseName": "postgres",
            "user": "postgres",
            "connectTimeout": "5",
            "socketTimeout": "15",
            "loginTimeout": "10",
        }
        return [
            '<bean id="postgres-ds" class="org.postgresql.ds.PGSimpleDataSource">',
            *(f'  <property name="{k}" value="{v}"/>' for k, v in props.items()),
            "</bean>",
        ]

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        s = node.settings
        if node.role == STORAGE_ROLE:
            script = PG_START_SCRIPT.replace("@FSYNC@", "on" if s["db_fsync"] else "off")
            return NodeSpec(
                command=["/bin/sh", PG_START],
                files={PG_START: script.replace("@SYNC@", s["db_synchronous_commit"])},
            )
        wait = ""
        if s["topology"] == "jdbc":
            wait = WAIT_DB.replace("@DB@", self.storage_node(node)).replace("@PORT@", str(PG_PORT))
        start = START.replace("@HEAP@", str(s["heap_mb"])).replace("@WAIT@", wait)
        files = {
            START_SCRIPT: start,
            f"{CONF_DIR}/activemq.xml.in": self.broker_xml(node),
            f"{CONF_DIR}/log4j.properties": LOG4J,
        }
        return NodeSpec(command=["/bin/sh", START_SCRIPT], files=files)

    def is_ready(self, node: NodeHandle) -> bool:
        """Serving STOMP; in a shared-storage pair a slave waiting on the store's lock is ready too
        (it serves nothing until it takes over: that is what it is for). The database of a JDBC
        pair: accepting connections (``pg_isready``)."""
        if node_role(node) == STORAGE_ROLE:
            return node.exec(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(PG_PORT)], timeout=20)[0] == 0
        if node.exec(["python3", BROWSE, str(STOMP_PORT), "brokerchaos.ready"], timeout=20)[0] == 0:
            return True
        # Since this start (every start logs its persistence adapter before it tries the lock).
        script = (
            "/Using Persistence Adapter/{s=0} /slave mode waiting a lock|Lease held by/{s=1} END{exit !s}"
        )
        return node.exec(["awk", script, LOG_FILE], timeout=10)[0] == 0

    def form_cluster(self, nodes: Sequence[NodeHandle], settings: Mapping[str, Any]) -> None:
        """Nothing to join: network connectors dial their peers on their own, retrying; a
        shared-storage pair has its master once one node took the lock (``is_ready``). A JDBC
        pair's brokers may all be waiting while the first lease is taken: wait for one to serve."""
        if settings.get("topology") != "jdbc":
            return
        brokers = [n for n in nodes if node_role(n) != STORAGE_ROLE]

        def serving() -> str | NotYet:
            for n in brokers:
                if n.exec(["python3", BROWSE, str(STOMP_PORT), "brokerchaos.ready"], timeout=20)[0] == 0:
                    return n.name
            return NotYet("no broker serves STOMP yet")

        poll(serving, timeout=self.ready_timeout, failure="no JDBC master took the lease", interval=2.0)

    def client_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {"topology": settings.get("topology", "single")}

    def queue_depth(self, node: NodeHandle, queue: str, timeout: float) -> HeldTotal | None:
        """What a queue browser on this node counts (ready and unacknowledged together)."""
        out = run_or_fail(node, ["python3", BROWSE, str(STOMP_PORT), queue], timeout=timeout)
        return HeldTotal(int(out.strip().splitlines()[-1]))

    def events(self, node: str, logs: Mapping[str, str]) -> list[BrokerEvent]:
        """The default's, from ``activemq.log`` where the node has one (a broker's output repeats
        it), else from the output (the database's)."""
        own = {p: t for p, t in logs.items() if p.startswith("logs/")}
        return super().events(node, own or logs)

    def log_time(self, line: str) -> datetime | None:
        m = _TIME.match(line)
        if m is not None:
            return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
        m = _PG_TIME.match(line)
        if m is not None:
            return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
        return None


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    register.add_broker(ActiveMQ())
