"""Node configuration, read from one TOML file.

Every key, its type and default (RabbitMQ's defaults unless noted)::

    vhosts = ["/"]                # top-level key (before any table); default ["/"]

    [node]
    name = "rabbit@localhost"     # node name shown to operators and clients
    host = "127.0.0.1"            # listen address
    port = 5672                   # AMQP listen port (0 = pick a free port)
    data_dir = "./data"           # metadata.json, the store, control socket
    log_file = ""                 # default: <data_dir>/../logs/<name>.log
    log_level = "info"            # debug | info | warning | error
    control_port = 0              # admin CLI: 0 = Unix socket <data_dir>/ctl.sock,
                                  # otherwise a loopback TCP port

    [limits]
    frame_max = 131072            # largest frame offered in connection.tune
    channel_max = 2047            # highest channel number offered in tune
    heartbeat = 60                # seconds offered in tune (0 = off)
    max_message_size = 134217728  # larger publishes fail with 406 on their channel

    [flow]
    enabled = true                # false: no credit flow and alarms never block publishers
                                  # (alarms are still raised and logged); for benchmarks
    initial = 400                 # credit a sender starts with, per link
    more_after = 200              # receiver grants this much after this many
    store_initial = 4000          # the queue -> store link
    store_more_after = 800
    memory_high_watermark = 0.4   # fraction of RAM (< 1) or absolute bytes (>= 1)
    memory_source = "rss"         # rss | queues (sum of backing queues' ram_bytes)
    queue_ram_bytes = 67108864    # per-queue RAM for bodies before paging to disk
    disk_free_limit = 50000000    # bytes free on data_dir's filesystem
    check_interval_ms = 500       # how often alarms are evaluated

    [[users]]                     # default: guest/guest, tag administrator
    name = "guest"
    password = "guest"
    tags = ["administrator"]

    [[permissions]]               # default: guest gets ".*" everywhere on "/"
    user = "guest"
    vhost = "/"
    configure = ".*"
    write = ".*"
    read = ".*"

    [store]                       # passed untouched to broker_impl.store
    flush = "sync"                # e.g. sync | async, flush_interval_ms, segment_bytes

    [cluster]                     # clustering: keys in broker_impl/cluster/config.py (none: runs alone)

    [replication]                 # master-slave: keys in broker_impl/replication/config.py
                                  # (a node has [cluster] peers or [replication], not both)

Users, vhosts and permissions from the file seed the metadata store on first
boot; afterwards ``broker_impl.ctl`` changes are what count (as with
RabbitMQ's definitions import).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(Exception):
    """A configuration value is missing or out of range; the message names the key."""


@dataclass(slots=True)
class User:
    name: str
    password: str
    tags: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Permission:
    user: str
    vhost: str
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"


@dataclass(slots=True)
class FlowConfig:
    enabled: bool = True
    initial: int = 400
    more_after: int = 200
    store_initial: int = 4000
    store_more_after: int = 800
    memory_high_watermark: float = 0.4
    memory_source: str = "rss"
    queue_ram_bytes: int = 64 * 1024 * 1024
    disk_free_limit: int = 50_000_000
    check_interval_ms: int = 500


@dataclass(slots=True)
class Config:
    name: str = "rabbit@localhost"
    host: str = "127.0.0.1"
    port: int = 5672
    data_dir: Path = Path("./data")
    log_file: Path | None = None
    log_level: str = "info"
    control_port: int = 0
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat: int = 60
    max_message_size: int = 128 * 1024 * 1024
    flow: FlowConfig = field(default_factory=FlowConfig)
    users: list[User] = field(default_factory=lambda: [User("guest", "guest", ["administrator"])])
    vhosts: list[str] = field(default_factory=lambda: ["/"])
    permissions: list[Permission] = field(default_factory=lambda: [Permission("guest", "/")])
    store: dict[str, Any] = field(default_factory=dict)
    cluster: dict[str, Any] = field(default_factory=dict)
    replication: dict[str, Any] = field(default_factory=dict)

    @property
    def resolved_log_file(self) -> Path:
        if self.log_file is not None:
            return self.log_file
        return self.data_dir.resolve().parent / "logs" / f"{self.name.replace('@', '_')}.log"


_LOG_LEVELS = ("debug", "info", "warning", "error")
_MEMORY_SOURCES = ("rss", "queues")


def _get(table: dict[str, Any], key: str, path: str, kind: type | tuple[type, ...], default: Any) -> Any:
    if key not in table:
        return default
    value = table[key]
    # bool is an int in Python; a TOML true where a number belongs is still wrong.
    if isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"{path}.{key}: expected {_kind_name(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(f"{path}.{key}: expected {_kind_name(kind)}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


def _int_range(value: int, key: str, lo: int, hi: int) -> int:
    if not lo <= value <= hi:
        raise ConfigError(f"{key}: {value} is out of range; allowed {lo}..{hi}")
    return value


_KNOWN_TOP = {"node", "limits", "flow", "users", "vhosts", "permissions", "store", "cluster", "replication"}


def parse(data: dict[str, Any], base_dir: Path | None = None) -> Config:
    """Build a Config from a parsed TOML document; relative paths resolve against base_dir."""
    unknown = set(data) - _KNOWN_TOP
    if unknown:
        raise ConfigError(
            f"{sorted(unknown)[0]}: unknown top-level key; allowed {', '.join(sorted(_KNOWN_TOP))}"
        )
    base_dir = base_dir or Path.cwd()
    cfg = Config()
    _parse_node(cfg, _get(data, "node", "", dict, {}), base_dir)
    _parse_limits(cfg, _get(data, "limits", "", dict, {}))
    _parse_flow(cfg.flow, _get(data, "flow", "", dict, {}))
    _parse_access(cfg, data)
    cfg.store = dict(_get(data, "store", "", dict, {}))
    cfg.cluster = dict(_get(data, "cluster", "", dict, {}))
    cfg.replication = dict(_get(data, "replication", "", dict, {}))
    return cfg


def _parse_node(cfg: Config, node: dict[str, Any], base_dir: Path) -> None:
    """The ``[node]`` table: name, addresses, data directory and logging."""
    cfg.name = _get(node, "name", "node", str, cfg.name)
    cfg.host = _get(node, "host", "node", str, cfg.host)
    cfg.port = _int_range(_get(node, "port", "node", int, cfg.port), "node.port", 0, 65535)
    cfg.data_dir = base_dir / _get(node, "data_dir", "node", str, str(cfg.data_dir))
    log_file = _get(node, "log_file", "node", str, "")
    cfg.log_file = base_dir / log_file if log_file else None
    cfg.log_level = _get(node, "log_level", "node", str, cfg.log_level)
    if cfg.log_level not in _LOG_LEVELS:
        raise ConfigError(f"node.log_level: {cfg.log_level!r} not allowed; allowed {', '.join(_LOG_LEVELS)}")
    cfg.control_port = _int_range(_get(node, "control_port", "node", int, 0), "node.control_port", 0, 65535)


def _parse_limits(cfg: Config, limits: dict[str, Any]) -> None:
    """The ``[limits]`` table: frame, channel, message size and heartbeat bounds."""
    cfg.frame_max = _int_range(
        _get(limits, "frame_max", "limits", int, cfg.frame_max), "limits.frame_max", 4096, 2**31 - 1
    )
    cfg.channel_max = _int_range(
        _get(limits, "channel_max", "limits", int, cfg.channel_max), "limits.channel_max", 1, 65535
    )
    cfg.max_message_size = _int_range(
        _get(limits, "max_message_size", "limits", int, cfg.max_message_size),
        "limits.max_message_size",
        1,
        2**31 - 1,
    )
    cfg.heartbeat = _int_range(
        _get(limits, "heartbeat", "limits", int, cfg.heartbeat), "limits.heartbeat", 0, 65535
    )


def _parse_flow(f: FlowConfig, flow: dict[str, Any]) -> None:
    """The ``[flow]`` table: credit flow and the memory and disk alarms."""
    f.enabled = _get(flow, "enabled", "flow", bool, f.enabled)
    f.initial = _get(flow, "initial", "flow", int, f.initial)
    f.more_after = _get(flow, "more_after", "flow", int, f.more_after)
    f.store_initial = _get(flow, "store_initial", "flow", int, f.store_initial)
    f.store_more_after = _get(flow, "store_more_after", "flow", int, f.store_more_after)
    for ini, more, prefix in (
        ("initial", "more_after", "flow."),
        ("store_initial", "store_more_after", "flow."),
    ):
        i, m = getattr(f, ini), getattr(f, more)
        if i < 1:
            raise ConfigError(f"{prefix}{ini}: {i} is out of range; allowed >= 1")
        if not 0 <= m <= i:
            raise ConfigError(f"{prefix}{more}: {m} is out of range; allowed 0 <= {more} <= {ini} ({i})")
    wm = _get(flow, "memory_high_watermark", "flow", (int, float), f.memory_high_watermark)
    if wm <= 0:
        raise ConfigError(
            f"flow.memory_high_watermark: {wm} is out of range; allowed a fraction in (0, 1) or bytes >= 1"
        )
    f.memory_high_watermark = float(wm)
    f.memory_source = _get(flow, "memory_source", "flow", str, f.memory_source)
    if f.memory_source not in _MEMORY_SOURCES:
        raise ConfigError(
            f"flow.memory_source: {f.memory_source!r} not allowed; allowed {', '.join(_MEMORY_SOURCES)}"
        )
    f.queue_ram_bytes = _get(flow, "queue_ram_bytes", "flow", int, f.queue_ram_bytes)
    if f.queue_ram_bytes < 0:
        raise ConfigError(f"flow.queue_ram_bytes: {f.queue_ram_bytes} is out of range; allowed >= 0")
    f.disk_free_limit = _get(flow, "disk_free_limit", "flow", int, f.disk_free_limit)
    if f.disk_free_limit < 0:
        raise ConfigError(f"flow.disk_free_limit: {f.disk_free_limit} is out of range; allowed >= 0")
    f.check_interval_ms = _int_range(
        _get(flow, "check_interval_ms", "flow", int, f.check_interval_ms),
        "flow.check_interval_ms",
        10,
        600_000,
    )


def _parse_access(cfg: Config, data: dict[str, Any]) -> None:
    """The ``[[users]]``, ``vhosts`` and ``[[permissions]]`` entries, where the document has them."""
    if "users" in data:
        users = _get(data, "users", "", list, [])
        cfg.users = []
        for i, u in enumerate(users):
            if not isinstance(u, dict):
                raise ConfigError(f"users[{i}]: expected a table with name, password, tags")
            name = _get(u, "name", f"users[{i}]", str, None)
            password = _get(u, "password", f"users[{i}]", str, None)
            if name is None or password is None:
                raise ConfigError(f"users[{i}]: name and password are required")
            tags = _get(u, "tags", f"users[{i}]", list, [])
            cfg.users.append(User(name, password, [str(t) for t in tags]))
    if "vhosts" in data:
        vhosts = _get(data, "vhosts", "", list, ["/"])
        if not all(isinstance(v, str) and v for v in vhosts):
            raise ConfigError("vhosts: expected a list of non-empty strings")
        cfg.vhosts = list(vhosts)
    if "permissions" in data:
        perms = _get(data, "permissions", "", list, [])
        cfg.permissions = []
        for i, p in enumerate(perms):
            if not isinstance(p, dict) or "user" not in p or "vhost" not in p:
                raise ConfigError(
                    f"permissions[{i}]: expected a table with user, vhost, configure, write, read"
                )
            perm = Permission(
                _get(p, "user", f"permissions[{i}]", str, ""),
                _get(p, "vhost", f"permissions[{i}]", str, "/"),
                _get(p, "configure", f"permissions[{i}]", str, ".*"),
                _get(p, "write", f"permissions[{i}]", str, ".*"),
                _get(p, "read", f"permissions[{i}]", str, ".*"),
            )
            _check_regexes(perm, f"permissions[{i}]")
            cfg.permissions.append(perm)


def _check_regexes(perm: Permission, where: str) -> None:
    import re

    for kind in ("configure", "write", "read"):
        try:
            re.compile(getattr(perm, kind))
        except re.error as exc:
            raise ConfigError(f"{where}.{kind}: not a valid regular expression ({exc})") from None


def load(path: str | Path) -> Config:
    """Read and validate a TOML file; every problem becomes a one-line ConfigError."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config file ({exc.strerror})") from None
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc})") from None
    return parse(data, p.resolve().parent)
