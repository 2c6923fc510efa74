"""File corruption: the plan is concrete and seeded, and exactly the recorded bytes change on disk."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import pytest

from faults.corrupt import CorruptFile, data_file_globs, file_role_globs
from faults.node.corrupt import candidates, corrupt
from harness.errors import ScenarioError
from harness.spec import FaultContext
from tests.faults.local_nodes import LocalCluster
from tests.faults.test_nodeinit import Init, wait_for

N3 = ["n1", "n2", "n3"]
N5 = [*N3, "n4", "n5"]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    rng = random.Random(4)
    (tmp_path / "seg").mkdir()
    (tmp_path / "seg" / "0001.log").write_bytes(rng.randbytes(5000))
    (tmp_path / "seg" / "0002.log").write_bytes(rng.randbytes(300))
    (tmp_path / "meta.json").write_bytes(b'{"v": 1}')
    (tmp_path / "empty").write_bytes(b"")
    return tmp_path


def test_candidates_are_sorted_non_empty_files_matching_the_glob(data: Path) -> None:
    assert candidates(data, "**/*") == ["meta.json", "seg/0001.log", "seg/0002.log"]
    assert candidates(data, "seg/*.log") == ["seg/0001.log", "seg/0002.log"]
    assert candidates(data, "nothing*") == []


def test_bitflip_changes_exactly_the_recorded_bits(data: Path) -> None:
    path = data / "seg" / "0001.log"
    before = path.read_bytes()
    done = corrupt(
        data,
        {"mode": "bitflip", "glob": "seg/*.log", "file": 0.2, "flips": [[0.0, 0], [0.5, 7], [0.999999, 3]]},
    )
    after = path.read_bytes()
    assert done["file"] == str(path) and done["candidates"] == 2
    assert done["size_before"] == done["size_after"] == 5000
    assert [c["offset"] for c in done["changes"]] == [0, 2500, 4999]
    diff = [i for i in range(5000) if before[i] != after[i]]
    assert diff == [0, 2500, 4999]
    for c in done["changes"]:
        assert int(c["before"], 16) == before[c["offset"]] and int(c["after"], 16) == after[c["offset"]]
        assert before[c["offset"]] ^ after[c["offset"]] == 1 << c["bit"]


def test_truncate_by_bytes_or_at_a_seeded_offset(data: Path) -> None:
    path = data / "seg" / "0002.log"
    whole = path.read_bytes()
    done = corrupt(data, {"mode": "truncate", "glob": "**/*", "file": 0.9, "bytes": 100})
    assert done["file"] == str(path) and (done["size_before"], done["size_after"]) == (300, 200)
    assert done["cut"]["offset"] == 200 and done["cut"]["sha256"] == hashlib.sha256(whole[200:]).hexdigest()
    assert path.read_bytes() == whole[:200]
    done = corrupt(data, {"mode": "truncate", "glob": "**/*", "file": 0.9, "cut": 0.5})
    assert done["size_after"] == 100 and path.read_bytes() == whole[:100]
    with pytest.raises(ValueError, match="no non-empty file"):
        corrupt(data, {"mode": "truncate", "glob": "none", "file": 0.1, "bytes": 1})


def test_resolve_is_concrete_seeded_and_stable_under_replay() -> None:
    p = CorruptFile.resolve({}, N5, random.Random(3))
    assert len(p["nodes"]) == 2 and p["mode"] == "bitflip" and p["bits"] == 8
    assert "files" not in p and "file_role" not in p  # the broker plugin's data files: ``_plan``
    assert set(p["picks"]) == set(p["nodes"])
    assert all(len(pick["flips"]) == 8 and 0 <= pick["file"] < 1 for pick in p["picks"].values())
    assert CorruptFile.resolve(p, N5, random.Random(77)) == p
    assert CorruptFile.resolve({}, N5, random.Random(3)) == p
    t = CorruptFile.resolve({"mode": "truncate", "nodes": ["n2"]}, N3, random.Random(1))
    assert t["nodes"] == ["n2"] and set(t["picks"]["n2"]) == {"file", "cut"}
    t = CorruptFile.resolve({"mode": "truncate", "bytes": 10}, N3, random.Random(1))
    assert t["bytes"] == 10 and set(t["picks"][t["nodes"][0]]) == {"file"}
    for bad, match in (
        ({"mode": "truncate", "bits": 2}, "bits is for mode bitflip"),
        ({"bytes": 2}, "bytes is for mode truncate"),
        ({"mode": "zero"}, "mode 'zero'"),
        ({"bits": 0}, "between 1 and 4096"),
    ):
        with pytest.raises(ScenarioError, match=match):
            CorruptFile.resolve(bad, N3, random.Random(1))


def test_the_broker_is_down_while_its_file_is_corrupted_on_disk(one_init: dict[str, Init]) -> None:
    init = one_init["n1"]
    wait_for(lambda: init.log().count(b"tick") >= 5, "ticks")
    params = CorruptFile.resolve({"nodes": ["n1"], "bits": 4, "files": "log"}, ["n1"], random.Random(5))
    fault = CorruptFile(FaultContext(LocalCluster(one_init)), params, "f1")
    done = fault.apply()
    assert init.ctl("status")["state"] == "stopped"
    rec = done["nodes"]["n1"]
    assert rec["nodectl"]["signal"] == "SIGKILL" and rec["corrupted"]["file"] == f"{init.data}/log"
    # The change was fsynced through lazyfs: the backing "disk" holds it.
    disk = Path(init.tmp, "backing", "log").read_bytes()
    assert len(disk) == rec["corrupted"]["size_after"]
    final = {c["offset"]: int(c["after"], 16) for c in rec["corrupted"]["changes"]}  # the last flip of a byte
    assert final and all(disk[off] == byte for off, byte in final.items())
    healed = fault.heal()
    assert healed["ready"] and init.ctl("status")["state"] == "running"


def test_offsets_fall_in_the_written_part_of_a_preallocated_file(tmp_path: Path) -> None:
    """KahaDB preallocates a 32 MiB journal, writes a few hundred KB of it and marks its end: a flip
    drawn over the whole size lands in zeros the broker never reads (offset 27,927,960 of db-1.log
    in a validate run), and its recovery proves nothing."""
    path = tmp_path / "db-1.log"
    size = 4 << 20
    written = random.Random(2).randbytes(3000).strip(b"\0")
    with path.open("wb") as f:
        f.write(written)
        f.truncate(size)  # the preallocated rest: a hole that reads as zeros
        f.seek(size - 1)
        f.write(b"\x05")  # an end-of-file mark at the very end
    done = corrupt(tmp_path, {"mode": "bitflip", "glob": "*.log", "file": 0.0, "flips": [[0.9, 1], [0.1, 0]]})
    assert done["size_before"] == size and done["written"] == [[0, len(written)], [size - 1, size]]
    assert done["written_bytes"] == len(written) + 1
    offsets = [c["offset"] for c in done["changes"]]
    assert offsets == [int(0.9 * (len(written) + 1)), int(0.1 * (len(written) + 1))]
    after = path.read_bytes()
    assert after[len(written) :] == bytes(size - len(written) - 1) + b"\x05"  # the zeros untouched
    assert [i for i in range(len(written)) if after[i] != written[i]] == sorted(offsets)
    cut = corrupt(tmp_path, {"mode": "truncate", "glob": "*.log", "file": 0.0, "cut": 0.5})
    assert cut["cut"]["offset"] == (len(written) + 1) // 2  # a cut inside the data, not in the zeros


def test_a_file_role_is_the_union_of_its_globs_and_the_record_names_it(data: Path) -> None:
    assert candidates(data, ["seg/0002.log", "*.json", "seg/*.log"]) == [
        "meta.json",
        "seg/0001.log",
        "seg/0002.log",
    ]
    done = corrupt(
        data, {"mode": "bitflip", "glob": ["*.json"], "role": "meta", "file": 0.0, "flips": [[0.5, 1]]}
    )
    assert done["file"] == str(data / "meta.json") and done["role"] == "meta"
    with pytest.raises(ValueError, match=r"matches \['none'\] \(file role wal\)"):
        corrupt(data, {"mode": "bitflip", "glob": ["none"], "role": "wal", "file": 0.0, "flips": [[0.5, 1]]})


def test_resolve_keeps_a_file_role_and_refuses_it_beside_a_glob() -> None:
    p = CorruptFile.resolve({"file_role": "quorum-wal", "nodes": ["n1"]}, N3, random.Random(1))
    assert p["file_role"] == "quorum-wal" and CorruptFile.resolve(p, N3, random.Random(9)) == p
    with pytest.raises(ScenarioError, match="files \\(a glob\\) or file_role, not both"):
        CorruptFile.resolve({"file_role": "quorum-wal", "files": "**/*"}, N3, random.Random(1))


# The layout RabbitMQ 4.3.6 wrote under its data directory in a stream run (``find`` on a node).
RABBITMQ_43_FILES = (
    "rabbit@n1/quorum/rabbit@n1/0000000000000001.wal",
    "rabbit@n1/quorum/rabbit@n1/names.dets",
    "rabbit@n1/quorum/rabbit@n1/meta.dets",
    "rabbit@n1/quorum/rabbit@n1/2F_CHATM2V61WDIW2Z/0000000000000001.segment",
    "rabbit@n1/quorum/rabbit@n1/2F_CHATM2V61WDIW2Z/config",
    "rabbit@n1/coordination/rabbit@n1/0000000000000004.wal",
    "rabbit@n1/coordination/rabbit@n1/RABBITQYRFIAERLTLH/0000000000000001.segment",
    "rabbit@n1/stream/__chaos-1_1764384000000000000/00000000000000000000.segment",
    "rabbit@n1/stream/__chaos-1_1764384000000000000/00000000000000000000.index",
)


@pytest.mark.parametrize(
    ("role", "files"),
    [
        ("quorum-wal", ["rabbit@n1/quorum/rabbit@n1/0000000000000001.wal"]),
        ("quorum-segment", ["rabbit@n1/quorum/rabbit@n1/2F_CHATM2V61WDIW2Z/0000000000000001.segment"]),
        ("stream-segment", ["rabbit@n1/stream/__chaos-1_1764384000000000000/00000000000000000000.segment"]),
        ("stream-index", ["rabbit@n1/stream/__chaos-1_1764384000000000000/00000000000000000000.index"]),
    ],
)
def test_rabbitmq_file_roles_name_exactly_their_files(tmp_path: Path, role: str, files: list[str]) -> None:
    from plugins.rabbitmq import RabbitMQ
    from plugins.rabbitmq.streams import RabbitMQStream

    _layout(tmp_path, RABBITMQ_43_FILES)
    plugin = RabbitMQStream() if role.startswith("stream") else RabbitMQ()
    assert candidates(tmp_path, list(file_role_globs(plugin, role))) == files


def test_a_stream_node_s_corruption_naming_no_file_lands_in_the_stream(tmp_path: Path) -> None:
    """At seed 1 the stream row's pick among every RabbitMQ role landed in the quorum write-ahead
    log, which on a node running only streams is its 5-byte header: the stream plugin's data files
    are the stream's segments and indexes."""
    from plugins.rabbitmq.streams import RabbitMQStream

    _layout(tmp_path, RABBITMQ_43_FILES)
    assert candidates(tmp_path, data_file_globs(RabbitMQStream(), {})) == [
        "rabbit@n1/stream/__chaos-1_1764384000000000000/00000000000000000000.index",
        "rabbit@n1/stream/__chaos-1_1764384000000000000/00000000000000000000.segment",
    ]


