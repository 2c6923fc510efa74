"""The lazy filesystem under concurrent requests (the model driven from several threads, no FUSE).

An fsync covers what was written before it started; writes that arrive while it is held go on
and stay unsynced; a power cut leaves exactly what the completed fsyncs covered.
"""

from __future__ import annotations

import errno
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults.lazyfs.model import LazyState
from tests.polling import until

#: A slow-fsync rule long enough that only a release (or a power cut) ever ends the wait.
HOLD = {"id": "slow", "kind": "slow-fsync", "glob": "*", "delay_ms": 60_000}


class Worker:
    """One thread issuing the model's calls in order, like one thread of a program."""

    def __init__(self, state: LazyState) -> None:
        self.state = state
        self.jobs: queue.Queue[tuple[Callable[[], Any], threading.Event, list[Any]] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            fn, done, out = job
            try:
                out.append(fn())
            except OSError as e:
                out.append(e)
            done.set()

    def submit(self, fn: Callable[[], Any]) -> tuple[threading.Event, list[Any]]:
        done, out = threading.Event(), []  # type: ignore[var-annotated]
        self.jobs.put((fn, done, out))
        return done, out

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join()


class Gated(LazyState):
    """The model with each held fsync released by the test instead of by its delay running out.

    Everything else is the model's own: the snapshot at entry, the wait with the lock released,
    the persist at the end, the power checks. Only ``_held`` (how long the wait lasts) differs.
    """

    def __init__(self, backing: str) -> None:
        super().__init__(backing)
        self.gates: dict[int, threading.Event] = {}

    def _held(self, rules: tuple[str, ...], deadline: float) -> bool:
        return not self.gates[threading.get_ident()].is_set()

    def release(self, ident: int) -> None:
        self.gates[ident].set()
        self.wake()


def _in_flight(state: LazyState) -> int:
    return len(state.status()["fsyncs_in_flight"])


def _more_in_flight(state: LazyState, than: int) -> bool:
    return _in_flight(state) > than


@contextmanager
def workers(state: LazyState, n: int) -> Iterator[list[Worker]]:
    ws = [Worker(state) for _ in range(n)]
    try:
        yield ws
    finally:
        state.halt()  # a test that failed may leave fsyncs held: the power cut ends them
        for w in ws:
            w.stop()


def _apply(buf: bytearray, kind: str, off: int, data: bytes) -> None:
    if kind == "w":
        if len(buf) < off:
            buf.extend(b"\0" * (off - len(buf)))
        buf[off : off + len(data)] = data
    else:
        del buf[off:]
        buf.extend(b"\0" * (off - len(buf)))


@settings(
    max_examples=120,
    # Each example starts threads and waits for them by polling: its duration is the machine's, not the code's.
    deadline=None,
    # The interleaving is drawn step by step; examples are small and fast to generate.
    suppress_health_check=[*settings().suppress_health_check, HealthCheck.too_slow],
)
@given(initial=st.binary(max_size=64), data=st.data())
def test_a_power_cut_leaves_exactly_what_the_completed_fsyncs_covered(
    tmp_path_factory: pytest.TempPathFactory, initial: bytes, data: st.DataObject
) -> None:
    backing = tmp_path_factory.mktemp("b")
    (backing / "f").write_bytes(initial)
    state = Gated(str(backing))
    state.disk.add(dict(HOLD))
    view = bytearray(initial)
    durable, durable_seq, seq = bytes(initial), 0, 0
    # fsyncs in flight: worker index -> (done event, result box, the view and op count at entry)
    held: dict[int, tuple[threading.Event, list[Any], bytes, int]] = {}
    try:
        with workers(state, 3) as ws:
            fh = state.open("/f")
            for _ in range(data.draw(st.integers(1, 25), label="steps")):
                idle = [i for i in range(len(ws)) if i not in held]
                choices = (["write", "truncate", "fsync"] if idle else []) + (["release"] if held else [])
                action = data.draw(st.sampled_from(choices), label="action")
                if action == "release":
                    i = data.draw(st.sampled_from(sorted(held)), label="release")
                    done, out, snap, snap_seq = held.pop(i)
                    state.release(ws[i].thread.ident or 0)
                    done.wait()
                    assert out == [None]
                    if snap_seq > durable_seq:  # an fsync that started earlier than the last one adds nothing
                        durable, durable_seq = snap, snap_seq
                    assert (backing / "f").read_bytes() == durable
                    continue
                i = data.draw(st.sampled_from(idle), label="thread")
                if action == "fsync":
                    ident = ws[i].thread.ident or 0
                    state.gates[ident] = threading.Event()
                    before = _in_flight(state)
                    done, out = ws[i].submit(partial(state.fsync, None, fh))
                    until(partial(_more_in_flight, state, before), "the fsync to be held", every=0.001)
                    held[i] = (done, out, bytes(view), seq)
                    continue
                if action == "write":
                    off = data.draw(st.integers(0, 120), label="offset")
                    chunk = data.draw(st.binary(min_size=1, max_size=40), label="bytes")
                    call: Callable[[], Any] = partial(state.write, fh, chunk, off)
                    op: tuple[str, int, bytes] = ("w", off, chunk)
                else:
                    off = data.draw(st.integers(0, 150), label="length")
                    call = partial(state.truncate, None, off, fh)
                    op = ("t", off, b"")
                # Another thread's write while fsyncs are held returns without waiting for them.
                done, out = ws[i].submit(call)
                done.wait()
                assert not isinstance(out[0], OSError), out
                _apply(view, *op)
                seq += 1
                assert state.read(fh, 1000, 0) == bytes(view)
            # The power cut: fsyncs still held fail and persist nothing; the disk is what completed.
            state.halt()
            for done, out, _, _ in held.values():
                done.wait()
                assert isinstance(out[0], OSError) and out[0].errno == errno.EIO
            state.crash()
            assert (backing / "f").read_bytes() == durable
            assert state.read(state.open("/f"), 1000, 0) == durable
    finally:
        state.close()


def test_a_write_during_a_slow_fsync_returns_first_and_a_power_cut_before_the_next_fsync_loses_it(
    tmp_path: Path,
) -> None:
    state = LazyState(str(tmp_path))
    try:
        fh = state.create("/log", 0o644, 0, 0)
        state.fsync("/", None)  # the name is durable
        state.write(fh, b"before\n", 0)
        state.disk.add(dict(HOLD))
        with workers(state, 1) as (w,):
            done, out = w.submit(lambda: state.fsync(None, fh))
            until(lambda: _in_flight(state) == 1, "the fsync to be held", every=0.001)
            assert state.write(fh, b"during\n", 7) == 7  # returned while the fsync is still held
            assert not done.is_set()
            assert state.read(fh, 100, 0) == b"before\nduring\n"
            state.disk.clear("slow")
            state.wake()
            done.wait()
        assert out == [None]
        assert (tmp_path / "log").read_bytes() == b"before\n"  # what it covered, not what came during it
        assert state.status()["files"][0]["writes"] == [[7, 7]]
        report = state.crash()  # the power cut before the next fsync
        assert report["dropped_bytes"] == 7
        assert state.read(state.open("/log"), 100, 0) == b"before\n"
    finally:
        state.close()


def test_a_power_cut_while_an_fsync_is_held_persists_nothing_of_it(tmp_path: Path) -> None:
    (tmp_path / "log").write_bytes(b"old")
    state = LazyState(str(tmp_path))
    try:
        fh = state.open("/log")
        state.write(fh, b"new", 3)
        state.disk.add(dict(HOLD))
        with workers(state, 1) as (w,):
            done, out = w.submit(lambda: state.fsync(None, fh))
            until(lambda: _in_flight(state) == 1, "the fsync to be held", every=0.001)
            halted = state.halt()
            assert [f["path"] for f in halted["fsyncs_failed"]] == ["/log"]
            done.wait()
        assert isinstance(out[0], OSError) and out[0].errno == errno.EIO
        with pytest.raises(OSError):
            state.fsync(None, fh)  # the power is off: no fsync persists any more
        with pytest.raises(OSError):
            state.flush()
        state.crash()  # and back on
        assert (tmp_path / "log").read_bytes() == b"old"
        state.disk.clear("slow")  # rules outlive a power cut: a slow disk is still slow after it
        assert not state.status()["halted"]
        fh = state.open("/log")
        state.write(fh, b"!", 3)
        state.fsync(None, fh)
        assert (tmp_path / "log").read_bytes() == b"old!"
    finally:
        state.close()


@pytest.mark.parametrize("names", ["strict", "journal", "xfs"])
def test_a_directory_fsync_covers_the_names_from_before_it_started(tmp_path: Path, names: str) -> None:
    state = LazyState(str(tmp_path), names=names)
    try:
        state.mkdir("/d", 0o755, 0, 0)
        state.mkdir("/e", 0o755, 0, 0)
        state.release(state.create("/d/a", 0o644, 0, 0))
        state.disk.add(dict(HOLD))
        with workers(state, 1) as (w,):
            done, out = w.submit(lambda: state.fsync("/d", None))
            until(lambda: _in_flight(state) == 1, "the directory fsync to be held", every=0.001)
            state.release(state.create("/d/b", 0o644, 0, 0))  # names made while it waits
            state.release(state.create("/e/c", 0o644, 0, 0))
            state.disk.clear("slow")
            state.wake()
            done.wait()
        assert out == [None]
        state.crash()
        got = {p for p, _ in state.walk()}
        # strict: only /d's names, and /d itself has no durable name (the root was not fsynced),
        # so everything under it is an orphan; journal: the commit holds every name from before.
        expected = {"/"} if names == "strict" else {"/", "/d", "/e", "/d/a"}
        assert got == expected
    finally:
        state.close()
