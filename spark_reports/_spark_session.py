"""One Spark session per process, started while a run's workload goes on.

The JVM's start (and its heap size) is paid once per process; every check of the
process, the warm-up included, uses the same session.
"""

from __future__ import annotations

import os
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from ._common import progress

DEFAULT_DRIVER_MEMORY = "1g"
JVM_OPTIONS = "-XX:-DontCompileHugeMethods -XX:+UseParallelGC"
"""HotSpot leaves a method of more than 8,000 bytes of bytecode to its interpreter (Spark's
PR #14370 says so of generated code), and the stage that ends the per-id aggregate and
derives each id's flags compiles to one such method: interpreted, it cost twice the
aggregate itself (a 10M-record history: 26.5 s of CPU against 14.8 s with the first flag).
The check is a batch job: the throughput collector, not the default low-pause G1, took a
10M-record history's check from 29.5 s to 25.3-25.8 s here (1M: 8.0 s to 7.5-7.9 s)."""

_session: Any = None
_session_key: tuple[str, str] | None = None
_session_lock = threading.Lock()


def check_master(master: str | None) -> None:
    """A master URL Spark can start with (None: the default), or a ValueError that says which
    it takes: a malformed one would otherwise end in the Java stack trace of spark-submit."""
    if master is None or master in ("local", "yarn") or master.startswith(("local[", "spark://", "k8s://")):
        return
    raise ValueError(
        f"Spark master {master!r}: give local[*], local[N], spark://HOST:PORT (a standalone "
        "cluster), yarn or k8s://HOST:PORT (--spark-master or BROKERCHAOS_SPARK_MASTER)"
    )


def spark_session(master: str | None = None, driver_memory: str | None = None) -> Any:
    """One session per process: JVM start-up is paid once for every run checked.

    The driver's heap is fixed when the JVM starts; asking for another size later in
    the same process keeps the first one (Spark cannot resize a running JVM). A caller
    that asks while a background start is under way waits for it.
    """
    with _session_lock:
        return _spark_session(master, driver_memory)


def _spark_session(master: str | None, driver_memory: str | None) -> Any:
    global _session, _session_key
    from pyspark.sql import SparkSession

    master = master or os.environ.get("BROKERCHAOS_SPARK_MASTER") or "local[*]"
    check_master(master)
    memory = driver_memory or os.environ.get("BROKERCHAOS_SPARK_DRIVER_MEMORY") or DEFAULT_DRIVER_MEMORY
    if _session is not None and _session_key is not None and _session_key[0] == master:
        return _session
    if _session is not None:
        _session.stop()
    progress("spark", "starting session", master=master, driver_memory=memory)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName("brokerchaos-reconcile")
        .config("spark.driver.memory", memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.ansi.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # PySpark records the Python call site of every column function it is given, four calls to
        # the JVM each: building one check's plans made 13,700 such calls, 1.5 s of a 1M history's 9 s.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        # What the job keeps on disk (a big history's per-id rows) is written with Kryo: Java
        # serialisation of millions of rows cost more than computing them.
        .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
        .config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{_log_config()} {JVM_OPTIONS}"
        )
        .config("spark.executor.extraJavaOptions", JVM_OPTIONS)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pyspark's pandas-version notice
        _session = builder.getOrCreate()
    _session.sparkContext.setLogLevel("WARN")
    _session_key = (master, memory)
    return _session


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
"""


def _log_config() -> Path:
    """Spark's own chatter down to warnings, written where the JVM can read it."""
    path = Path(tempfile.gettempdir()) / "brokerchaos-spark-log4j2.properties"
    if not path.is_file() or path.read_text() != _LOG4J2:
        path.write_text(_LOG4J2)
    return path


def stop_session() -> None:
    """Stop the shared session (tests and benchmarks that want a clean JVM)."""
    global _session, _session_key
    with _session_lock:
        if _session is not None:
            _session.stop()
        _session, _session_key = None, None
