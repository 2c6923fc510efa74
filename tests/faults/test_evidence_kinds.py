"""How each kind reads its evidence from what it measured: the clock read inside a node, a disk
rule's and the kernel's counters, the membership the broker reports, a corruption's checksums."""

from __future__ import annotations

import os
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from faults.clock import clock_evidence
from faults.corrupt import changed
from faults.disk import DiskError
from faults.membership import MemberRemove
from faults.node.clockread import measure
from faults.node.corrupt import corrupt
from faults.packets import PacketLoss
from harness.spec import Evidence, FaultContext, UnsyncedWrite, combine_evidence, message_body
from plugins.nats import Nats
from plugins.redis import Redis, Valkey
from plugins.reference import ReferenceBroker

NODES = ["n1", "n2", "n3"]
CTX = FaultContext(SimpleNamespace(nodes={}, topology=SimpleNamespace(nodes=NODES)))


def test_a_process_without_the_fake_clock_is_no_effect() -> None:
    # This test's own process loads no fake clock: measured for real, it reads true time.
    reading = measure([os.getpid()])
    assert reading["pids"] == {str(os.getpid()): False}
    assert abs(reading["offset_s"]) <= reading["bound_s"]  # the reader's own start-up, not a fixed bound
    ev = clock_evidence("n2", [12.5], reading)
    assert ev.effect is False
    assert ev.no_effect_reason == "no broker process on n2 loads the fake clock: the offset reaches nothing"


def test_a_clock_offset_is_judged_by_what_is_measured_not_what_was_configured() -> None:
    loaded = {"pids": {"7": True, "9": False}, "samples": [12.4]}
    ev = clock_evidence("n1", [12.5], {**loaded, "offset_s": 12.41})
    assert ev.effect is True and ev.flags == ("n1: broker process(es) 9 do not load the fake clock",)
    off = clock_evidence("n1", [12.5], {**loaded, "offset_s": 3.0})
    assert off.effect is True and "n1: measured +3.000 s, configured +12.500 s" in off.flags
    none = clock_evidence("n1", [12.5], {**loaded, "offset_s": 0.01})
    assert none.effect is False and none.summary.startswith("the clock inside n1 reads true time")


def test_a_disk_rule_no_call_met_is_no_effect() -> None:
    fault = DiskError(CTX, DiskError.resolve({"nodes": ["n1", "n2"]}, NODES, random.Random(1)), "f4")
    report = {"kind": "eio", "ops": ["write", "fsync"], "paths": ["/log"]}
    done = {"nodes": {"n1": {**report, "hits": 3}, "n2": {**report, "hits": 0, "paths": []}}}
    ev = fault.heal_evidence(done, fault.evidence({"nodes": {"n1": {}, "n2": {}}}))
    assert ev.effect is True and ev.facts["n1"]["hits"] == 3
    assert ev.flags == ("n2: no write/fsync call matched while it held",)
    quiet = {"nodes": {"n1": {**report, "hits": 0}}}
    assert fault.heal_evidence(quiet, Evidence.unmeasured("x")).effect is False


def test_packet_loss_reads_the_kernel_counters() -> None:
    fault = PacketLoss(CTX, {"node": "n1", "loss": 10.0, "direction": "in", "links": "peers"}, "f5")
    shown = (
        "table netdev t { chain ingress { ip saddr { 10.0.0.3 } counter packets 812 bytes 90000\n"
        " ip saddr { 10.0.0.3 } numgen random mod 10000 < 1000 counter packets 77 bytes 8000 drop } }"
    )
    ev = fault.heal_evidence({"counters_before_heal": {"n1": shown}}, Evidence.unmeasured("x"))
    assert ev.effect is True and ev.facts["n1"]["dropped_packets"] == 77
    idle = shown.replace("packets 812", "packets 0").replace("packets 77", "packets 0")
    assert fault.heal_evidence({"counters_before_heal": {"n1": idle}}, ev).effect is False


def test_membership_as_the_broker_reports_it() -> None:
    fault = MemberRemove(CTX, {"node": "n2"}, "f6")
    done: dict[str, Any] = {"members_before": NODES, "members_after": ["n1", "n3"], "asked": "n1"}
    ev = fault.evidence(done)
    assert ev.effect is True
    assert fault.heal_evidence({"members_after": NODES}, ev).restored is True
    assert fault.evidence({**done, "members_before": ["n1", "n3"]}).effect is False


