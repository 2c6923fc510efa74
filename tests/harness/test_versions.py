"""Broker versions as a scenario axis: declared by plugins, chosen by ``broker.version``, built
from their Debian suite, refused in one line when unknown (no Docker)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import BrokerPlugin, BrokerVersion, ImageRecipe, ScenarioError
from harness.images import PIN_MISMATCH, NotServed, _check_served, _pin_check
from harness.scenario import build, from_dict
from plugins.nats import Nats
from plugins.rabbitmq import RabbitMQ
from plugins.redis import Redis, Valkey

EXE = shutil.which("brokerchaos")
REPO = Path(__file__).resolve().parents[2]


class Versioned(BrokerPlugin):
    name = "versioned"
    versions = (
        BrokerVersion("1.0", "bookworm", ("thing-server",), "1.0.3"),
        BrokerVersion("2.1", "sid", ("thing-server", "thing-tools"), "2.1.0", settings={"mode": "new"}),
    )
    settings_schema = {"mode": ("old", ("old", "new"))}

    def image(self) -> ImageRecipe:
        return self.release_recipe("brokerchaos/thing", python_packages=("x",))


def test_the_default_version_is_the_first_and_builds_what_it_built_before_versions() -> None:
    p = Versioned()
    assert p.release is p.versions[0] and p.at_version(None) is p
    assert p.image() == ImageRecipe(
        name="brokerchaos/thing", debian_packages=("thing-server",), python_packages=("x",)
    )
    assert p.validate_settings({}) == {"mode": "old"}


def test_a_named_version_has_its_suite_packages_pin_and_setting_defaults() -> None:
    p = Versioned()
    bound = p.at_version("2.1")
    assert bound is not p and p.release is p.versions[0]  # the registered instance is untouched
    assert bound.image() == ImageRecipe(
        name="brokerchaos/thing-2.1",
        debian_packages=("thing-server", "thing-tools"),
        python_packages=("x",),
        suite="sid",
        pins={"thing-server": "2.1"},
    )
    assert bound.validate_settings({}) == {"mode": "new"}
    assert bound.validate_settings({"mode": "old"}) == {"mode": "old"}  # a default, not a rule
    assert p.at_version("2.1.0").release is p.versions[1]  # the upstream version names it too


def test_an_unknown_version_names_the_versions_there_are() -> None:
    with pytest.raises(
        ScenarioError, match=r"broker.version: '3.1' is not a version of versioned; use one of 1.0, 2.1"
    ):
        Versioned().at_version("3.1")


def test_scenario_reads_broker_version_and_keeps_the_file_as_it_was_without_one() -> None:
    sc = from_dict({"broker": {"plugin": "rabbitmq", "version": "4.3"}})
    assert sc.broker.version == "4.3" and sc.to_dict()["broker"]["version"] == "4.3"
    assert from_dict({"broker": {"plugin": "nats", "version": 2.15}}).broker.version == "2.15"
    assert "version" not in from_dict({"broker": {"plugin": "rabbitmq"}}).to_dict()["broker"]
    with pytest.raises(ScenarioError, match="broker.version: expected a version"):
        from_dict({"broker": {"plugin": "rabbitmq", "version": [4]}})
    # Another broker drops the version with the settings; ``version=`` sets one.
    assert build(sc, broker="nats").broker.version is None
    assert build(sc, broker="nats", version="2.15").broker.version == "2.15"


def test_shipped_plugins_declare_their_debian_versions() -> None:
    assert [(v.name, v.suite) for v in RabbitMQ.versions] == [
        ("3.10", "bookworm"),
        ("4.0", "trixie"),
        ("4.3", "sid"),
    ]
    assert [(v.name, v.suite) for v in Nats.versions] == [
        ("2.9", "bookworm"),
        ("2.10", "trixie"),
        ("2.15", "sid"),
    ]
    assert [(v.name, v.suite) for v in Redis.versions] == [
        ("7.0", "bookworm"),
        ("8.0", "sid"),
        ("8.0.2", "trixie"),
    ]
    assert [(v.name, v.suite) for v in Valkey.versions] == [("9.1", "sid"), ("8.1", "trixie")]
    valkey = Valkey().image()  # its default is on sid, which moves on: pinned all the same
    assert valkey.debian_packages[0] == "valkey-server" and valkey.pins == {"valkey-server": "9.1"}
    assert Redis().image().pins == {}  # bookworm's default: the recipe it had before versions
    assert Redis().image().name == "brokerchaos/redis" and Valkey().image().name == "brokerchaos/valkey"


def test_rabbitmq_4_refuses_a_mirroring_policy_and_3_10_refuses_khepri() -> None:
    r4 = RabbitMQ().at_version("4.3")
    with pytest.raises(ScenarioError, match="RabbitMQ 4.3 has no classic mirrored queues"):
        r4.validate_settings({"ha_mode": "all"})
    assert r4.validate_settings({"queue_type": "quorum"})["metadata_store"] == "khepri"
    with pytest.raises(ScenarioError, match="RabbitMQ 3.10 has Mnesia only"):
        RabbitMQ().validate_settings({"metadata_store": "khepri"})
    with pytest.raises(
        ScenarioError, match='RabbitMQ 4.3 runs on Khepri here; for Mnesia use broker.version "4.0"'
    ):
        r4.validate_settings({"metadata_store": "mnesia"})


def test_trixie_versions_build_from_trixie_pinned_to_what_debian_13_serves() -> None:
    """Debian 13's releases: one trixie root filesystem, each image named and pinned by version,
    none of them touching the default's image (bookworm's, unpinned)."""
    cases = [
        (RabbitMQ().at_version("4.0"), "brokerchaos/rabbitmq-4.0", {"rabbitmq-server": "4.0"}),
        (Nats().at_version("2.10"), "brokerchaos/nats-2.10", {"nats-server": "2.10"}),
        (Redis().at_version("8.0.2"), "brokerchaos/redis-8.0.2", {"redis-server": "8.0.2"}),
        (Valkey().at_version("8.1"), "brokerchaos/valkey-8.1", {"valkey-server": "8.1"}),
    ]
    for plugin, name, pins in cases:
        recipe = plugin.image()
        assert (recipe.suite, recipe.name, dict(recipe.pins)) == ("trixie", name, pins), plugin.name
    # Its upstream version names it too; sid's 8.0 stays what "8.0" names.
    assert Redis().at_version("8.0").image().suite == "sid"
    assert Valkey().at_version("8.1.1").release is Valkey.versions[1]
    assert RabbitMQ().image().suite == "bookworm" and RabbitMQ().image().pins == {}


def test_rabbitmq_4_0_runs_quorum_queues_on_mnesia_or_khepri_and_refuses_mirroring() -> None:
    """4.0 removed classic mirrored queues and kept Mnesia as a new cluster's metadata store;
    Khepri is its opt-in (the ``khepri_db`` feature flag, enabled once the cluster formed)."""
    r40 = RabbitMQ().at_version("4.0")
    assert isinstance(r40, RabbitMQ) and not r40.mirroring
    assert r40.validate_settings({"queue_type": "quorum"})["metadata_store"] == "mnesia"
    with pytest.raises(ScenarioError, match="RabbitMQ 4.0 has no classic mirrored queues"):
        r40.validate_settings({"ha_mode": "all"})
    assert r40.validate_settings({"metadata_store": "khepri"})["metadata_store"] == "khepri"


def test_nats_sync_interval_from_2_10_on() -> None:
    n = Nats().at_version("2.15")
    assert n.validate_settings({"sync_interval": "always"})["sync_interval"] == "always"
    with pytest.raises(ScenarioError, match="sync_interval: 'sometimes'"):
        n.validate_settings({"sync_interval": "sometimes"})
    with pytest.raises(ScenarioError, match="nats-server 2.9 has no such setting"):
        Nats().validate_settings({"sync_interval": "always"})
    n210 = Nats().at_version("2.10")  # trixie's 2.10.27 has it
    assert n210.validate_settings({"sync_interval": "always"})["sync_interval"] == "always"
    assert n210.confirms_after_sync(n210.validate_settings({})) is False


def test_nats_promises_synced_confirms_only_under_sync_interval_always() -> None:
    """What a power cut's exposure is judged against: acknowledged-but-unsynced messages are a
    finding of their own only where the settings promise a sync before the ack."""
    n = Nats().at_version("2.15")
    assert n.confirms_after_sync(n.validate_settings({"sync_interval": "always"})) is True
    assert n.confirms_after_sync(n.validate_settings({})) is False
    assert Nats().confirms_after_sync(Nats().validate_settings({})) is False


def _installed(package: str) -> str | None:
    dpkg = shutil.which("dpkg-query")
    if dpkg is None:
        return None
    proc = subprocess.run([dpkg, "-W", "-f", "${Version}", package], capture_output=True, text=True)
    return proc.stdout.split(":")[-1] if proc.returncode == 0 and proc.stdout else None


@pytest.mark.skipif(_installed("python3") is None, reason="needs dpkg and python3 from a Debian package")
def test_the_pin_check_passes_the_version_served_and_names_another() -> None:
    served = _installed("python3")
    assert served is not None
    major_minor = ".".join(served.split(".")[:2])  # e.g. 3.11 of 3.11.2-1+b1
    ok = subprocess.run(
        ["sh", "-c", "true" + _pin_check("python3", major_minor)], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run(["sh", "-c", "true" + _pin_check("python3", "1.0")], capture_output=True, text=True)
    assert bad.returncode == 3 and bad.stdout.startswith(f"{PIN_MISMATCH} python3 ")
    with pytest.raises(NotServed, match="Debian serves python3 "):
        _check_served(bad.stdout.strip())
    with pytest.raises(NotServed, match="Unable to locate package rabbitmq-server"):
        _check_served("E: Unable to locate package rabbitmq-server")
    _check_served("Step 2/3 : RUN apt-get update")  # anything else passes


@pytest.mark.skipif(EXE is None, reason="the brokerchaos command is not installed (pip install -e .)")
def test_cli_lists_versions_and_refuses_an_unknown_one_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    assert EXE is not None
    listed = subprocess.run([EXE, "plugins"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert listed.returncode == 0
    assert "version 4.3    Debian sid       rabbitmq-server 4.3.6" in listed.stdout
    assert "version 9.1    Debian sid       valkey-server" in listed.stdout
    assert "version 4.0    Debian trixie    rabbitmq-server 4.0.5" in listed.stdout
    assert "version 8.1    Debian trixie    valkey-server" in listed.stdout
    (tmp_path / "s.yaml").write_text('broker: {plugin: rabbitmq, version: "5.0"}\n')
    r = subprocess.run([EXE, "run", "s.yaml"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("brokerchaos: ")
    assert "broker.version: '5.0' is not a version of rabbitmq; use one of 3.10, 4.0, 4.3" in r.stderr
