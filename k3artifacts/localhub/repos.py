"""On-disk state of the local hub: content-addressed blobs, one index per commit, refs per repo.

Layout under the root::

    blobs/<sha256>                      file bytes, named by their sha256
    repos/<quoted repo id>/refs.json    {"branches": {name: commit}, "tags": {name: commit}}
    repos/<quoted repo id>/commits/<commit>.json

A repo path is only ever a key in a commit index, never part of a filesystem path, so a
listing may advertise hostile names (``../x``, ``/etc/passwd``) without the server touching them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

#: Patterns the real Hub's default .gitattributes sends to LFS (the ones a model repo uses).
LFS_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.pkl", "*.gguf")
#: Files above this size go to LFS whatever their name (the Hub rejects larger plain git blobs).
LFS_THRESHOLD = 10 * 1024 * 1024

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class Entry:
    """One file of a commit as the Hub describes it."""

    path: str
    size: int
    sha256: str
    git_oid: str  # git blob sha1: of the bytes, or of the LFS pointer for LFS files
    lfs: bool

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.sha256, self.size))

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_oid


@dataclass(frozen=True)
class Commit:
    id: str
    repo_id: str
    parent: str | None
    message: str
    date: str
    files: dict[str, Entry]


def lfs_pointer(sha256: str, size: int) -> bytes:
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs_by_default(path: str, size: int) -> bool:
    name = path.rsplit("/", 1)[-1]
    return size > LFS_THRESHOLD or any(fnmatch.fnmatchcase(name, p) for p in LFS_PATTERNS)


class RepoStore:
    """Blobs, commits and refs of every repo under one root. Thread-safe."""

    def __init__(self, root: Path):
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        (self.root / "repos").mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._commits: dict[str, Commit] = {}
        # (dev, inode, size, mtime_ns) -> (sha256, git sha1 of the bytes or None): re-adding the
        # same multi-GB file in a later revision must not hash it again.
        self._hashed: dict[tuple[int, int, int, int], tuple[str, str | None]] = {}

    # ----- blobs -----------------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def _put_bytes(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        dest = self.blob_path(sha)
        if not dest.exists():
            self._atomic_write(dest, data)
        return sha

    def _put_file(self, src: Path, *, want_sha1: bool) -> tuple[str, str | None, int]:
        st = src.stat()
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._hashed.get(key)
        if cached is None or (want_sha1 and cached[1] is None):
            h256 = hashlib.sha256()
            h1 = hashlib.sha1(b"blob %d\0" % st.st_size) if want_sha1 else None
            with open(src, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h256.update(chunk)
                    if h1 is not None:
                        h1.update(chunk)
            cached = (h256.hexdigest(), h1.hexdigest() if h1 is not None else None)
            self._hashed[key] = cached
        sha, sha1 = cached
        dest = self.blob_path(sha)
        if not dest.exists():
            try:
                # A hard link costs nothing for a multi-GB shard; the caller must not rewrite
                # the source in place afterwards (replacing it by a new file is fine).
                os.link(src, dest)
            except OSError:
                tmp = dest.with_name(f".{sha}.{os.getpid()}.{threading.get_ident()}.tmp")
                shutil.copyfile(src, tmp)
                os.replace(tmp, dest)
        return sha, sha1, st.st_size

    @staticmethod
    def _atomic_write(dest: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)

    # ----- repos, refs, commits --------------------------------------------------------------

    def _repo_dir(self, repo_id: str) -> Path:
        return self.root / "repos" / quote(repo_id, safe="")

    def repo_exists(self, repo_id: str) -> bool:
        return (self._repo_dir(repo_id) / "refs.json").exists()

    def refs(self, repo_id: str) -> dict[str, dict[str, str]]:
        p = self._repo_dir(repo_id) / "refs.json"
        with self._lock:
            if not p.exists():
                return {"branches": {}, "tags": {}}
            return json.loads(p.read_text())

    def _write_refs(self, repo_id: str, refs: dict[str, dict[str, str]]) -> None:
        d = self._repo_dir(repo_id)
        d.mkdir(parents=True, exist_ok=True)
        self._atomic_write(d / "refs.json", json.dumps(refs, indent=1, sort_keys=True).encode())

    def commit(self, repo_id: str, commit_id: str) -> Commit | None:
        with self._lock:
            c = self._commits.get(commit_id)
            if c is not None:
                return c if c.repo_id == repo_id else None
            p = self._repo_dir(repo_id) / "commits" / f"{commit_id}.json"
            if not p.exists():
                return None
            raw = json.loads(p.read_text())
            c = Commit(
                id=raw["id"],
                repo_id=raw["repo_id"],
                parent=raw["parent"],
                message=raw["message"],
                date=raw["date"],
                files={e["path"]: Entry(**e) for e in raw["files"]},
            )
            self._commits[commit_id] = c
            return c

    def resolve(self, repo_id: str, revision: str) -> str | None:
        """Branch, then tag, then full commit id; None when nothing matches."""
        refs = self.refs(repo_id)
        if revision in refs["branches"]:
            return refs["branches"][revision]
        if revision in refs["tags"]:
            return refs["tags"][revision]
        if _COMMIT_RE.match(revision) and self.commit(repo_id, revision) is not None:
            return revision
        return None

    def add_commit(
        self,
        repo_id: str,
        files: Mapping[str, bytes | Path],
        *,
        branch: str,
        lfs: bool | Collection[str] | None,
        message: str,
    ) -> str:
        entries: list[Entry] = []
        for path, content in files.items():
            if isinstance(content, bytes | bytearray):
                data = bytes(content)
                size = len(data)
                as_lfs = _decide_lfs(path, size, lfs)
                sha = self._put_bytes(data)
                sha1 = None if as_lfs else git_blob_sha1(data)
            else:
                src = Path(content)
                size = src.stat().st_size
                as_lfs = _decide_lfs(path, size, lfs)
                sha, sha1, size = self._put_file(src, want_sha1=not as_lfs)
            oid = git_blob_sha1(lfs_pointer(sha, size)) if as_lfs else sha1
            assert oid is not None
            entries.append(Entry(path=path, size=size, sha256=sha, git_oid=oid, lfs=as_lfs))
        entries.sort(key=lambda e: e.path)
        with self._lock:
            refs = self.refs(repo_id)
            parent = refs["branches"].get(branch)
            body = {
                "repo_id": repo_id,
                "parent": parent,
                "message": message,
                "files": [[e.path, e.sha256, e.size, e.lfs] for e in entries],
            }
            commit_id = hashlib.sha1(
                json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
            ).hexdigest()
            record = {
                "id": commit_id,
                "repo_id": repo_id,
                "parent": parent,
                "message": message,
                "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
                "files": [asdict(e) for e in entries],
            }
            cdir = self._repo_dir(repo_id) / "commits"
            cdir.mkdir(parents=True, exist_ok=True)
            self._atomic_write(cdir / f"{commit_id}.json", json.dumps(record, indent=1).encode())
            refs["branches"][branch] = commit_id
            self._write_refs(repo_id, refs)
            return commit_id

    def set_ref(self, repo_id: str, kind: str, name: str, commit_id: str) -> None:
        with self._lock:
            if self.commit(repo_id, commit_id) is None:
                raise KeyError(f"{repo_id}: no commit {commit_id}")
            refs = self.refs(repo_id)
            refs[kind][name] = commit_id
            self._write_refs(repo_id, refs)


def _decide_lfs(path: str, size: int, lfs: bool | Collection[str] | None) -> bool:
    if lfs is None:
        return is_lfs_by_default(path, size)
    if isinstance(lfs, bool):
        return lfs
    return path in lfs
