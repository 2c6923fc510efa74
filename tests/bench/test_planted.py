"""The planted-bug catalogue stays usable: every patch applies to the current broker without fuzz,
the patched broker still starts and serves the happy path, and the reference plugin builds its
image from the patched copy. A broker change that breaks a patch fails here at once, not an hour
into ``python -m bench.detection``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from bench.detection import CATALOGUE, PLANTED, REPO, SOURCE_ENV, Bug, PatchError, apply_patch, load_catalogue
from harness.errors import BrokerChaosError
from harness.scenario import load
from tests.broker_impl.conftest import node_port

BUGS = load_catalogue()


def test_catalogue_lists_every_patch_once() -> None:
    assert len(BUGS) >= 12
    assert sorted(b.patch.name for b in BUGS) == sorted(p.name for p in PLANTED.glob("*.patch"))
    assert len({b.id for b in BUGS}) == len({b.name for b in BUGS}) == len(BUGS)


@pytest.mark.parametrize("bug", BUGS, ids=[b.label for b in BUGS])
def test_scenario_is_shipped_and_valid_for_the_reference_broker(bug: Bug) -> None:
    from harness.host import Host
    from harness.nemesis import check_capabilities, plan
    from plugins.reference import ReferenceBroker

    assert bug.scenario.parent == REPO / "scenarios"
    scenario = load(bug.scenario)
    assert scenario.broker.plugin == "reference"
    plugin = ReferenceBroker()
    plugin.validate_settings(scenario.broker.settings)
    faults = Host.load([]).registry.faults
    check_capabilities(scenario, faults, frozenset(plugin.capabilities), plugin.name)
    nodes = [f"n{i}" for i in range(1, scenario.broker.nodes + 1)]
    assert plan(scenario, faults, nodes) is not None
    assert scenario.workload.duration <= 30 and scenario.broker.nodes <= 3


@pytest.mark.parametrize("bug", BUGS, ids=[b.label for b in BUGS])
def test_patch_applies_without_fuzz_and_changes_the_broker(bug: Bug, tmp_path: Path) -> None:
    before = _tree_bytes(REPO / "broker_impl")
    tree = apply_patch(bug, tmp_path)
    assert _tree_bytes(REPO / "broker_impl") == before, "the patch touched the working tree"
    changed = [tree / rel for rel, data in _tree_bytes(tree).items() if before.get(rel) != data]
    assert changed, f"{bug.patch.name} applied but changed nothing"
    assert not list(tree.rglob("*.orig")) and not list(tree.rglob("*.rej"))
    for path in changed:
        compile(path.read_text(), str(path), "exec")


def _tree_bytes(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*.py") if "__pycache__" not in p.parts}


def test_a_patch_that_does_not_apply_is_one_clear_error(tmp_path: Path) -> None:
    stale = tmp_path / "stale.patch"
    stale.write_text(
        "--- a/broker_impl/queue.py\n+++ b/broker_impl/queue.py\n@@ -1,1 +1,1 @@\n"
        "-this line is not in the file\n+nor this one\n"
    )
    bug = Bug("99", "stale", stale, "queue", "d", "p", REPO / "scenarios" / "smoke.yaml", "LOST")
    with pytest.raises(
        PatchError, match=r"stale\.patch does not apply to the current broker_impl/ .*update the patch"
    ):
        apply_patch(bug, tmp_path / "copy")


def test_catalogue_errors_name_the_entry(tmp_path: Path) -> None:
    bad = tmp_path / "catalogue.yaml"
    bad.write_text((CATALOGUE.read_text()).replace("expect: INTEGRITY", "expect: BROKEN"))
    for p in PLANTED.glob("*.patch"):
        (tmp_path / p.name).write_text(p.read_text())
    with pytest.raises(
        BrokerChaosError, match=r"catalogue\.yaml: bugs\[\d+\]: expect 'BROKEN'; allowed LOST"
    ):
        load_catalogue(bad)


# -- the patched broker still runs ------------------------------------------------------------------


class PatchedBroker:
    """``python -m broker_impl`` started from a patched copy (the copy's directory first on the path)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        cfg = root / "broker.toml"
        cfg.write_text(
            f'[node]\nport = 0\ndata_dir = "{self.data}"\nlog_file = "{root / "broker.log"}"\n'
            '[store]\nflush = "sync"\n'
        )
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker_impl", "--config", str(cfg)],
            cwd=root,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=open(root / "stderr.log", "wb"),
        )
        self.port = node_port(self.proc, self.data, root / "stderr.log")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


