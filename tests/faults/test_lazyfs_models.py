"""The lazy filesystem's models (strict, ext4-ordered, xfs), driven directly (no FUSE).

Each case is a short program and what a power cut leaves under each model; the property test
draws programs over two durable directories and checks the filesystem against a plain reference
of each model's rules (``docs/explanation/filesystem-models.md``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults.lazyfs.model import ALIASES, MODELS, File, LazyState, model_name
from harness.spec.fault import FILESYSTEM_MODELS


@contextmanager
def fs(backing: Path, model: str) -> Iterator[LazyState]:
    state = LazyState(str(backing), names=model)
    try:
        yield state
    finally:
        state.close()


def _after_crash(state: LazyState) -> dict[str, bytes]:
    """Every file of the view after a power cut, with its content."""
    state.crash()
    out: dict[str, bytes] = {}
    for path, node in state.walk():
        if isinstance(node, File):
            fh = state.open(path)
            out[path] = state.read(fh, 1 << 20, 0)
            state.release(fh)
    return out


def _write_new(state: LazyState, path: str, data: bytes, *, fsync: bool) -> None:
    fh = state.create(path, 0o644, 0, 0)
    state.write(fh, data, 0)
    if fsync:
        state.fsync(None, fh)
    state.release(fh)


def test_the_harness_names_the_same_models() -> None:
    assert FILESYSTEM_MODELS == MODELS
    assert model_name("journal") == "ext4-ordered" == ALIASES["journal"]
    with pytest.raises(ValueError, match="filesystem model"):
        model_name("btrfs")


@pytest.mark.parametrize(
    ("model", "expected"),
    [("strict", {}), ("ext4-ordered", {"/d/seg": b"record"}), ("xfs", {"/d/seg": b"record"})],
)
def test_a_new_file_fsynced_without_its_directory(tmp_path: Path, model: str, expected: dict) -> None:
    """The classic bug: only strict loses the file; a journal commits its name with its fsync."""
    (tmp_path / "d").mkdir()
    with fs(tmp_path, model) as state:
        _write_new(state, "/d/seg", b"record", fsync=True)
        assert _after_crash(state) == expected


@pytest.mark.parametrize("model", MODELS)
def test_a_directory_fsync_names_a_file_whose_data_was_never_fsynced(tmp_path: Path, model: str) -> None:
    (tmp_path / "d").mkdir()
    with fs(tmp_path, model) as state:
        _write_new(state, "/d/f", b"unsynced", fsync=False)
        state.fsync("/d", None)
        assert _after_crash(state) == {"/d/f": b""}  # the name, not the data: an empty file


@pytest.mark.parametrize(("model", "expected"), [("strict", b"old"), ("ext4-ordered", b"new"), ("xfs", b"")])
def test_replace_by_rename_without_fsync(tmp_path: Path, model: str, expected: bytes) -> None:
    """ext4's auto_da_alloc writes the new file ahead of the rename; xfs does not: an empty file."""
    (tmp_path / "conf").write_bytes(b"old")
    with fs(tmp_path, model) as state:
        _write_new(state, "/conf.tmp", b"new", fsync=False)
        state.rename("/conf.tmp", "/conf")
        _write_new(state, "/wal", b"w", fsync=True)  # another file's fsync: a journal commit
        assert _after_crash(state)["/conf"] == expected


@pytest.mark.parametrize(("model", "kept"), [("strict", False), ("ext4-ordered", True), ("xfs", False)])
def test_an_fsync_of_an_unchanged_file_commits_names_only_on_ext4(
    tmp_path: Path, model: str, kept: bool
) -> None:
    """xfs forces its log only for a pinned inode: a file with nothing uncommitted forces nothing."""
    (tmp_path / "log").write_bytes(b"L")
    (tmp_path / "d").mkdir()
    with fs(tmp_path, model) as state:
        fh = state.open("/log")
        _write_new(state, "/d/new", b"", fsync=False)
        state.fsync(None, fh)  # /log has no change since the mount
        state.release(fh)
        assert ("/d/new" in _after_crash(state)) is kept


@pytest.mark.parametrize("model", ["ext4-ordered", "xfs"])
def test_an_fsync_of_a_written_file_commits_every_name_before_it(tmp_path: Path, model: str) -> None:
    (tmp_path / "log").write_bytes(b"L")
    (tmp_path / "d").mkdir()
    (tmp_path / "gone").write_bytes(b"G")
    with fs(tmp_path, model) as state:
        _write_new(state, "/d/new", b"data", fsync=False)
        state.unlink("/gone")
        state.rename("/d", "/e")
        fh = state.open("/log")
        state.write(fh, b"M", 1)
        state.fsync(None, fh)
        state.release(fh)
        _write_new(state, "/late", b"", fsync=False)  # after the commit: not in it
        assert _after_crash(state) == {"/log": b"LM", "/e/new": b""}


@pytest.mark.parametrize("model", ["ext4-ordered", "xfs"])
def test_a_name_made_after_the_commit_is_not_in_it(tmp_path: Path, model: str) -> None:
    (tmp_path / "d").mkdir()
    with fs(tmp_path, model) as state:
        _write_new(state, "/d/a", b"a", fsync=True)
        _write_new(state, "/d/b", b"b", fsync=False)
        assert _after_crash(state) == {"/d/a": b"a"}


