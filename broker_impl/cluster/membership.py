"""Who is a member of the cluster: the nodes this node talks to, changed by forget and join.

The ``[cluster]`` peers of the config are the address book: the nodes that may
be members and where to dial them. Which of them are members now is this
state, kept in ``<data_dir>/cluster_members.json`` so a restart does not bring
back a node the cluster forgot:

``epochs``
    name -> a counter, odd while the node is a member, even once it was
    forgotten. Forgetting moves a member to the next even number, admitting a
    node to the next odd one; two copies merge by taking the larger counter per
    name, so every node ends with the same members whatever order it heard of
    the changes in (a node that was on the other side of a partition while a
    node was forgotten learns it when the link comes back).
``join``
    the member this node asks to be admitted by when it starts (set by
    ``join_cluster``, cleared once it has heard the cluster's members).

A node's first start (no file) counts every peer of the address book and itself
as members. ``reset`` leaves it alone, a member of nothing but itself; the node
it joins admits it (its counter there goes to the next odd number) before it
sends the members, so the cluster's record of it as forgotten never wins.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from broker_impl.store.durable import write_file

FILE = "cluster_members.json"


class MembershipError(Exception):
    """The membership file cannot be read, or a change is not allowed."""


class Membership:
    """This node's copy of the cluster's members (see the module doc)."""

    def __init__(self, path: Path, me: str, epochs: Mapping[str, int], join: str | None = None) -> None:
        self.path = path
        self.me = me
        self.epochs = dict(epochs)
        self.join = join

    @classmethod
    def load(cls, data_dir: Path, me: str, founders: Iterable[str]) -> Membership:
        path = data_dir / FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path, me, {n: 1 for n in {me, *founders}})
        except (OSError, ValueError) as exc:
            raise MembershipError(f"cannot read {path}: {exc}") from None
        try:
            epochs = {str(n): int(e) for n, e in raw["epochs"].items()}
            join = raw.get("join")
        except (KeyError, TypeError, ValueError, AttributeError):
            raise MembershipError(
                f'{path}: not a membership file (expected {{"epochs": {{name: n}}}})'
            ) from None
        return cls(path, me, epochs, str(join) if join else None)

    @classmethod
    def reset(cls, data_dir: Path, me: str) -> Membership:
        """Alone: a member of nothing but itself until it joins a cluster."""
        m = cls(data_dir / FILE, me, {me: 1})
        m.save()
        return m

    def save(self) -> None:
        """Fsynced, file and directory: a power cut must not bring a forgotten node back, nor leave a
        torn file that stops the node from starting."""
        write_file(self.path, json.dumps({"epochs": self.epochs, "join": self.join}, sort_keys=True).encode())

    def members(self) -> list[str]:
        return sorted(n for n, e in self.epochs.items() if e % 2 == 1)

    def is_member(self, name: str) -> bool:
        return self.epochs.get(name, 0) % 2 == 1

    def alone(self) -> bool:
        return self.members() == [self.me]

    def forget(self, name: str) -> None:
        if not self.is_member(name):
            raise MembershipError(
                f"{name} is not a member of this cluster (members: {', '.join(self.members())})"
            )
        self.epochs[name] = _next(self.epochs[name], member=False)
        self.save()

    def admit(self, name: str) -> bool:
        """``name`` asked to join: a member from now on. False if it already was."""
        if self.is_member(name):
            return False
        self.epochs[name] = _next(self.epochs.get(name, 0), member=True)
        self.save()
        return True

    def merge(self, other: Mapping[str, int]) -> tuple[set[str], set[str]]:
        """Take a peer's copy in; return (nodes that became members, nodes that stopped being members)."""
        before = set(self.members())
        changed = False
        for name, epoch in other.items():
            if int(epoch) > self.epochs.get(name, 0):
                self.epochs[name] = int(epoch)
                changed = True
        if changed:
            self.save()
        after = set(self.members())
        return after - before, before - after

    def joined(self) -> None:
        """The node this one asked has admitted it and sent the members: no need to ask again."""
        if self.join is not None:
            self.join = None
            self.save()


def _next(epoch: int, *, member: bool) -> int:
    """The smallest counter above ``epoch`` that says member (odd) or forgotten (even)."""
    n = epoch + 1
    return n if (n % 2 == 1) == member else n + 1


def reset_node(data_dir: Path, me: str, keep: Iterable[str]) -> int:
    """``ctl reset`` (the app stopped): drop every queue, message and metadata record and the membership;
    the node is alone afterwards. ``keep``: the running node's own files (node.json, its control socket).
    Returns how many entries of the data dir were removed."""
    removed = 0
    for entry in data_dir.iterdir() if data_dir.is_dir() else ():
        if entry.name in set(keep):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed += 1
    Membership.reset(data_dir, me)
    return removed


def ask_to_join(data_dir: Path, me: str, seed: str, known: Iterable[str]) -> None:
    """``ctl join_cluster SEED`` (the app stopped): at its next start the node asks ``seed`` to admit it."""
    if seed == me:
        raise MembershipError(f"{me} cannot join itself; name a running member of the cluster to join")
    if seed not in set(known):
        raise MembershipError(
            f"{seed} is not in this node's [cluster] peers ({', '.join(sorted(known))}): it cannot be dialled"
        )
    m = Membership.load(data_dir, me, known)
    if not m.alone():
        raise MembershipError(
            f"{me} is clustered with {', '.join(n for n in m.members() if n != me)}; "
            "reset it first (ctl reset), then join"
        )
    m.join = seed
    m.save()