@pytest.fixture
def patched(tmp_path: Path) -> Iterator[PatchedBroker]:
    brokers: list[PatchedBroker] = []

    def start(bug: Bug) -> PatchedBroker:
        apply_patch(bug, tmp_path)
        b = PatchedBroker(tmp_path)
        brokers.append(b)
        return b

    yield start  # type: ignore[misc]
    for b in brokers:
        if b.proc.poll() is None:
            b.proc.kill()
            b.proc.wait(10)


@pytest.mark.slow
@pytest.mark.parametrize("bug", BUGS, ids=[b.label for b in BUGS])
def test_patched_broker_serves_a_confirmed_publish_and_an_ack(bug: Bug, patched, tmp_path: Path) -> None:
    broker = patched(bug)
    which = subprocess.run(
        [sys.executable, "-c", "import broker_impl; print(broker_impl.__file__)"],
        env=broker.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(which).parent == tmp_path / "broker_impl", "the patched copy is not the broker that runs"
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("planted", durable=True)
        ch.basic_publish(
            "",
            "planted",
            b"first body",
            pika.BasicProperties(delivery_mode=2, message_id="p1:1"),
            mandatory=True,
        )
        method, props, body = ch.basic_get("planted")
        assert method is not None and body == b"first body" and props.message_id == "p1:1"
        ch.basic_ack(method.delivery_tag)
        assert ch.queue_declare("planted", passive=True).method.message_count == 0
    finally:
        conn.close()
    assert broker.stop() == 0


# -- the reference plugin builds from another tree ---------------------------------------------------


def test_reference_image_from_a_patched_tree(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from plugins.reference import ReferenceBroker

    tree = apply_patch(BUGS[0], tmp_path)
    monkeypatch.setenv(SOURCE_ENV, str(tree))
    recipe = ReferenceBroker().image()
    assert recipe.name == "brokerchaos/reference-custom"
    assert recipe.copy == {str(tree): "/opt/brokerchaos/broker_impl"}
    monkeypatch.delenv(SOURCE_ENV)
    recipe = ReferenceBroker().image()
    assert recipe.name == "brokerchaos/reference"
    assert recipe.copy == {str(REPO / "broker_impl"): "/opt/brokerchaos/broker_impl"}


def test_reference_image_from_a_directory_that_is_not_the_broker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from plugins.reference import ReferenceBroker

    monkeypatch.setenv(SOURCE_ENV, str(tmp_path))
    with pytest.raises(
        BrokerChaosError, match=r"^BROKERCHAOS_REFERENCE_SOURCE=.*not a broker_impl source tree"
    ):
        ReferenceBroker().image()


def test_bugs_run_on_another_scenario_when_asked() -> None:
    from bench.detection import on_scenario, select

    bugs = select(load_catalogue(), "16")
    assert on_scenario(bugs, None) == bugs
    moved = on_scenario(bugs, "scenarios/power-loss-ext4-ordered.yaml")
    assert [b.scenario for b in moved] == [REPO / "scenarios/power-loss-ext4-ordered.yaml"]
    assert load(moved[0].scenario).broker.filesystem == "ext4-ordered"
    with pytest.raises(BrokerChaosError, match="--scenario: nowhere.yaml does not exist"):
        on_scenario(bugs, "nowhere.yaml")


def test_the_restart_in_minority_revert_applies_and_removes_the_start_up_check(tmp_path: Path) -> None:
    """``bench/reverts/restart-in-minority-serves.patch`` (the fix taken out again, for measuring
    explore on the defect) still applies to the current broker without fuzz, through the same
    ``apply_patch`` as a planted bug, and takes out ``Partitions.start``'s majority check."""
    patch = REPO / "bench" / "reverts" / "restart-in-minority-serves.patch"
    revert = Bug(
        "revert",
        "restart-in-minority-serves",
        patch,
        "partitions",
        "d",
        "p",
        REPO / "scenarios" / "reference-restart-in-minority.yaml",
        "LOST",
    )
    tree = apply_patch(revert, tmp_path)
    before = (REPO / "broker_impl" / "cluster" / "partitions.py").read_text()
    after = (tree / "cluster" / "partitions.py").read_text()
    compile(after, "partitions.py", "exec")
    start = before.index("    def start(self) -> None:")
    assert "self.check_majority()" in before[start : before.index("def serving_alone", start)]
    start = after.index("    def start(self) -> None:")
    assert "self.check_majority()" not in after[start : after.index("def serving_alone", start)]