def test_an_unknown_file_role_names_the_plugins_roles() -> None:
    from plugins.rabbitmq import RabbitMQ

    with pytest.raises(
        ScenarioError,
        match="no data file role 'stream-segment'; its roles: classic-index, classic-msg-store, "
        "quorum-segment, quorum-wal",
    ):
        file_role_globs(RabbitMQ(), "stream-segment")


# What RabbitMQ 3.10.8 keeps under its data directory with a classic and a quorum queue (``find``
# on a node; the vhost directory's ``.vhost`` holds one byte, ``.config`` 83).
RABBITMQ_310_FILES = (
    "rabbit@n1/msg_stores/vhosts/628WB79CIFDYO9LJI6DKMI09L/.vhost",
    "rabbit@n1/msg_stores/vhosts/628WB79CIFDYO9LJI6DKMI09L/.config",
    "rabbit@n1/msg_stores/vhosts/628WB79CIFDYO9LJI6DKMI09L/recovery.dets",
    "rabbit@n1/msg_stores/vhosts/628WB79CIFDYO9LJI6DKMI09L/msg_store_persistent/0.rdq",
    "rabbit@n1/msg_stores/vhosts/628WB79CIFDYO9LJI6DKMI09L/queues/3C2VKZ4ZJ8G5M0VR0ORXHRJ9X/journal.jif",
    "rabbit@n1/msg_stores/vhosts/628WB79CIFDYO9LJI6DKMI09L/queues/3C2VKZ4ZJ8G5M0VR0ORXHRJ9X/0.idx",
    "rabbit@n1/quorum/rabbit@n1/00000001.wal",
    "rabbit@n1/quorum/rabbit@n1/meta.dets",
    "rabbit@n1/quorum/rabbit@n1/names.dets",
    "rabbit@n1/quorum/rabbit@n1/2F_CHATM2V61WDIW2Z/00000001.segment",
    "rabbit@n1/quorum/rabbit@n1/2F_CHATM2V61WDIW2Z/config",
    "rabbit@n1/DECISION_TAB.LOG",
    "rabbit@n1/schema.DAT",
    "rabbit@n1/rabbit_durable_queue.DCD",
    "rabbit@n1/cluster_nodes.config",
)


