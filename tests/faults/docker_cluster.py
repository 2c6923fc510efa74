"""A real cluster for one test module's Docker tests: images built, nodes started, torn down after."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from harness.cluster import Cluster, build_topology, docker_client
from harness.host import Host
from harness.images import ImageBuilder


@contextmanager
def running_cluster(
    broker: str,
    tag: str,
    nodes: int,
    settings: Mapping[str, Any] | None = None,
    *,
    plugins: Sequence[str] = (),
    faketime: bool = False,
) -> Iterator[Cluster]:
    """``nodes`` nodes of ``broker`` (loaded with the ``-p`` modules ``plugins``) on ``settings``,
    started; the run id is ``bc-<tag><4 hex digits>``. ``faketime``: the broker's image with the
    fake clock, as the clock faults need."""
    host = Host.load(plugins)
    plugin = host.broker(broker)
    valid = plugin.validate_settings(settings or {})
    client = docker_client()
    builder = ImageBuilder(client)
    image = builder.node_image(plugin.image())
    topology = build_topology(
        plugin,
        run_id=f"bc-{tag}{random.randrange(16**4):04x}",
        nodes=nodes,
        settings=valid,
        broker_image=builder.faketime_image(image) if faketime else image,
        proxy_image=builder.toxiproxy_image(),
        faketime=faketime,
    )
    with Cluster(client, topology, plugin, valid) as c:
        c.start()
        yield c
