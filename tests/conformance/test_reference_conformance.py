"""The conformance kit as a pytest suite: the reference plugin conforms, a broken one is named.

The Docker battery runs once per module (short runs, about three minutes on two
cores); each check is its own test so a failure names the check.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.conformance import FAIL, PASS, SKIP, Battery, Check, _established, failed, render
from harness.errors import BrokerChaosError
from harness.host import Host

REPO = Path(__file__).resolve().parents[2]

REFERENCE_CHECKS = (
    "contract: attributes",
    "contract: client driver",
    "contract: capabilities",
    "contract: data_dir",
    "contract: recipe and node spec",
    "image: builds",
    "cluster: nodes start and form a cluster",
    "cluster: client port through the proxy",
    "data-dir: the broker writes there",
    "correctness: no faults, durable",
    "kill: applied, healed, broker recovers",
    "kill: the fault bit (its evidence)",
    "pause: applied, healed, broker recovers",
    "pause: the fault bit (its evidence)",
    "stop: applied, healed, broker recovers",
    "stop: the fault bit (its evidence)",
    "power-loss: applied, healed, broker recovers",
    "power-loss: lazyfs held unsynced broker data",
    "power-loss: the fault bit (its evidence)",
    "partition: applied, healed, broker recovers",
    "partition: the fault bit (its evidence)",
    "clock-skew: applied, healed, broker recovers",
    "clock-skew: the fault bit (its evidence)",
)


# -- no Docker -----------------------------------------------------------------------------


def test_contract_of_the_reference_plugin_passes() -> None:
    rows = Battery(Host.load(), "reference", only=["contract"]).run()
    assert [r.status for r in rows] == [PASS] * 5, render(rows, "reference")


def test_contract_names_what_a_plugin_declares_wrong() -> None:
    host = Host.load(["tests.conformance.broken_plugin"])
    rows = Battery(host, "broken-port", only=["contract", "cluster"]).run()
    by = {r.name: r for r in rows}
    assert by["contract: attributes"].status == FAIL
    assert "client_port must be a TCP port" in by["contract: attributes"].detail
    assert by["contract: attributes"].hint
    assert by["cluster"].status == SKIP and "contract" in by["cluster"].detail, (
        "no Docker work on a broken contract"
    )


def test_unknown_check_group_is_one_clear_error() -> None:
    with pytest.raises(BrokerChaosError, match="unknown check group.*choose from contract"):
        Battery(Host.load(), "reference", only=["contracts"])


def test_render_shows_result_detail_and_what_to_do() -> None:
    rows = [
        Check("contract: data_dir", PASS, "data_dir '/d'"),
        Check("data-dir: the broker writes there", FAIL, "holds no files", "point the config at data_dir"),
        Check("pause", SKIP, "the plugin does not declare 'pause'"),
    ]
    text = render(rows, "x")
    assert failed(rows) and not failed(rows[:1])
    line = next(x for x in text.splitlines() if x.startswith("data-dir"))
    assert "FAIL" in line and "holds no files" in line and "point the config at data_dir" in line
    assert "1 passed, 1 failed, 1 skipped: the plugin does not conform" in text
    assert "check" in text.splitlines()[2] and "what to do" in text.splitlines()[2]


def test_established_connections_parse_proc_net_tcp() -> None:
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:9D80 0C00007F:6469 01 00000000:00000000 00:00000000 00000000     0        0 1\n"
        "   1: 00000000:1628 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2\n"
    )
    assert _established(text) == [(("127.0.0.1", 40320), ("127.0.0.12", 25705))]


# -- Docker --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Check]:
    rows = Battery(Host.load(), "reference", store=tmp_path_factory.mktemp("conformance"), duration=5).run()
    print(render(rows, "reference"))
    return {r.name: r for r in rows}


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("check", REFERENCE_CHECKS)
def test_reference_plugin_conforms(reference_rows: dict[str, Check], check: str) -> None:
    assert check in reference_rows, f"check {check!r} did not run; ran: {sorted(reference_rows)}"
    row = reference_rows[check]
    assert row.status == PASS, f"{row.status}: {row.detail} -- {row.hint}"


@pytest.mark.docker
@pytest.mark.slow
def test_reference_inter_node_links_never_bypass_the_proxies(reference_rows: dict[str, Check]) -> None:
    row = reference_rows["cluster: inter-node links cross the proxies"]
    # Independent nodes (no inter-node traffic) are a skip; a connection around a proxy is a failure.
    assert row.status in (PASS, SKIP), row.detail


@pytest.mark.docker
@pytest.mark.slow
def test_validate_names_a_data_directory_the_broker_does_not_use(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [
            "brokerchaos",
            "-q",
            "-p",
            "tests.conformance.broken_plugin",
            "validate",
            "--plugin",
            "broken-datadir",
            "--only",
            "contract,data-dir,power-loss",
            "--duration",
            "4",
            "--store",
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = proc.stdout
    assert proc.returncode == 1, f"exit {proc.returncode}\n{out}\n{proc.stderr[-3000:]}"
    lines = out.splitlines()
    data_dir = next(x for x in lines if x.startswith("data-dir: the broker writes there"))
    assert "FAIL" in data_dir and "/var/lib/not-used" in out and "holds no files" in out
    assert "make data_dir" in out, "the row says what to do"
    lazy = next(x for x in lines if x.startswith("power-loss: lazyfs held"))
    assert "FAIL" in lazy and "nothing was ever written under /var/lib/not-used" in out
    assert next(x for x in lines if x.startswith("contract: data_dir")).split()[2] == "pass"
    assert "the plugin does not conform" in out
