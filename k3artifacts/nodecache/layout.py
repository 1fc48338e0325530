"""Where things live under a node cache root, and the small records kept there.

```
ROOT/models/<org>/<name>/<commit>/                  what vLLM reads (same layout as a store)
ROOT/models/<org>/<name>/<commit>/.k3a/manifest.json  the manifest the tuple binds (a copy)
ROOT/models/<org>/<name>/<commit>/.k3a/verified.json  what was verified, and how
ROOT/models/<org>/<name>/.<commit>.k3a-partial/       a pull in progress (hidden sibling):
    <path>                                            files verified so far
    .<basename>.part  .<basename>.part.json           a file being fetched, its done parts
ROOT/.k3a-cache/locks/<org>+<name>+<commit>.lock     per-revision flock (pull, evict)
ROOT/.k3a-cache/leases/<org>+<name>+<commit>.lease   shared flocks of running servers
ROOT/.k3a-cache/used/<org>+<name>+<commit>           mtime = last pull or lease (LRU)
```

The partial directory is renamed onto the final path only once every file in it is verified,
so a revision directory without ``verified.json`` never exists. A finished revision is
read-only (files 0444, directories 0555). Nothing under ROOT is reached through a link
(:mod:`.safefs`).

Everything here is written by k3a and readable by the operator, but none of it is evidence for
k3a: the root is a hostPath other pods can write. ``verified.json`` says what a pull checked
(for ``k3a cache list`` and for people); a pull never trusts a file because a marker, a part
record or a file's size, mtime or inode says so, only because it hashed the bytes in that run
(:mod:`.onhand`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from k3artifacts.errors import ConfigError
from k3artifacts.nodecache import safefs
from k3artifacts.nodecache.safefs import Dir
from k3artifacts.revisions.manifest import MANIFEST_NAME, META_DIR, ShardManifest
from k3artifacts.revisions.refs import match_revision_ref
from k3artifacts.settings import default_node_cache

STATE_DIR = ".k3a-cache"
VERIFIED_NAME = "verified.json"
PARTIAL_SUFFIX = ".k3a-partial"


def default_root() -> Path:
    """``$K3A_NODE_CACHE``, else a directory under the user's data home (tests, laptops)."""
    return default_node_cache()


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class VerifiedMarker(BaseModel):
    """``.k3a/verified.json``: the revision was checked byte for byte by the pull that sealed
    it. What it tells an operator; a later pull hashes the files again all the same."""

    # Markers of older k3a also recorded each file's size, mtime and inode (then trusted on
    # a re-pull): read and ignored.
    model_config = ConfigDict(frozen=True, extra="ignore")

    repo_id: str
    commit: str
    manifest_digest: str
    #: Digests every file was checked with as its bytes arrived (or when it was linked).
    algorithms: list[str]
    files: int
    bytes: int


class PartsRecord(_Record):
    """``.<basename>.part.json``: which parts of a partial file are on disk (and synced)."""

    size: int
    xxh3_128: str
    part_size: int
    done: list[int]


@dataclass(frozen=True)
class Revision:
    repo_id: str
    commit: str

    @property
    def key(self) -> str:
        """A flat name for per-revision state files."""
        return f"{self.repo_id.replace('/', '+')}+{self.commit}"

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.commit}"


def parse_revision(text: str) -> Revision:
    ref = match_revision_ref(text)
    if ref is None:
        raise ConfigError(
            f"{text!r} is not org/name@<40-hex commit>",
            hint="list what the cache holds with `k3a cache list`",
        )
    return Revision(ref[0], ref[1])


