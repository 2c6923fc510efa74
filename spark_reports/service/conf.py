"""The Spark settings every session of the checkers has, in process or on a Spark Connect server."""

from __future__ import annotations

import tempfile
from pathlib import Path

DEFAULT_DRIVER_MEMORY = "1g"
JVM_OPTIONS = "-XX:-DontCompileHugeMethods -XX:+UseParallelGC"
"""HotSpot leaves a method of more than 8,000 bytes of bytecode to its interpreter (Spark's
PR #14370 says so of generated code), and the stage that ends the per-id aggregate and
derives each id's flags compiles to one such method: interpreted, it cost twice the
aggregate itself (a 10M-record history: 26.5 s of CPU against 14.8 s with the first flag).
The check is a batch job: the throughput collector, not the default low-pause G1, took a
10M-record history's check from 29.5 s to 25.3-25.8 s here (1M: 8.0 s to 7.5-7.9 s)."""

SESSION_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.ansi.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    # PySpark records the Python call site of every column function it is given, four calls to
    # the JVM each: building one check's plans made 13,700 such calls, 1.5 s of a 1M history's 9 s.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # What the job keeps on disk (a big history's per-id rows) is written with Kryo: Java
    # serialisation of millions of rows cost more than computing them.
    "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
}
"""Set when the JVM starts (in process or ``spark-submit`` of the Connect server)."""

RUNTIME_CONF = ("spark.sql.ansi.enabled", "spark.sql.session.timeZone", "spark.sql.adaptive.enabled")
"""Of SESSION_CONF, those a Spark Connect session sets on itself: a shared server may have been
started with other defaults, and the results depend on these."""


def jvm_options(*, driver: bool) -> str:
    """The driver also gets the log configuration (Spark's chatter down to warnings)."""
    return f"-Dlog4j2.configurationFile=file:{log_config()} {JVM_OPTIONS}" if driver else JVM_OPTIONS


_LOG4J2 = """
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark %p %c{1}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
# Caching a big history spills to disk by design when the heap is small; not worth a warning per block.
logger.memstore.name = org.apache.spark.storage.memory.MemoryStore
logger.memstore.level = error
logger.blockmgr.name = org.apache.spark.storage.BlockManager
logger.blockmgr.level = error
# Spark says once per session that it shortened a plan's text (the per-id plans have many columns).
logger.strings.name = org.apache.spark.util.SparkStringUtils
logger.strings.level = error
# Releasing a kept (locally checkpointed) table at the end of a check is meant: no warning for it.
logger.rdd.name = org.apache.spark.rdd.MapPartitionsRDD
logger.rdd.level = error
# A real check cancels the warm-up's jobs (by their tag, brokerchaos-warm-up): meant, no warning per
# task killed; nor for the accumulators of those tasks, gone before their last update.
appender.console.filter.warmup.type = RegexFilter
appender.console.filter.warmup.regex = .*brokerchaos-warm-up.*
appender.console.filter.warmup.onMatch = DENY
appender.console.filter.warmup.onMismatch = NEUTRAL
logger.accum.name = org.apache.spark.util.AccumulatorContext
logger.accum.level = error
"""


def log_config() -> Path:
    """Spark's own chatter down to warnings, written where the JVM can read it."""
    path = Path(tempfile.gettempdir()) / "brokerchaos-spark-log4j2.properties"
    if not path.is_file() or path.read_text() != _LOG4J2:
        path.write_text(_LOG4J2)
    return path
