"""Where things live under a node cache root, and the small records kept there.

```
ROOT/models/<org>/<name>/<commit>/                  what vLLM reads (same layout as a store)
ROOT/models/<org>/<name>/<commit>/.k3a/manifest.json  the manifest the tuple binds (a copy)
ROOT/models/<org>/<name>/<commit>/.k3a/verified.json  what was verified, and how
ROOT/models/<org>/<name>/.<commit>.k3a-partial/       a pull in progress (hidden sibling):
    <path>                                            files verified so far
    .<basename>.part  .<basename>.part.json           a file being fetched, its done parts
    .k3a/verified.jsonl                               one line per file verified so far
ROOT/.k3a-cache/locks/<org>+<name>+<commit>.lock     per-revision flock (pull, evict)
ROOT/.k3a-cache/leases/<org>+<name>+<commit>.lease   shared flocks of running servers
ROOT/.k3a-cache/used/<org>+<name>+<commit>           mtime = last pull or lease (LRU)
```

The partial directory is renamed onto the final path only once every file in it is verified,
so a revision directory without ``verified.json`` never exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from k3artifacts.config import data_home
from k3artifacts.errors import ConfigError
from k3artifacts.revisions.manifest import MANIFEST_NAME, META_DIR, ShardManifest
from k3artifacts.revisions.refs import match_revision_ref

CACHE_ENV = "K3A_NODE_CACHE"
STATE_DIR = ".k3a-cache"
VERIFIED_NAME = "verified.json"
VERIFIED_LOG = "verified.jsonl"
PARTIAL_SUFFIX = ".k3a-partial"


def default_root() -> Path:
    """``$K3A_NODE_CACHE``, else a directory under the user's data home (tests, laptops)."""
    return Path(os.environ.get(CACHE_ENV) or data_home() / "node-cache")


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class VerifiedMarker(_Record):
    """``.k3a/verified.json``: the revision was checked byte for byte when it was pulled."""

    repo_id: str
    commit: str
    manifest_digest: str
    #: Digests every file was checked with as its bytes arrived (or when it was linked).
    algorithms: list[str]
    files: int
    bytes: int


class VerifiedFile(_Record):
    """One line of a partial revision's ``verified.jsonl``: a file checked and renamed in."""

    path: str
    size: int
    xxh3_128: str


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
    def __init__(self, root: Path):
        self.root = Path(root).absolute()
        self.models = self.root / "models"
        self.state = self.root / STATE_DIR

    def final_dir(self, rev: Revision) -> Path:
        return self.models.joinpath(*rev.repo_id.split("/"), rev.commit)

    def partial_dir(self, rev: Revision) -> Path:
        return self.models.joinpath(*rev.repo_id.split("/"), f".{rev.commit}{PARTIAL_SUFFIX}")

    def lock_file(self, rev: Revision) -> Path:
        return self.state / "locks" / f"{rev.key}.lock"

    def lease_file(self, rev: Revision) -> Path:
        return self.state / "leases" / f"{rev.key}.lease"

    def used_file(self, rev: Revision) -> Path:
        return self.state / "used" / rev.key

    def touch_used(self, rev: Revision) -> None:
        path = self.used_file(rev)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        os.utime(path)

    def last_used(self, rev: Revision) -> float:
        for path in (self.used_file(rev), self.final_dir(rev) / META_DIR / VERIFIED_NAME):
            try:
                return path.stat().st_mtime
            except FileNotFoundError:
                continue
        return 0.0

    def marker(self, rev: Revision) -> VerifiedMarker | None:
        path = self.final_dir(rev) / META_DIR / VERIFIED_NAME
        try:
            return VerifiedMarker.model_validate_json(path.read_bytes())
        except (FileNotFoundError, ValueError):
            return None

    def revisions(self) -> list[Revision]:
        """Complete revisions in the cache (their verified marker exists), sorted."""
        found = []
        if not self.models.is_dir():
            return found
        for marker in self.models.glob(f"*/*/*/{META_DIR}/{VERIFIED_NAME}"):
            commit_dir = marker.parent.parent
            if commit_dir.name.startswith("."):
                continue
            repo_id = f"{commit_dir.parent.parent.name}/{commit_dir.parent.name}"
            found.append(Revision(repo_id, commit_dir.name))
        return sorted(found, key=str)

    def manifest(self, rev: Revision) -> ShardManifest | None:
        try:
            raw = (self.final_dir(rev) / META_DIR / MANIFEST_NAME).read_bytes()
            return ShardManifest.parse(raw)
        except (FileNotFoundError, ValueError):
            return None
