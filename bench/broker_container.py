"""One broker node in one Docker container, reached straight on a published port.

Benchmarks connect to the broker itself, not through the node's Toxiproxy
sidecar as chaos runs do: a proxy in the path would be the bottleneck being
measured. The node's command, environment and files come from the broker
plugin, so the benchmark runs what a chaos run runs. CPU and memory come from
the container's cgroup (Docker's own accounting), read directly because
``container.stats()`` blocks for a second per sample.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cluster import PROJECT_LABEL, _tar_files, docker_client
from harness.docker_exec import exec_output
from harness.errors import ClusterError
from harness.spec.broker import BrokerPlugin, NodeInfo

BENCH_LABEL = "brokerchaos.bench"
CGROUP_V1 = Path("/sys/fs/cgroup")


def plugin_for(name: str) -> BrokerPlugin:
    """The shipped plugin called ``name`` (``reference`` or ``rabbitmq``)."""
    if name == "reference":
        from plugins.reference import ReferenceBroker

        return ReferenceBroker()
    if name == "rabbitmq":
        from plugins.rabbitmq import RabbitMQ

        return RabbitMQ()
    raise SystemExit(f"unknown broker {name!r}; use reference or rabbitmq")


@dataclass
class Usage:
    """Cumulative CPU seconds and current memory of a container at one instant."""

    t: float
    cpu_seconds: float
    rss_bytes: int
    usage_bytes: int


class BrokerContainer:
    """Start with ``with BrokerContainer(...) as b:``; the container and its volume are always removed."""

    def __init__(
        self,
        broker: str,
        *,
        settings: Mapping[str, Any] | None = None,
        image: str | None = None,
        config_extra: str = "",
    ) -> None:
        self.plugin = plugin_for(broker)
        self.name = broker
        self.settings = self.plugin.validate_settings(dict(settings or {}))
        self.image = image or f"{self.plugin.image().name}:latest"
        self.config_extra = config_extra
        self.tag = f"bench-{broker}-{uuid.uuid4().hex[:8]}"
        self.client = docker_client()
        self.container: Any = None
        self.port = 0
        self.host = "127.0.0.1"

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> BrokerContainer:
        try:
            self.start()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def start(self) -> None:
        import docker.errors

        node = NodeInfo(name="n1", index=1, peers=(), cluster=self.tag, settings=self.settings)
        spec = self.plugin.node_spec(node)
        files = dict(spec.files)
        if self.config_extra:
            # Extra TOML tables (e.g. flow-control tuning) appended to the node's own config file.
            path = next(p for p in files if p.endswith(".toml"))
            files[path] = files[path] + self.config_extra
        labels = {PROJECT_LABEL: "brokerchaos", BENCH_LABEL: self.tag}
        try:
            self.client.volumes.create(f"{self.tag}-data", labels=labels)
            self.container = self.client.containers.create(
                image=self.image,
                name=self.tag,
                hostname="n1",
                detach=True,
                labels=labels,
                command=["--data-dir", self.plugin.data_dir, "--", *spec.command],
                environment=dict(spec.env),
                volumes={f"{self.tag}-data": {"bind": self.plugin.data_dir, "mode": "rw"}},
                ports={f"{self.plugin.client_port}/tcp": ("127.0.0.1", None)},
            )
            if files:
                self.container.put_archive("/", _tar_files(files))
            self.container.start()
        except docker.errors.ImageNotFound:
            raise SystemExit(
                f"image {self.image} not found; build it with `brokerchaos images build`"
            ) from None
        except docker.errors.APIError as exc:
            raise SystemExit(f"Docker refused to start {self.image}: {exc.explanation or exc}") from None
        self.container.reload()
        self.port = int(
            self.container.attrs["NetworkSettings"]["Ports"][f"{self.plugin.client_port}/tcp"][0]["HostPort"]
        )
        self.wait_ready()

    def exec(self, cmd: list[str], timeout: float = 30.0) -> tuple[int, str]:
        code, out = exec_output(self.container, ["timeout", str(int(max(1, timeout))), *cmd])
        return code, out.decode(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.plugin.ready_timeout
        while True:
            self.container.reload()
            if self.container.status != "running":
                raise ClusterError(f"{self.name} exited: {self.logs()}")
            if self.plugin.is_ready(self):  # type: ignore[arg-type]
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{self.name} not ready after {self.plugin.ready_timeout:.0f}s: {self.logs()}"
                )
            time.sleep(0.5)

    def logs(self, lines: int = 15) -> str:
        try:
            return self.container.logs(tail=lines).decode(errors="replace")
        except Exception as exc:  # noqa: BLE001 - the container may be gone already
            return f"(no log: {exc})"

    def remove(self) -> None:
        import docker.errors

        for c in self.client.containers.list(all=True, filters={"label": f"{BENCH_LABEL}={self.tag}"}):
            try:
                c.remove(force=True, v=True)
            except docker.errors.NotFound:
                pass
        for v in self.client.volumes.list(filters={"label": f"{BENCH_LABEL}={self.tag}"}):
            try:
                v.remove(force=True)
            except docker.errors.NotFound:
                pass

    # -- facts and accounting ---------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"

    def image_facts(self) -> dict[str, str]:
        img = self.client.images.get(self.image)
        return {"image": self.image, "image_id": img.id[:19], "created": img.attrs.get("Created", "")[:19]}

    def version(self) -> str:
        """The broker's own version string, as its package or source reports it."""
        if self.name == "rabbitmq":
            rc, out = self.exec(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"])
            return f"rabbitmq-server {out.strip()}" if rc == 0 else "rabbitmq-server (unknown)"
        rc, out = self.exec(["python3", "-c", "import sys; print(sys.version.split()[0])"])
        return f"broker_impl on Python {out.strip()}" if rc == 0 else "broker_impl"

    def sample(
        self,
        t_from: float,
        t_stop: float,
        finished: Callable[[], bool] = lambda: False,
        every: float = 0.25,
        stop_if: Callable[[Usage], bool] | None = None,
    ) -> list[Usage]:
        """Usage every ``every`` seconds from ``t_from`` to ``t_stop`` (monotonic clock), or until
        the load has ``finished`` or ``stop_if`` says enough."""
        samples = []
        time.sleep(max(0.0, t_from - time.monotonic()))
        while True:
            samples.append(self.usage())
            if time.monotonic() >= t_stop or finished() or (stop_if is not None and stop_if(samples[-1])):
                return samples
            time.sleep(min(every, max(0.0, t_stop - time.monotonic())))

    def usage(self) -> Usage:
        """CPU and memory from the cgroup v1 files Docker's cgroupfs driver creates, else the stats API."""
        cid = self.container.id
        cpu = CGROUP_V1 / "cpuacct" / "docker" / cid / "cpuacct.usage"
        mem = CGROUP_V1 / "memory" / "docker" / cid
        if cpu.exists() and mem.exists():
            stat: dict[str, str] = {}
            for line in (mem / "memory.stat").read_text().splitlines():
                key, _, val = line.partition(" ")
                stat[key] = val
            return Usage(
                time.monotonic(),
                int(cpu.read_text()) / 1e9,
                int(stat.get("total_rss", stat["rss"])),
                int((mem / "memory.usage_in_bytes").read_text()),
            )
        s = self.container.stats(stream=False)
        ms = s.get("memory_stats", {})
        st = ms.get("stats", {})
        rss = st.get("total_rss", st.get("anon", ms.get("usage", 0)))
        return Usage(
            time.monotonic(),
            s["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9,
            int(rss),
            int(ms.get("usage", 0)),
        )
