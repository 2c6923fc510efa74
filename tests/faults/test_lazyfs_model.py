"""The lazy filesystem's state machine, driven directly (no FUSE): what a crash keeps and drops."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from faults.lazyfs.model import STATE_DIR, File, LazyState

ops = st.lists(
    st.one_of(
        st.tuples(st.just("w"), st.integers(0, 300), st.binary(min_size=1, max_size=80)),
        st.tuples(st.just("t"), st.integers(0, 400), st.just(b"")),
        st.tuples(st.just("s"), st.just(0), st.just(b"")),
    ),
    max_size=40,
)


def _names(state: LazyState, path: str) -> list[str]:
    return sorted(n for n, _, _ in state.readdir(path, None) if n not in (".", ".."))


def _apply(buf: bytearray, kind: str, off: int, data: bytes) -> None:
    if kind == "w":
        if len(buf) < off:
            buf.extend(b"\0" * (off - len(buf)))
        buf[off : off + len(data)] = data
    elif kind == "t":
        del buf[off:]
        buf.extend(b"\0" * (off - len(buf)))


@settings(max_examples=150, deadline=None)
@given(initial=st.binary(max_size=200), script=ops)
def test_view_and_crash_match_a_plain_byte_model(tmp_path_factory, initial: bytes, script) -> None:
    backing = tmp_path_factory.mktemp("b")
    (backing / "f").write_bytes(initial)
    state = LazyState(str(backing))
    try:
        fh = state.open("/f")
        view = bytearray(initial)
        durable = bytes(initial)
        for kind, off, data in script:
            if kind == "s":
                state.fsync(None, fh)
                durable = bytes(view)
                assert (backing / "f").read_bytes() == durable
                continue
            if kind == "w":
                state.write(fh, data, off)
            else:
                state.truncate(None, off, fh)
            _apply(view, kind, off, data)
            assert state.read(fh, 1000, 0) == bytes(view)
            assert state.getattr(None, fh)["st_size"] == len(view)
        for off in (0, 7, 150):
            assert state.read(fh, 60, off) == bytes(view[off : off + 60])
        state.release(fh)
        report = state.crash()
        assert state.read(state.open("/f"), 1000, 0) == durable
        assert (backing / "f").read_bytes() == durable
        if bytes(view) == durable and not report["dropped_data"]:
            assert report["dropped_bytes"] == 0
    finally:
        state.close()


@settings(max_examples=100, deadline=None)
@given(
    synced=st.binary(max_size=100),
    writes=st.lists(st.binary(min_size=1, max_size=50), max_size=8),
    seed=st.integers(0, 99),
)
def test_torn_keeps_a_seeded_prefix_of_the_unsynced_appends(tmp_path_factory, synced, writes, seed) -> None:
    results = []
    for _ in range(2):
        backing = tmp_path_factory.mktemp("b")
        (backing / "log").write_bytes(synced)
        state = LazyState(str(backing))
        try:
            fh = state.open("/log")
            for w in writes:
                state.write(fh, w, state.getattr(None, fh)["st_size"])
            report = state.torn(seed)
            content = (backing / "log").read_bytes()
            full = synced + b"".join(writes)
            assert full.startswith(content) and content.startswith(synced)
            kept = report["torn"][0]["kept_bytes"] if writes else 0
            assert len(content) == len(synced) + kept
            assert state.read(state.open("/log"), 10_000, 0) == content
            results.append(content)
        finally:
            state.close()
    assert results[0] == results[1]


def test_names_become_durable_only_with_a_directory_fsync(tmp_path: Path) -> None:
    state = LazyState(str(tmp_path))
    try:
        fh = state.create("/new", 0o644, os.getuid(), os.getgid())
        state.write(fh, b"data", 0)
        state.fsync(None, fh)  # data is durable, the name is not
        assert not (tmp_path / "new").exists()
        assert (tmp_path / STATE_DIR / os.listdir(tmp_path / STATE_DIR)[0]).read_bytes() == b"data"
        state.release(fh)
        report = state.crash()
        assert report["names_lost"] == ["/new"]
        assert _names(state, "/") == []
        assert os.listdir(tmp_path / STATE_DIR) == []  # parked orphans are cleaned like on a real fs

        state.mkdir("/d", 0o755, 0, 0)
        state.mkdir("/d/e", 0o755, 0, 0)
        fh = state.create("/d/e/f", 0o600, 0, 0)
        state.write(fh, b"x" * 10, 0)
        state.fsync("/d/e", None)  # the parent chain is not durable: the dir is parked
        state.fsync(None, fh)
        state.fsync("/d", None)
        state.fsync("/", None)
        state.release(fh)
        state.crash()
        assert (tmp_path / "d/e/f").read_bytes() == b"x" * 10
        assert isinstance(state.resolve("/d/e/f"), File)
    finally:
        state.close()


def test_renames_and_unlinks_of_durable_files(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"A")
    (tmp_path / "b").write_bytes(b"B")
    (tmp_path / "sub").mkdir()
    state = LazyState(str(tmp_path))
    try:
        state.rename("/a", "/sub/a2")  # new parent synced, old one not: both names durable
        state.fsync("/sub", None)
        state.unlink("/b")
        state.crash()
        assert _names(state, "/") == ["a", "b", "sub"]
        assert _names(state, "/sub") == ["a2"]

        state.rename("/a", "/b")  # replace b; only the root is fsynced
        state.fsync("/", None)
        state.crash()
        assert _names(state, "/") == ["b", "sub"]
        assert state.read(state.open("/b"), 10, 0) == b"A"

        state.rename("/b", "/sub/moved")  # b loses its only durable name while still alive: parked, not lost
        state.fsync("/", None)
        assert not (tmp_path / "b").exists()
        state.fsync("/sub", None)
        assert (tmp_path / "sub/moved").read_bytes() == b"A"
        assert os.listdir(tmp_path / STATE_DIR) == []
    finally:
        state.close()
