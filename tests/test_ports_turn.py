"""Each test process takes its ports in a turn of its own: two sessions at once do not walk one
worker's range in step."""

from __future__ import annotations

import subprocess
import sys

from tests.ports import _SPAN, _start, free_ports


def test_a_turn_covers_the_range_once_from_the_process_own_place() -> None:
    import tests.ports as ports

    seen = [next(ports._turn) for _ in range(_SPAN)]
    assert sorted(seen) == list(range(_start, _start + _SPAN))


def test_two_processes_begin_at_different_places() -> None:
    code = "from tests.ports import free_port; print(free_port())"
    firsts = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(3)
    }
    assert len(firsts) > 1, firsts
    assert len(set(free_ports(5))) == 5