class _Cluster:
    """Where ``_plan`` finds the broker plugin and the run's settings: ``ctx.cluster``."""

    def __init__(self, plugin: Any, settings: dict[str, Any]) -> None:
        self.plugin = plugin
        self.settings = plugin.validate_settings(settings)


def _layout(root: Path, files: tuple[str, ...]) -> None:
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")


def test_a_corruption_naming_no_file_lands_in_the_files_that_hold_the_run_s_messages(tmp_path: Path) -> None:
    """The matrix's bit flips name no file: among every file, RabbitMQ 3.10's seeded picks landed in
    the vhost's ``.config`` and ``.vhost``; among every RabbitMQ role, a classic queue's run picked
    the quorum log that a node with no quorum queue keeps as its 5-byte header. The candidates are
    the run's queue type's files; a plugin that declares no data files still has every file."""
    from plugins.rabbitmq import RabbitMQ
    from plugins.reference import ReferenceBroker

    _layout(tmp_path, RABBITMQ_310_FILES)
    params = CorruptFile.resolve({"nodes": ["n1"], "bits": 16}, N3, random.Random(1))
    vhost = "rabbit@n1/msg_stores/vhosts/628WB79CIFDYO9LJI6DKMI09L"
    picks = {
        "classic": [
            f"{vhost}/msg_store_persistent/0.rdq",
            f"{vhost}/queues/3C2VKZ4ZJ8G5M0VR0ORXHRJ9X/0.idx",
            f"{vhost}/queues/3C2VKZ4ZJ8G5M0VR0ORXHRJ9X/journal.jif",
        ],
        "quorum": [
            "rabbit@n1/quorum/rabbit@n1/00000001.wal",
            "rabbit@n1/quorum/rabbit@n1/2F_CHATM2V61WDIW2Z/00000001.segment",
        ],
    }
    for queue_type, files in picks.items():
        cluster = _Cluster(RabbitMQ(), {"queue_type": queue_type})
        plan = CorruptFile(FaultContext(cluster), params, "f1")._plan("n1")
        assert candidates(tmp_path, plan["glob"]) == files
    assert data_file_globs(ReferenceBroker(), {}) == "**/*"
    named = CorruptFile.resolve({"nodes": ["n1"], "files": "**/*"}, N3, random.Random(1))
    assert CorruptFile(FaultContext(_Cluster(RabbitMQ(), {})), named, "f1")._plan("n1")["glob"] == "**/*"
