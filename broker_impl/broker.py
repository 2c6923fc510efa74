"""The node: vhosts, users, permissions, policies, alarms, and the metadata store.

Metadata (durable exchanges, queues and bindings, users, vhosts, permissions,
policies) lives in ``<data_dir>/metadata.json``, rewritten whole on every
change: write a temporary file, fsync it, rename it over the old one, fsync the
directory. A crash therefore leaves either the old or the new file, never a
torn one. Message contents are the store's business (``broker_impl.store``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import secrets
import shutil
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar

from broker_impl.backing import Store, make_backing_queue, open_store, store_queue_key
from broker_impl.backing_queue import BackingQueue
from broker_impl.client import Client
from broker_impl.codec import ACCESS_REFUSED, ChannelError
from broker_impl.config import Config, ConfigError, Permission, User
from broker_impl.errors import BrokerError
from broker_impl.exchange import destination_exchange
from broker_impl.flow import CreditSpec
from broker_impl.queue import Queue
from broker_impl.schedule import Scheduler
from broker_impl.store.durable import write_file
from broker_impl.vhost import VHost

if TYPE_CHECKING:
    from broker_impl.cluster.node import ClusterNode
    from broker_impl.replication import Replication

log = logging.getLogger("broker_impl.broker")

METADATA_FILE = "metadata.json"
METADATA_VERSION = 1


def hash_password(password: str, salt: str | None = None) -> str:
    salt = salt or secrets.token_hex(8)
    digest = hashlib.sha256((salt + password).encode()).hexdigest()
    return f"sha256${salt}${digest}"


def check_password(stored: str, password: str) -> bool:
    try:
        _alg, salt, _digest = stored.split("$", 2)
    except ValueError:
        return False
    return secrets.compare_digest(hash_password(password, salt), stored)


_T = TypeVar("_T")


def _parsed(parse: Callable[[], _T]) -> _T:
    """What ``parse`` makes of a config table; a mistake in the table ends the start in one line."""
    try:
        return parse()
    except ConfigError as exc:
        raise BrokerError(f"config error: {exc}") from None


class Broker:
    """Everything one node knows; connections and the control socket act through it."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.data_dir = config.data_dir
        self.vhosts: dict[str, VHost] = {}
        self.users: dict[str, dict[str, Any]] = {}  # name -> {password_hash, tags}
        self.permissions: dict[tuple[str, str], Permission] = {}
        self.policies: dict[tuple[str, str], dict[str, Any]] = {}  # (vhost, name) -> policy
        self.connections: set[Client] = set()
        self.alarms: set[str] = set()  # "memory", "disk"
        self.store: Store | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        f = config.flow
        self.flow_enabled = f.enabled
        self.link_spec = CreditSpec(f.initial, f.more_after)
        self.store_spec = CreditSpec(f.store_initial, f.store_more_after)
        self._loading = False
        self.cluster: ClusterNode | None = None
        self.replication: Replication | None = None  # master-slave mode (broker_impl.replication)
        self.scheduler = Scheduler(self)
        # The server's: close (False) or reopen (True) the AMQP listener; pause_minority uses it.
        self.listener_hook: Callable[[bool], None] | None = None

    # -- startup / shutdown ------------------------------------------------------------
    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._make_replication()
        self.store = await open_store(self.data_dir / "store", self.config.store)
        if self.replication is not None:
            await self.replication.attach(self.store)
        path = self.data_dir / METADATA_FILE
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise BrokerError(
                    f"{path}: metadata file is not valid JSON ({exc}); restore it or move it away"
                ) from None
            self._make_cluster()
            await self._load(data)
        else:
            self._make_cluster()
            self._seed_from_config()
            self.metadata_changed()
        if self.cluster is not None:
            await self.cluster.start()
        self.scheduler.start()  # after the queues and the cluster: recovered due messages route at once

    def peer_losses(self) -> int:
        """How many times this node saw a cluster peer go down (0 without a cluster)."""
        return self.cluster.peer_losses if self.cluster is not None else 0

    def client_refusal(self) -> str | None:
        """Why this node turns new client connections away now (None: it serves them)."""
        return self.cluster.client_refusal() if self.cluster is not None else None

    def _make_replication(self) -> None:
        from broker_impl.replication import Replication, ReplicationConfig

        cfg = _parsed(lambda: ReplicationConfig.from_table(self.config.replication, self.config.name))
        if cfg is not None and self.config.cluster.get("peers"):
            raise BrokerError(
                "config error: [cluster] peers and [replication] are two replication modes; "
                "give a node one of them"
            )
        if cfg is not None:
            self.replication = Replication(self, cfg)

    def confirms_held(self) -> bool:
        """Whether publisher confirms wait now: a cluster node under pause_minority that lost a peer and has
        not heard from a majority since (``broker_impl.cluster.partitions``)."""
        return self.cluster is not None and self.cluster.confirms_held()

    def publish_refusal(self) -> str | None:
        """Why this node takes no publishes now (None: it does); a slave is read-only."""
        return self.replication.publish_refusal() if self.replication is not None else None

    def _make_cluster(self) -> None:
        """Before queues load, so recovered queues stream to mirrors too (``broker_impl.cluster.node``)."""
        from broker_impl.cluster.config import ClusterConfig
        from broker_impl.cluster.node import ClusterNode

        cfg = _parsed(lambda: ClusterConfig.from_table(self.config.cluster, self.config.name))
        if cfg is not None:
            self.cluster = ClusterNode(self, cfg)

    def _seed_from_config(self) -> None:
        for v in self.config.vhosts:
            self.vhosts[v] = VHost(self, v)
        for u in self.config.users:
            self.users[u.name] = {"password_hash": hash_password(u.password), "tags": list(u.tags)}
        for p in self.config.permissions:
            if p.user in self.users and p.vhost in self.vhosts:
                self.permissions[(p.user, p.vhost)] = p

    async def _load(self, data: dict[str, Any]) -> None:
        """Re-declare durable entities; durable queues reattach to what the store recovered."""
        self._loading = True
        try:
            for name, u in data.get("users", {}).items():
                self.users[name] = {"password_hash": u["password_hash"], "tags": list(u.get("tags", []))}
            for p in data.get("permissions", []):
                self.permissions[(p["user"], p["vhost"])] = Permission(**p)
            for p in data.get("policies", []):
                self.policies[(p["vhost"], p["name"])] = p
            for vname, vd in data.get("vhosts", {}).items():
                vh = VHost(self, vname)
                self.vhosts[vname] = vh
                for ex in vd.get("exchanges", []):
                    vh.declare_exchange(
                        ex["name"],
                        ex["type"],
                        durable=True,
                        auto_delete=ex.get("auto_delete", False),
                        internal=ex.get("internal", False),
                        arguments=ex.get("arguments", {}),
                    )
                for q in vd.get("queues", []):
                    await vh.declare_queue(
                        q["name"],
                        owner=None,
                        durable=True,
                        auto_delete=q.get("auto_delete", False),
                        arguments=q.get("arguments", {}),
                    )
                for b in vd.get("bindings", []):
                    if b["source"] not in vh.exchanges:
                        continue
                    to_exchange = destination_exchange(b["destination"])
                    if to_exchange is not None and to_exchange in vh.exchanges:
                        vh.bind_exchange(to_exchange, b["source"], b["routing_key"], b.get("arguments", {}))
                    queue = vh.queues.get(b["destination"])
                    if queue is not None:
                        vh.bind(queue, b["source"], b["routing_key"], b.get("arguments", {}))
        finally:
            self._loading = False
        recovered = sum(q.message_count() for vh in self.vhosts.values() for q in vh.queues.values())
        log.info(
            "recovered %d vhost(s), %d durable queue(s), %d message(s)",
            len(self.vhosts),
            sum(len(v.queues) for v in self.vhosts.values()),
            recovered,
        )

    async def stop(self) -> None:
        await self.scheduler.stop()
        if self.cluster is not None:
            await self.cluster.stop()
        if self.replication is not None:
            await self.replication.stop()
        for vh in self.vhosts.values():
            for q in list(vh.queues.values()):
                try:
                    if q.durable:
                        await q.close()
                    else:
                        await q.delete()
                except Exception:
                    log.exception("closing queue %r", q.name)
        for t in list(self._tasks):
            t.cancel()
        if self.store is not None:
            await self.store.close()
            self.store = None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed: %r", task.exception())

    # -- queues ---------------------------------------------------------------------------
    async def open_backing(self, vhost: str, name: str, durable: bool) -> BackingQueue:
        bq = make_backing_queue(
            store_queue_key(vhost, name), durable, self.store, ram_budget_bytes=self.ram_budget()
        )
        return self.cluster.wrap_backing(vhost, name, bq) if self.cluster is not None else bq

    def ram_budget(self) -> int:
        return self.config.flow.queue_ram_bytes

    def make_queue(self, vhost: VHost, name: str, bq: BackingQueue, **kwargs: Any) -> Queue:
        return Queue(
            vhost,
            name,
            bq,
            flow_enabled=self.flow_enabled,
            link_spec=self.link_spec,
            store_spec=self.store_spec,
            **kwargs,
        )

    def all_queues(self) -> list[Queue]:
        return [q for vh in self.vhosts.values() for q in vh.queues.values()]

    # -- auth ------------------------------------------------------------------------------
    def authenticate(self, username: str, password: str) -> bool:
        u = self.users.get(username)
        return u is not None and check_password(u["password_hash"], password)

    def can_access_vhost(self, user: str, vhost: str) -> bool:
        return (user, vhost) in self.permissions

    def check_permission(self, user: str, vhost: str, kind: str, resource: str, what: str = "queue") -> None:
        """RabbitMQ semantics: the regex must match the whole name; '' matches nothing; the default exchange is amq.default."""
        perm = self.permissions.get((user, vhost))
        regex = getattr(perm, kind) if perm is not None else ""
        name = resource if resource or what != "exchange" else "amq.default"
        if regex and re.fullmatch(regex, name) is not None:
            return
        raise ChannelError(
            ACCESS_REFUSED, f"access to {what} '{name}' in vhost '{vhost}' refused for user '{user}'"
        )

    # -- operator commands -----------------------------------------------------------------
    def add_user(self, name: str, password: str, tags: list[str] | None = None) -> None:
        if name in self.users:
            raise BrokerError(f"user '{name}' already exists")
        self.users[name] = {"password_hash": hash_password(password), "tags": list(tags or [])}
        self.metadata_changed()

    def delete_user(self, name: str) -> None:
        if self.users.pop(name, None) is None:
            raise BrokerError(f"no such user '{name}'")
        for key in [k for k in self.permissions if k[0] == name]:
            del self.permissions[key]
        self.metadata_changed()

    def change_password(self, name: str, password: str) -> None:
        if name not in self.users:
            raise BrokerError(f"no such user '{name}'")
        self.users[name]["password_hash"] = hash_password(password)
        self.metadata_changed()

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        if user not in self.users:
            raise BrokerError(f"no such user '{user}'")
        if vhost not in self.vhosts:
            raise BrokerError(f"no such vhost '{vhost}'")
        for kind, rx in (("configure", configure), ("write", write), ("read", read)):
            try:
                re.compile(rx)
            except re.error as exc:
                raise BrokerError(
                    f"{kind} permission {rx!r} is not a valid regular expression ({exc})"
                ) from None
        self.permissions[(user, vhost)] = Permission(user, vhost, configure, write, read)
        self.metadata_changed()

    def add_vhost(self, name: str) -> None:
        if name in self.vhosts:
            raise BrokerError(f"vhost '{name}' already exists")
        self.vhosts[name] = VHost(self, name)
        self.metadata_changed()

    def set_policy(
        self,
        vhost: str,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "queues",
    ) -> None:
        if vhost not in self.vhosts:
            raise BrokerError(f"no such vhost '{vhost}'")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise BrokerError(f"pattern {pattern!r} is not a valid regular expression ({exc})") from None
        if not isinstance(definition, dict) or not definition:
            raise BrokerError("policy definition must be a non-empty JSON object")
        if apply_to not in ("queues", "exchanges", "all"):
            raise BrokerError(f"apply-to {apply_to!r} not allowed; allowed queues, exchanges, all")
        self.policies[(vhost, name)] = {
            "vhost": vhost,
            "name": name,
            "pattern": pattern,
            "definition": definition,
            "priority": priority,
            "apply-to": apply_to,
        }
        for q in self.vhosts[vhost].queues.values():
            self.apply_policies(q)
        self.metadata_changed()

    def clear_policy(self, vhost: str, name: str) -> None:
        if self.policies.pop((vhost, name), None) is None:
            raise BrokerError(f"no policy '{name}' in vhost '{vhost}'")
        if vhost in self.vhosts:
            for q in self.vhosts[vhost].queues.values():
                self.apply_policies(q)
        self.metadata_changed()

    def effective_policy(self, vhost: str, queue: str, apply_to: str = "queues") -> dict[str, Any] | None:
        """Highest priority wins; ties go to the later name, as RabbitMQ's sort does (``apply_to``: queues or exchanges)."""
        best = None
        for p in self.policies.values():
            if p["vhost"] != vhost or p["apply-to"] not in (apply_to, "all"):
                continue
            if re.search(p["pattern"], queue) is None:
                continue
            if best is None or (p["priority"], p["name"]) > (best["priority"], best["name"]):
                best = p
        return best

    def apply_policies(self, q: Queue) -> None:
        p = self.effective_policy(q.vhost.name, q.name)
        q.policy = dict(p["definition"]) if p else None
        q.policy_name = p["name"] if p else None

    # -- alarms ------------------------------------------------------------------------------
    def set_alarm(self, resource: str, on: bool) -> None:
        if on == (resource in self.alarms):
            return
        if on:
            self.alarms.add(resource)
            log.warning("%s resource alarm set", resource)
        else:
            self.alarms.discard(resource)
            log.warning("%s resource alarm cleared", resource)
        for c in list(self.connections):
            c.alarms_changed()

    # -- metadata --------------------------------------------------------------------------------
    def metadata_changed(self, persist: bool = True) -> None:
        """Durable changes rewrite the file; every change is offered to the cluster."""
        if self._loading:
            return
        if persist:
            write_file(
                self.data_dir / METADATA_FILE,
                json.dumps(self.metadata(), indent=1, default=str).encode(),
                mode=0o600,  # password hashes
            )
        if self.cluster is not None:
            self.cluster.local_changed()
        if self.replication is not None:
            self.replication.metadata_changed()

    def metadata(self) -> dict[str, Any]:
        vhosts: dict[str, Any] = {}
        for vname, vh in self.vhosts.items():
            # exclusive queues die with their connection, so a restart never brings them back
            durable_q = {q.name for q in vh.queues.values() if q.durable and q.exclusive_owner is None}
            vhosts[vname] = {
                "exchanges": [
                    ex.to_json()
                    for ex in vh.exchanges.values()
                    if ex.durable and ex.name != "" and not ex.name.startswith("amq.")
                ],
                "queues": [
                    {"name": q.name, "auto_delete": q.auto_delete, "arguments": q.arguments}
                    for q in vh.queues.values()
                    if q.name in durable_q
                ],
                "bindings": [
                    asdict(b)
                    for b in vh.bindings()
                    if vh.exchanges[b.source].durable
                    and (
                        b.destination in durable_q
                        or _durable_exchange(vh, destination_exchange(b.destination))
                    )
                ],
            }
        return {
            "version": METADATA_VERSION,
            "users": self.users,
            "permissions": [asdict(p) for p in self.permissions.values()],
            "policies": list(self.policies.values()),
            "vhosts": vhosts,
        }

    def disk_free(self) -> int:
        return shutil.disk_usage(self.data_dir).free


def _durable_exchange(vh: VHost, name: str | None) -> bool:
    ex = vh.exchanges.get(name) if name is not None else None
    return ex is not None and ex.durable


__all__ = ["Broker", "BrokerError", "User"]