def test_strict_unlink_and_rename_need_their_directories(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"A")
    (tmp_path / "b").write_bytes(b"B")
    (tmp_path / "log").write_bytes(b"")
    with fs(tmp_path, "strict") as state:
        state.unlink("/a")
        state.rename("/b", "/c")
        fh = state.open("/log")
        state.write(fh, b"x", 0)
        state.fsync(None, fh)  # a file's fsync: no name change is durable under strict
        state.release(fh)
        assert _after_crash(state) == {"/a": b"A", "/b": b"B", "/log": b"x"}
        state.unlink("/a")
        state.fsync("/", None)
        assert _after_crash(state) == {"/b": b"B", "/log": b"x"}


# -- the property: the filesystem against a reference of each model's rules ---------------------

DIRS = ("/a", "/b")
NAMES = ("x", "y", "z")
step = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
    st.tuples(st.just("write"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
    st.tuples(st.just("fsync"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
    st.tuples(st.just("fsyncdir"), st.sampled_from(DIRS), st.just("")),
    st.tuples(st.just("unlink"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
    st.tuples(
        st.just("rename"),
        st.tuples(st.sampled_from(DIRS), st.sampled_from(NAMES)),
        st.tuples(st.sampled_from(DIRS), st.sampled_from(NAMES)),
    ),
)


class Reference:
    """Each model's rules over a flat namespace: two durable directories holding files."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.view: dict[tuple[str, str], int] = {}  # (dir, name) -> file id
        self.data: dict[int, bytes] = {}
        self.durable_names: dict[tuple[str, str], int] = {}
        self.durable_data: dict[int, bytes] = {}
        self.seq = 0  # the journal sequence (xfs: what pins an object)
        self.committed = 0
        self.logged: dict[object, int] = {}
        self.next_id = 0

    def log(self, *objs: object) -> None:
        self.seq += 1
        for o in objs:
            self.logged[o] = self.seq

    def commit_if(self, obj: object) -> None:
        if self.model == "ext4-ordered" or (self.model == "xfs" and self.logged.get(obj, 0) > self.committed):
            self.durable_names = dict(self.view)
            self.committed = self.seq

    def create(self, d: str, n: str) -> None:
        if (d, n) not in self.view:
            self.next_id += 1
            self.view[(d, n)] = self.next_id
            self.data[self.next_id] = b""
            self.log(d, self.next_id)

    def write(self, d: str, n: str) -> None:
        f = self.view[(d, n)]
        self.data[f] += bytes([65 + f % 26])
        self.log(f)

    def fsync(self, d: str, n: str) -> None:
        f = self.view[(d, n)]
        self.commit_if(f)
        self.durable_data[f] = self.data[f]

    def fsyncdir(self, d: str) -> None:
        self.commit_if(d)
        if self.model == "strict":
            self.durable_names = {k: v for k, v in self.durable_names.items() if k[0] != d}
            self.durable_names.update({k: v for k, v in self.view.items() if k[0] == d})

    def unlink(self, d: str, n: str) -> None:
        f = self.view.pop((d, n))
        self.log(d, f)

    def rename(self, src: tuple[str, str], dst: tuple[str, str]) -> None:
        f = self.view[src]
        if src == dst:
            return
        old = self.view.get(dst)
        if old is not None:
            if self.model == "ext4-ordered":
                self.durable_data[f] = self.data[f]  # auto_da_alloc
            self.log(dst[0], old)
        del self.view[src]
        self.view[dst] = f
        self.log(src[0], dst[0], f)

    def after_crash(self) -> dict[str, bytes]:
        return {f"{d}/{n}": self.durable_data.get(f, b"") for (d, n), f in self.durable_names.items()}


@pytest.mark.parametrize("model", MODELS)
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(program=st.lists(step, max_size=30))
def test_a_power_cut_leaves_what_the_model_promises(tmp_path_factory, model: str, program) -> None:
    backing = tmp_path_factory.mktemp("m")
    for d in DIRS:
        (backing / d.lstrip("/")).mkdir()
    ref = Reference(model)
    with fs(backing, model) as state:
        for op, a, b in program:
            if op == "create":
                if (a, b) not in ref.view:
                    state.release(state.create(f"{a}/{b}", 0o644, 0, 0))
                ref.create(a, b)
            elif op == "fsyncdir":
                state.fsync(a, None)
                ref.fsyncdir(a)
            elif op == "rename":
                if a not in ref.view:
                    continue
                state.rename("/".join(a), "/".join(b))
                ref.rename(a, b)
            elif (a, b) in ref.view:
                path = f"{a}/{b}"
                if op == "unlink":
                    state.unlink(path)
                    ref.unlink(a, b)
                    continue
                fh = state.open(path)
                if op == "write":
                    before = ref.data[ref.view[(a, b)]]
                    ref.write(a, b)
                    state.write(fh, ref.data[ref.view[(a, b)]][len(before) :], len(before))
                else:
                    state.fsync(None, fh)
                    ref.fsync(a, b)
                state.release(fh)
        assert _after_crash(state) == ref.after_crash()
