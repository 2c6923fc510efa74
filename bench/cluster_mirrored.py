"""A 3-node mirrored queue (ha-mode all): the reference broker against RabbitMQ 3.10, same run.

    python -m bench.cluster_mirrored [--duration 15] [--repeats 1]

Each broker runs as a 3-node cluster started the way a chaos run starts one (the
project's images, Toxiproxy between the nodes, ``form_cluster`` setting the
``ha-mode: all, ha-sync-mode: automatic`` policy), one broker at a time. The queue
is declared on n1 (its master); publishers (persistent messages, publisher
confirms, a window of unconfirmed messages each) and one consumer connect to n2,
so every message crosses the cluster links as in the chaos workload. Reported:
confirmed publishes per second, confirm latency p50/p99 and the brokers' CPU per
confirmed message (the CPU time of the three broker containers over the
measurement window, from their cgroups, divided by the messages confirmed in
it), the ratios reference / RabbitMQ, and how busy the whole (shared) machine
was in each window. Results: bench/results/cluster_mirrored.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.amqp_load import Load, declare, run_load
from bench.facts import command_line, facts_markdown, machine_facts

OUT = Path(__file__).resolve().parent / "results" / "cluster_mirrored"
QUEUE = "bench-mirrored"
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpuacct/docker")
CGROUP_V2 = Path("/sys/fs/cgroup")


def container_cpu_seconds(container: Any) -> float:
    """CPU time a container used so far: cgroup v1 ``cpuacct.usage``, v2 ``cpu.stat``, else the stats API."""
    cid = container.id
    v1 = CGROUP_V1_CPU / cid / "cpuacct.usage"
    if v1.exists():
        return int(v1.read_text()) / 1e9
    for v2 in (
        CGROUP_V2 / "system.slice" / f"docker-{cid}.scope" / "cpu.stat",
        CGROUP_V2 / "docker" / cid / "cpu.stat",
    ):
        if v2.exists():
            stat = dict(line.split() for line in v2.read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
    return int(container.stats(stream=False)["cpu_stats"]["cpu_usage"]["total_usage"]) / 1e9


def host_cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        vals = [int(x) for x in fh.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals) - idle, sum(vals)


class WindowCpu:
    """CPU of the broker containers and of the machine between two instants (monotonic clock)."""

    def __init__(self, containers: list[Any], t_from: float, t_to: float) -> None:
        self.containers = containers
        self.samples: list[tuple[float, float, tuple[int, int]]] = []
        self._thread = threading.Thread(target=self._run, args=(t_from, t_to), daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        self.samples.append(
            (time.monotonic(), sum(container_cpu_seconds(c) for c in self.containers), host_cpu_ticks())
        )

    def _run(self, t_from: float, t_to: float) -> None:
        time.sleep(max(0.0, t_from - time.monotonic()))
        self._sample()
        time.sleep(max(0.0, t_to - time.monotonic()))
        self._sample()

    def result(self) -> tuple[float, float]:
        """(broker CPU cores used, fraction of the machine's CPU busy) over the window."""
        self._thread.join()
        (t0, c0, (b0, a0)), (t1, c1, (b1, a1)) = self.samples
        return (c1 - c0) / (t1 - t0), (b1 - b0) / max(1, a1 - a0)


def _scenario(broker: str) -> Any:
    from harness.scenario import from_dict

    settings: dict[str, Any] = {"ha_mode": "all", "ha_sync_mode": "automatic", "policy_pattern": "^bench"}
    if broker == "rabbitmq":
        settings["partition_handling"] = "ignore"
    return from_dict(
        {
            "name": f"bench-cluster-{broker}",
            "broker": {"plugin": broker, "nodes": 3, "settings": settings},
            "workload": {"duration": 1},
        }
    )


def measure(broker: str, args: argparse.Namespace) -> dict[str, Any]:
    from harness.host import Host
    from harness.runner import running_cluster

    host = Host.load()
    runs: list[dict[str, Any]] = []
    with running_cluster(host, _scenario(broker)) as cluster:
        ends = cluster.client_endpoints()
        user, password = cluster.plugin.username, cluster.plugin.password
        url = {n: f"amqp://{user}:{password}@{h}:{p}/" for n, (h, p) in ends.items()}
        for _ in range(args.repeats):
            asyncio.run(declare(url["n1"], QUEUE, durable=True))
            time.sleep(2)  # mirrors start and sync (empty queue) on the next tick
            load = Load(
                url=url["n2"],
                queue=QUEUE,
                persistent=True,
                size=args.size,
                publishers=args.publishers,
                consumers=1,
                in_flight=args.in_flight,
                warmup=WARMUP,
                duration=args.duration,
            )
            # the middle of the measurement window: the clients' processes start within the first second
            start = time.monotonic() + WARMUP + 1.0
            cpu = WindowCpu([n.container for n in cluster.nodes.values()], start, start + args.duration - 2.0)
            result, _ = run_load(load)
            cores, machine_busy = cpu.result()
            rate = result.publish_rate
            runs.append(
                {
                    "publish_rate": round(rate, 1),
                    "consume_rate": round(result.consume_rate, 1),
                    "confirm_p50_ms": _r(result.percentile(0.5)),
                    "confirm_p99_ms": _r(result.percentile(0.99)),
                    "broker_cpu_cores": round(cores, 3),
                    "cpu_ms_per_msg": round(1000 * cores / rate, 3) if rate else None,
                    "machine_cpu_busy": round(machine_busy, 3),
                    "nacked": result.nacked,
                    "errors": result.errors[:5],
                }
            )
    best = max(runs, key=lambda r: r["publish_rate"])
    keys = ("publish_rate", "confirm_p50_ms", "confirm_p99_ms", "cpu_ms_per_msg", "machine_cpu_busy")
    return {"broker": broker, "runs": runs, **{k: best[k] for k in keys}}


WARMUP = 3.0


def _r(x: float | None) -> float | None:
    return round(x, 2) if x is not None else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster_mirrored", description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--in-flight", type=int, default=50)
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args(argv)
    machine = machine_facts()  # before the runs: the load average the benchmark started under
    try:
        ref = measure("reference", args)
        rmq = measure("rabbitmq", args)
    except Exception as exc:  # noqa: BLE001 - one line for the operator
        print(f"bench.cluster_mirrored: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    data: dict[str, Any] = {
        "command": command_line(),
        "machine": machine,
        "args": vars(args),
        "reference": ref,
        "rabbitmq": rmq,
        "ratio": {
            "throughput": _ratio(ref["publish_rate"], rmq["publish_rate"]),
            "confirm_p50": _ratio(ref["confirm_p50_ms"], rmq["confirm_p50_ms"]),
            "confirm_p99": _ratio(ref["confirm_p99_ms"], rmq["confirm_p99_ms"]),
            "cpu_per_msg": _ratio(ref["cpu_ms_per_msg"], rmq["cpu_ms_per_msg"]),
        },
    }
    data["machine"]["load_average_at_end"] = os.getloadavg()
    OUT.with_suffix(".json").write_text(json.dumps(data, indent=1))
    rows = [
        f"| {b['broker']} | {b['publish_rate']} | {b['confirm_p50_ms']} | {b['confirm_p99_ms']} | "
        f"{b['cpu_ms_per_msg']} | {round(100 * b['machine_cpu_busy'])}% |"
        for b in (ref, rmq)
    ]
    every = "; ".join(
        f"{b['broker']} "
        + ", ".join(f"{r['publish_rate']} msg/s at {r['cpu_ms_per_msg']} ms CPU" for r in b["runs"])
        for b in (ref, rmq)
    )
    md = "\n".join(
        [
            "# 3-node mirrored queue (ha-mode all, automatic sync): reference vs RabbitMQ 3.10",
            "",
            f"`{data['command']}`; publishers and the consumer on n2, queue master on n1; persistent "
            f"{args.size}-byte messages, {args.publishers} publishers x {args.in_flight} unconfirmed; each broker's "
            f"best of {args.repeats} run(s) of {args.duration:g} s (every run is in the json). CPU: the three broker "
            "containers' CPU time (cgroup) over the measurement window per confirmed message; machine busy: the whole "
            "machine's CPU over that window (it is shared: other work runs beside the benchmark).",
            "",
            "| broker | confirmed msg/s | confirm p50 ms | confirm p99 ms | broker CPU ms/msg | machine busy |",
            "| --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"Ratios reference / RabbitMQ: throughput {data['ratio']['throughput']}, confirm p50 "
            f"{data['ratio']['confirm_p50']}, p99 {data['ratio']['confirm_p99']}, CPU per message "
            f"{data['ratio']['cpu_per_msg']}.",
            "",
            f"Every run: {every}.",
            "",
            facts_markdown(data["machine"], data["command"]),
        ]
    )
    OUT.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