def test_bit_flips_land_on_the_written_extent_not_a_preallocated_tail(tmp_path: Path) -> None:
    # A journal of 4 KiB written at the head of a 1 MiB preallocated (zero) file.
    (tmp_path / "journal").write_bytes(os.urandom(4096).replace(b"\0", b"\1") + bytes(1 << 20))
    flips = [[u / 10, 3] for u in range(10)]
    reply = corrupt(tmp_path, {"mode": "bitflip", "glob": "*", "file": 0.0, "flips": flips})
    assert reply["written_extent"] == [0, 4096]
    assert all(c["offset"] < 4096 for c in reply["changes"])
    assert changed(reply).effect is True
    # An all-zero file has nothing written: the flip is named no effect, not counted as a corruption.
    (tmp_path / "journal").write_bytes(bytes(1 << 16))
    zero = corrupt(tmp_path, {"mode": "bitflip", "glob": "*", "file": 0.0, "flips": flips})
    assert zero["changes"] == [] and str(changed(zero).no_effect_reason).endswith(
        "(it holds no written byte)"
    )


def test_two_flips_of_one_bit_cancel_out_and_are_named(tmp_path: Path) -> None:
    (tmp_path / "seg").write_bytes(b"x" * 100)
    reply = corrupt(tmp_path, {"mode": "bitflip", "glob": "*", "file": 0.0, "flips": [[0.5, 2], [0.5, 2]]})
    assert changed(reply).effect is False and "the flips cancelled out" in changed(reply).summary


def test_combined_evidence_bit_where_any_part_did() -> None:
    ev = combine_evidence(
        {"n1": Evidence.bit("dropped 10 bytes"), "n2": Evidence.none("nothing unsynced was dropped")}
    )
    assert ev.effect is True and ev.flags == ("n2: nothing unsynced was dropped",)
    assert (
        combine_evidence({"n1": Evidence.none("a"), "n2": Evidence.none("b")}).no_effect_reason
        == "n1: a; n2: b"
    )
    assert combine_evidence({"n1": Evidence.none("a"), "n2": Evidence.unmeasured("?")}).effect is None
    assert Evidence.from_dict(ev.as_dict()) == ev


def test_plugins_map_dropped_writes_to_the_messages_their_files_hold() -> None:
    record = b"\x00\x00\x00\x61" + message_body("p2:17", 3, 90) + b"\x00" * 8
    other = message_body("p2:18", 3, 90)
    writes: list[UnsyncedWrite] = [
        {"path": "/jetstream/$G/streams/chaos-1/msgs/1.blk", "offset": 4096, "data": record},
        {"path": "/jetstream/$G/streams/chaos-1/msgs/1.idx", "offset": 0, "data": other},
    ]
    assert Nats().unsynced_messages(writes, {"replicas": 1}, 3) == [
        "ap2:17",
        "p2:17",
    ]  # the harness keeps what was attempted
    ref: list[UnsyncedWrite] = [
        {"path": "/store/commitlog/00000000000000000000", "offset": 0, "data": other},
        {"path": "/store/consumequeue/q/00000000000000000000", "offset": 0, "data": record},
    ]
    assert ReferenceBroker().unsynced_messages(ref, {}, 3) == ["p2:18"]


def resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def test_redis_maps_the_append_only_files_xadds_and_not_its_rdb_files() -> None:
    def xadd(msg_id: str) -> bytes:
        body = message_body(msg_id, 3, 90)
        return resp(b"XADD", b"chaos", b"1764370000000-0", b"id", msg_id.encode(), b"body", body)

    torn = xadd("p1:5")[:-60]  # the dropped part of a write cut short: the body's head is in it
    writes: list[UnsyncedWrite] = [
        {"path": "/appendonlydir/appendonly.aof.1.incr.aof", "offset": 512, "data": xadd("p1:4") + torn},
        {"path": "/appendonlydir/appendonly.aof.2.base.aof", "offset": 0, "data": xadd("p1:2")},
        {
            "path": "/appendonlydir/appendonly.aof.1.base.rdb",
            "offset": 0,
            "data": message_body("p1:1", 3, 90),
        },
        {"path": "/dump.rdb", "offset": 0, "data": message_body("p1:3", 3, 90)},
    ]
    assert Redis().unsynced_messages(writes, {}, 1) == ["p1:2", "p1:4", "p1:5"]
    assert "unsynced-messages" in Redis.capabilities and "unsynced-messages" in Valkey.capabilities
