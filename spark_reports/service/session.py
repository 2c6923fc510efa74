"""One Spark session per process, started while a run's workload goes on.

The JVM's start (and its heap size) is paid once per process; every check of the
process, the warm-up included, uses the same session. Where a Spark Connect server is
given (``sc://HOST:PORT``) or the local one is up (``brokerchaos spark start``), the
session is a thin client of it instead and no JVM starts here.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

from harness.spec.errors import ConfigError
from spark_reports.progress import progress
from spark_reports.service.conf import DEFAULT_DRIVER_MEMORY, RUNTIME_CONF, SESSION_CONF, jvm_options
from spark_reports.service.connect import DEFAULT_PORT, answers, local_url

REMOTE_ENV = "BROKERCHAOS_SPARK_REMOTE"
MASTER_ENV = "BROKERCHAOS_SPARK_MASTER"

_session: Any = None
_session_key: tuple[str, str] | None = None
_session_lock = threading.Lock()
_parallelism: dict[int, int] = {}

settings: dict[str, Any] = {}
"""What ``brokerchaos_configure`` said (``spark_master`` and ``spark_remote`` are the settings read here)."""


def target() -> str | None:
    """Where the command line said to check: a Spark Connect server (``--spark-remote``) before a
    master (``--spark-master``); None: ``where`` decides."""
    return settings.get("spark_remote") or settings.get("spark_master")


def check_master(master: str | None) -> None:
    """A master URL Spark can start with (None: the default), or a ValueError that says which
    it takes: a malformed one would otherwise end in the Java stack trace of spark-submit."""
    if master is None or master in ("local", "yarn") or master.startswith(("local[", "spark://", "k8s://")):
        return
    if master.startswith("sc://"):
        check_remote(master)
        return
    raise ValueError(
        f"Spark master {master!r}: give local[*], local[N], spark://HOST:PORT (a standalone "
        "cluster), yarn or k8s://HOST:PORT (--spark-master or BROKERCHAOS_SPARK_MASTER)"
    )


def check_remote(remote: str | None) -> None:
    """A Spark Connect address (None: none given), or a ValueError that says which it takes."""
    if remote is None:
        return
    host = remote.removeprefix("sc://").split("/", 1)[0].split(":", 1)[0]
    if not remote.startswith("sc://") or not host:
        raise ValueError(
            f"Spark Connect address {remote!r}: give sc://HOST:PORT (--spark-remote or {REMOTE_ENV})"
        )


REMOTE_CONNECT_TIMEOUT = 5.0
"""Seconds a Spark Connect server's port has to accept a connection: without the look, PySpark's
client retries an address nobody listens on for minutes before it says so."""


def _host_port(url: str) -> tuple[str, int]:
    """The host and port of ``sc://HOST[:PORT][/;params]`` (Spark Connect's default port without one)."""
    authority = url.removeprefix("sc://").split("/", 1)[0].split(";", 1)[0]
    host, _, port = authority.partition(":")
    return host, int(port) if port.isdigit() else DEFAULT_PORT


def check_answers(url: str) -> None:
    """A Spark Connect server's port accepts a connection, or a ``ConfigError`` that says what to do."""
    host, port = _host_port(url)
    if not answers(port, host, REMOTE_CONNECT_TIMEOUT):
        raise ConfigError(
            f"no Spark Connect server answers at {url}: start one with `brokerchaos spark start`, "
            f"or give another address (--spark-remote or {REMOTE_ENV})"
        )


def _remote_session(url: str) -> Any:
    """A Spark Connect client session. PySpark picks the implementation of its column functions
    by ``SPARK_CONNECT_MODE_ENABLED`` (what its own builder sets for a remote session)."""
    check_answers(url)
    progress("spark", "connecting", remote=url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pyspark's pandas-version notice
        from pyspark.sql.connect.session import SparkSession as RemoteSession

        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        session = RemoteSession.builder.remote(url).create()
    for key in RUNTIME_CONF:
        session.conf.set(key, SESSION_CONF[key])
    return session


def where(master: str | None = None) -> str:
    """Where checks run: ``master`` when given (an ``sc://`` address is a Spark Connect server),
    else ``$BROKERCHAOS_SPARK_REMOTE``, else ``$BROKERCHAOS_SPARK_MASTER``, else the local
    Spark Connect server while it is up (``brokerchaos spark start``), else ``local[*]`` in
    this process."""
    return master or os.environ.get(REMOTE_ENV) or os.environ.get(MASTER_ENV) or local_url() or "local[*]"


def is_remote(master: str) -> bool:
    return master.startswith("sc://")


def spark_session(master: str | None = None, driver_memory: str | None = None) -> Any:
    """One session per process: JVM start-up is paid once for every run checked.

    The driver's heap is fixed when the JVM starts; asking for another size later in
    the same process keeps the first one (Spark cannot resize a running JVM). A caller
    that asks while a background start is under way waits for it. A Spark Connect
    server's heap is the server's (``brokerchaos spark start --driver-memory``).
    """
    with _session_lock:
        return _spark_session(master, driver_memory)


def _spark_session(master: str | None, driver_memory: str | None) -> Any:
    global _session, _session_key

    master = where(master)
    check_master(master)
    memory = driver_memory or os.environ.get("BROKERCHAOS_SPARK_DRIVER_MEMORY") or DEFAULT_DRIVER_MEMORY
    if _session is not None and _session_key is not None and _session_key[0] == master:
        return _session
    if _session is not None:
        _session.stop()
        _session, _session_key = None, None
        _parallelism.clear()
    if is_remote(master):
        _session = _remote_session(master)
    else:
        _session = _local_session(master, memory)
    _session_key = (master, memory)
    return _session


def _local_session(master: str, memory: str) -> Any:
    from pyspark.sql import SparkSession

    # A Spark Connect session earlier in this process left PySpark in its remote mode.
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    progress("spark", "starting session", master=master, driver_memory=memory)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName("brokerchaos-reconcile")
        .config("spark.driver.memory", memory)
        .config("spark.driver.extraJavaOptions", jvm_options(driver=True))
        .config("spark.executor.extraJavaOptions", jvm_options(driver=False))
    )
    for key, value in SESSION_CONF.items():
        builder = builder.config(key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pyspark's pandas-version notice
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def default_parallelism(spark: Any) -> int:
    """How many tasks the session runs at once by default (``SparkContext.defaultParallelism``),
    read with a DataFrame so that it works over Spark Connect too (which has no SparkContext):
    a range given no partition count is split into that many partitions, each non-empty here."""
    key = id(spark)
    if key not in _parallelism:
        from pyspark.sql import functions as F

        ids = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p"))
        last = ids.agg(F.max("p")).first()[0]
        _parallelism[key] = int(last) + 1
    return _parallelism[key]


def stop_session() -> None:
    """Stop the shared session (tests and benchmarks that want a clean JVM). A Spark Connect
    session is closed; the server stays up."""
    global _session, _session_key
    with _session_lock:
        if _session is not None:
            _session.stop()
        _session, _session_key = None, None
        _parallelism.clear()
