"""The last head this client verified of each history of a store, kept beside its pinned root.

``$XDG_CONFIG_HOME/k3artifacts/trust/<first 32 hex of sha256(store URL)>.heads.json``::

    {"schema_version": 1, "store": "s3://bucket/k3a",
     "heads": {"channel production": {"seq": 120, "digest": "<sha256>"},
               "the store's policy": {"seq": 3, "digest": "<sha256>"}}}

The root's head is the pin itself (:mod:`.pins`). A reader passes the head it kept as
``last_seen`` (:func:`k3artifacts.trust.chain.verify_chain`): a history whose head went back,
that lost the entry kept, or that holds another entry there is refused
(:class:`~k3artifacts.errors.HistoryRewound`), and a history that went on is verified from the
kept head only. A head only moves forward here.

Same care as the pin (:func:`k3artifacts.trust.localfiles.problem`): whoever could write this
file could make this client forget what it saw. A file mounted read-only (a pod's ConfigMap:
the head its render saw) is read and never rewritten.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from k3artifacts.canonical import canonical_json
from k3artifacts.trust.chain import Mark
from k3artifacts.trust.localfiles import private_dir, read_store_file, write_replacing
from k3artifacts.trust.pins import pin_name, trust_dir


class Head(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int = Field(ge=1)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")


class Heads(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    store: str
    heads: dict[str, Head] = Field(default_factory=dict)

    def mark(self, history: str) -> Mark | None:
        head = self.heads.get(history)
        return None if head is None else Mark(head.seq, head.digest)


def heads_name(store_url: str) -> str:
    return pin_name(store_url).removesuffix(".json") + ".heads.json"


def heads_path(store_url: str) -> Path:
    return trust_dir() / heads_name(store_url)


def load_heads(store_url: str) -> Heads:
    """The heads this client verified of ``store_url``'s histories (none yet: empty)."""
    path = heads_path(store_url)
    heads = read_store_file(path, Heads, store_url, what="remembered heads", verb="are",
                            why="make this client forget what it verified",
                            hint=f"find out who wrote {path}; removing it makes this client "
                            "a fresh reader of the store again")
    return Heads(store=store_url) if heads is None else heads


def seen(store_url: str, history: str) -> Mark | None:
    return load_heads(store_url).mark(history)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Two k3a processes of one account reading different channels must not drop each
    # other's heads: the read-modify-write is serialized.
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remember(store_url: str, history: str, mark: Mark | None) -> None:
    """Keep ``mark`` as the head this client verified of ``history``, if it is ahead of the
    one kept. A place this account cannot write (a pod's read-only mount) keeps what it has."""
    if mark is None:
        return
    kept = seen(store_url, history)
    if kept is not None and kept.seq >= mark.seq:
        return
    path = heads_path(store_url)
    try:
        private_dir(path.parent)
        with _locked(path):
            heads = load_heads(store_url)
            before = heads.heads.get(history)
            if before is not None and before.seq >= mark.seq:
                return
            moved = Heads(store=store_url, heads={
                **heads.heads, history: Head(seq=mark.seq, digest=mark.digest)})
            write_replacing(path, canonical_json(moved) + b"\n", mode=0o644)
    except OSError:
        return


def config_map_files(store_url: str, heads: Heads) -> dict[str, str]:
    """``heads`` as ConfigMap data for a pod reading ``store_url``, beside its pin."""
    return {heads_name(store_url): canonical_json(
        Heads(store=store_url, heads=heads.heads)).decode() + "\n"}
