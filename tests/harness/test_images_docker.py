"""Every image starts from the one bootstrapped base: a broker's Debian packages are a layer on it,
never a bootstrap of their own (builds what is missing, like a first run)."""

from __future__ import annotations

import pytest

from harness.cluster import docker_client
from harness.host import Host
from harness.images import BASE_PACKAGES, ImageBuilder

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _layers(client, tag: str) -> list[str]:
    return [h["Id"] for h in client.api.history(tag) if h["Id"] != "<missing>"]


def test_every_image_is_built_on_the_one_base() -> None:
    client = docker_client()
    builder = ImageBuilder(client)
    base = builder.base()
    base_id = client.images.get(base).id
    # The base is the bootstrap itself: an imported root filesystem, one layer with no parent.
    assert _layers(client, base) == [base_id]
    assert builder.rootfs(()) == base and builder.rootfs(BASE_PACKAGES[:2]) == base
    host = Host.load()
    tags = [(builder.toxiproxy_image(), base_id)]
    for name in sorted(host.registry.brokers):
        # Each image on its suite's one base (a default version may come from another suite: Valkey's, sid).
        recipe = host.broker(name).image()
        suite_base = builder.base(recipe.suite)
        suite_base_id = client.images.get(suite_base).id
        if recipe.debian_packages:
            layer = builder.rootfs(recipe.debian_packages, recipe.suite, recipe.pins)
            assert layer != suite_base and suite_base_id in _layers(client, layer), name
        tags.append((builder.node_image(recipe), suite_base_id))
    for tag, under in tags:
        assert under in _layers(client, tag), tag


def test_an_image_two_commands_need_at_once_is_built_once(tmp_path) -> None:
    """The second command waits for the first's build (a file lock per tag), then finds the image."""
    import os
    import threading

    client = docker_client()
    base = ImageBuilder(client).base()
    tag = f"brokerchaos-test-{os.getpid()}/once:1"
    builds: list[str] = []
    started = threading.Barrier(2)

    def build() -> None:
        builds.append(threading.current_thread().name)
        client.images.get(base).tag(*tag.split(":"))

    def command() -> None:
        started.wait()
        ImageBuilder(client, cache=tmp_path)._once(tag, build)

    threads = [threading.Thread(target=command, name=f"c{i}") for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(builds) == 1, builds
        assert client.images.get(tag).id == client.images.get(base).id
    finally:
        client.images.remove(tag)