class CacheLayout:
    """Paths (for messages and for other programs: vLLM, ``flock -s``) and their link-safe
    openings (:mod:`.safefs`), which k3a itself uses for everything under the root."""

    def __init__(self, root: Path):
        self.root = Path(root).absolute()
        self.models = self.root / "models"
        self.state = self.root / STATE_DIR

    def final_dir(self, rev: Revision) -> Path:
        return self.models.joinpath(*rev.repo_id.split("/"), rev.commit)

    def partial_dir(self, rev: Revision) -> Path:
        return self.models.joinpath(*rev.repo_id.split("/"), partial_name(rev.commit))

    def lock_file(self, rev: Revision) -> Path:
        return self.state / "locks" / f"{rev.key}.lock"

    def lease_file(self, rev: Revision) -> Path:
        return self.state / "leases" / f"{rev.key}.lease"

    def used_file(self, rev: Revision) -> Path:
        return self.state / "used" / rev.key

    def open_root(self, *, create: bool = True) -> Dir:
        return safefs.open_root(self.root, create=create)

    def repo_dir(self, rev: Revision, *, create: bool = False) -> Dir:
        """``models/<org>/<name>``, the parent of a revision's final and partial directories."""
        with self.open_root(create=create) as root:
            return root.walk(["models", *rev.repo_id.split("/")], create=create)

    def state_dir(self, kind: str, *, create: bool = True) -> Dir:
        with self.open_root(create=create) as root:
            return root.walk([STATE_DIR, kind], create=create)

    def state_file(self, kind: str, rev: Revision) -> tuple[str, str]:
        return kind, {"locks": f"{rev.key}.lock", "leases": f"{rev.key}.lease",
                      "used": rev.key}[kind]

    def open_state(self, kind: str, rev: Revision, flags: int) -> int:
        kind, name = self.state_file(kind, rev)
        with self.state_dir(kind, create=bool(flags & os.O_CREAT)) as d:
            return d.open(name, flags, 0o644)

    def touch_used(self, rev: Revision) -> None:
        fd = self.open_state("used", rev, os.O_WRONLY | os.O_CREAT)
        try:
            os.utime(fd)
        finally:
            os.close(fd)

    def _stat_state(self, rev: Revision) -> os.stat_result | None:
        try:
            with self.state_dir("used", create=False) as d:
                return d.lstat(rev.key)
        except FileNotFoundError:
            return None

    def last_used(self, rev: Revision) -> float:
        st = self._stat_state(rev)
        if st is not None:
            return st.st_mtime
        try:
            with self.final_meta(rev) as meta:
                st = meta.lstat(VERIFIED_NAME)
        except FileNotFoundError:
            return 0.0
        return st.st_mtime if st is not None else 0.0

    def final_meta(self, rev: Revision) -> Dir:
        with self.repo_dir(rev) as repo:
            return repo.walk([rev.commit, META_DIR])

    def _read_meta(self, rev: Revision, name: str) -> bytes | None:
        try:
            with self.final_meta(rev) as meta:
                return meta.read_bytes(name)
        except FileNotFoundError:
            return None

    def marker(self, rev: Revision) -> VerifiedMarker | None:
        raw = self._read_meta(rev, VERIFIED_NAME)
        try:
            return None if raw is None else VerifiedMarker.model_validate_json(raw)
        except ValueError:
            return None

    def _scan(self) -> Iterator[tuple[Revision, bool]]:
        """(revision, complete) for every final and partial revision directory; a link at
        an organisation, name or revision directory is refused."""
        try:
            with self.open_root(create=False) as root:
                models = root.walk(["models"])
        except FileNotFoundError:
            return
        with models:
            for org, st in sorted(models.entries()):
                if not stat.S_ISDIR(st.st_mode):
                    raise models.refuse(org)
                with models.sub(org) as org_dir:
                    for name, st in sorted(org_dir.entries()):
                        if not stat.S_ISDIR(st.st_mode):
                            raise org_dir.refuse(name)
                        with org_dir.sub(name) as repo:
                            for entry, st in sorted(repo.entries()):
                                if not stat.S_ISDIR(st.st_mode):
                                    raise repo.refuse(entry)
                                commit = commit_of_partial(entry)
                                if commit is not None:
                                    yield Revision(f"{org}/{name}", commit), False
                                elif not entry.startswith("."):
                                    yield Revision(f"{org}/{name}", entry), True

    def revisions(self) -> list[Revision]:
        """Complete revisions in the cache (their verified marker exists), sorted."""
        return sorted((rev for rev, complete in self._scan()
                       if complete and self.marker(rev) is not None), key=str)

    def partial_revisions(self) -> list[Revision]:
        """Revisions a pull started and did not finish (killed, or the disk filled)."""
        return sorted((rev for rev, complete in self._scan() if not complete), key=str)

    def manifest(self, rev: Revision) -> ShardManifest | None:
        raw = self._read_meta(rev, MANIFEST_NAME)
        try:
            return None if raw is None else ShardManifest.parse(raw)
        except ValueError:
            return None


def partial_name(commit: str) -> str:
    return f".{commit}{PARTIAL_SUFFIX}"


def commit_of_partial(name: str) -> str | None:
    if name.startswith(".") and name.endswith(PARTIAL_SUFFIX):
        return name[1:-len(PARTIAL_SUFFIX)]
    return None
