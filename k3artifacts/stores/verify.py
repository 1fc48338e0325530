"""Re-verification of a published revision against its manifest.

What a node runs before an endpoint starts: xxh3-128 by default (~10x faster than sha256, so
the check costs about one read of the weights), sha256 with ``full=True``. Works on a store
key prefix (file tree or S3) or directly on a revision directory (an FSx mount, a node cache).
Files on a local disk are hashed at the machine's limit (:mod:`k3artifacts.revisions.parallel`:
one file per core, each byte read once); a remote store's files are streamed, several at once.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from k3artifacts.errors import NotFound, VerifyMismatch
from k3artifacts.revisions.hashing import MultiHasher, hash_stream
from k3artifacts.revisions.manifest import (
    MANIFEST_NAME,
    META_DIR,
    FileRecord,
    ShardManifest,
    revision_prefix,
)
from k3artifacts.revisions.parallel import FileToHash, Hashed, hash_files, usable_cores
from k3artifacts.stores.base import Store


@dataclass(frozen=True)
class Problem:
    path: str
    reason: str
    #: ``file`` (a file the manifest lists), ``extra`` (a file it does not list) or
    #: ``manifest`` (the manifest itself is not the one expected): counted apart.
    kind: str = "file"


@dataclass
class VerifyReport:
    target: str
    manifest_digest: str
    files: int
    bytes: int
    algorithm: str
    #: One per path, sorted, each with every reason found for that path.
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_for_problems(self) -> None:
        if not self.problems:
            return
        lines = "\n".join(f"  {p.path}: {p.reason}" for p in self.problems)
        if any(p.kind == "manifest" for p in self.problems):
            raise VerifyMismatch(
                f"{self.target}: not the expected revision:\n{lines}",
                hint="these are other weights than the ones expected (another commit, or a "
                "manifest changed in the store); check the path or revision given, and the "
                "tuple's manifest digest",
            )
        listed = sum(p.kind == "file" for p in self.problems)
        extra = sum(p.kind == "extra" for p in self.problems)
        parts = []
        if listed:
            parts.append(f"{listed} of {self.files} file(s) do not match the manifest")
        if extra:
            parts.append(f"{extra} file(s) not in the manifest")
        raise VerifyMismatch(f"{self.target}: {', '.join(parts)}:\n{lines}")


#: Files streamed at once from a remote store by default, whatever the core count.
REMOTE_STREAMS = 4

NOT_PUBLISHED_HINT = "stage it first with `k3a stage`, or check the commit"


class _Reader:
    """Opens the bytes of a revision's files, from a directory or through a store."""

    def __init__(self, directory: Path | None = None, store: Store | None = None,
                 revision: tuple[str, str] = ("", "")):
        self.directory, self.store = directory, store
        self.revision = revision
        self.prefix = revision_prefix(*revision) if store is not None else ""
        #: Where each file's bytes live (a revision may read objects it shares with another).
        self.records = store.object_records(*revision) if store is not None else {}

    def manifest_bytes(self) -> bytes:
        if self.directory is not None:
            path = self.directory / META_DIR / MANIFEST_NAME
            try:
                return path.read_bytes()
            except FileNotFoundError:
                raise NotFound(
                    f"{path} not found: not a published revision directory",
                    hint="point at models/<org>/<name>/<commit> of a store",
                ) from None
        return self.store.published_manifest_bytes(*self.revision, hint=NOT_PUBLISHED_HINT)

    def local_file(self, record: FileRecord) -> FileToHash:
        path = self.directory.joinpath(*record.path.split("/"))

        def open_file() -> int:
            # Non-blocking: a FIFO planted at the path must not hang the check.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(f"{path} is not a regular file")
            return fd

        return FileToHash(record.path, record.size, open_file)

    def digest(self, record: FileRecord, hasher: MultiHasher, on_bytes) -> MultiHasher:
        with self.store.open_file(*self.revision, record.path, self.records) as fh:
            read_into = getattr(fh, "readinto", None) or _readinto_from_read(fh)
            return hash_stream(read_into, hasher, on_bytes)

    def extra_files(self, manifest: ShardManifest) -> list[str]:
        listed = {r.path for r in manifest.files}
        if self.directory is not None:
            present = []
            for dirpath, _, filenames in os.walk(self.directory):
                rel = Path(dirpath).relative_to(self.directory).as_posix()
                if rel == META_DIR or rel.startswith(META_DIR + "/"):
                    continue
                present += [name if rel == "." else f"{rel}/{name}" for name in filenames]
        else:
            start = len(self.prefix) + 1
            present = [k[start:] for k in self.store.list_keys(self.prefix + "/")]
        return sorted(p for p in present if p not in listed and not p.startswith(META_DIR + "/"))


def _readinto_from_read(fh) -> Callable[[memoryview], int]:
    def read_into(view: memoryview) -> int:
        data = fh.read(len(view))
        view[: len(data)] = data
        return len(data)

    return read_into


def verify_revision(
    *,
    store: Store | None = None,
    repo_id: str | None = None,
    commit: str | None = None,
    directory: Path | None = None,
    full: bool = False,
    expect_digest: str | None = None,
    workers: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    on_manifest: Callable[[ShardManifest], None] | None = None,
    on_file: Callable[[FileRecord], None] | None = None,
    leave: Callable[[FileRecord], bool] | None = None,
) -> VerifyReport:
    """Hash every file of a published revision and compare with its manifest.

    ``leave``: files the caller hashes itself as it reads them (the verified loader,
    :mod:`k3artifacts.loading`); they are neither read nor reported here.

    ``workers``: files hashed at once (default: one per usable core on a local disk, at least
    :data:`REMOTE_STREAMS` from a remote store). ``on_bytes`` sees bytes as they are hashed,
    ``on_file`` each file once checked (for progress), ``on_manifest`` the manifest before any
    file is read."""
    raw = None
    if directory is not None:
        reader = _Reader(directory=Path(directory))
        target = str(directory)
    else:
        local = store.local_path(revision_prefix(repo_id, commit))
        if local is not None:
            # Read through the store: "not published" is then said in the store's terms (the
            # operator named a revision, not a path).
            raw = store.published_manifest_bytes(repo_id, commit, hint=NOT_PUBLISHED_HINT)
            reader = _Reader(directory=local)
        else:
            reader = _Reader(store=store, revision=(repo_id, commit))
        target = f"{repo_id}@{commit} in {store.url}"
    if raw is None:
        raw = reader.manifest_bytes()
    manifest = ShardManifest.parse(raw, f"the manifest of {target}")
    digest = manifest.digest()
    algorithm = "sha256" if full else "xxh3-128"
    report = VerifyReport(target, digest, len(manifest.files), manifest.total_bytes, algorithm)
    if expect_digest is not None and not manifest.answers_to(expect_digest):
        report.problems.append(
            Problem(
                f"{META_DIR}/{MANIFEST_NAME}",
                f"digest {digest}, expected {expect_digest}",
                kind="manifest",
            )
        )
        return report
    if on_manifest is not None:
        on_manifest(manifest)

    check = _check_local if reader.directory is not None else _check_remote
    hashed = manifest if leave is None else manifest.model_copy(
        update={"files": [r for r in manifest.files if not leave(r)]})
    report.problems += check(reader, hashed, full, workers, on_bytes, on_file)
    if reader.store is not None:
        # Read through the object records, the bytes are the versions recorded at
        # publication; a server reading the prefix itself (HyperPod's s3Storage, a mount)
        # gets what is current there, which an insider may have replaced since.
        # A file read by reference from another revision's objects is not under the prefix
        # until a tuple materializes it: nothing is served there to be replaced yet.
        served = store.check_served(repo_id, commit, manifest)
        report.problems += [
            Problem(path, f"as served where the revision is placed: {why}")
            for path, why in served.items()
            if (record := reader.records.get(path)) is None
            or record.key == f"{reader.prefix}/{path}"]
    for extra in reader.extra_files(manifest):
        report.problems.append(Problem(extra, "not in the manifest", kind="extra"))
    report.problems = _one_per_path(report.problems)
    return report


def _one_per_path(problems: list[Problem]) -> list[Problem]:
    """A file can fail twice (its bytes, and what is served where the revision is placed);
    every reader of the report (the count in :meth:`VerifyReport.raise_for_problems`, the
    files ``--repair`` fetches, the gates) wants it once, with every reason."""
    by_path: dict[str, list[Problem]] = {}
    for problem in problems:
        by_path.setdefault(problem.path, []).append(problem)
    # One path is one kind: an extra file is one the manifest does not list.
    return [Problem(path, "; ".join(p.reason for p in found), found[0].kind)
            for path, found in sorted(by_path.items())]


def _compare(record: FileRecord, full: bool, size: int, got: str | None) -> Problem | None:
    if size != record.size:
        return Problem(record.path, f"size {size}, manifest says {record.size}")
    want = record.sha256 if full else record.xxh3_128
    if got != want:
        return Problem(record.path, f"{'sha256' if full else 'xxh3-128'} {got}, manifest says "
                       f"{want}")
    return None


def _check_local(reader: _Reader, manifest: ShardManifest, full: bool, workers: int | None,
                 on_bytes, on_file) -> list[Problem]:
    """Files on a local disk: at the machine's hashing limit."""
    records = {r.path: r for r in manifest.files}

    def hashed(result: Hashed) -> None:
        if on_file is not None:
            on_file(records[result.key])

    results = hash_files([reader.local_file(r) for r in manifest.files],
                         "sha256" if full else "xxh3-128", workers=workers, on_bytes=on_bytes,
                         on_hashed=hashed)
    problems = []
    for record in manifest.files:
        result = results[record.path]
        problem = Problem(record.path, result.error) if result.error is not None else \
            _compare(record, full, result.size, result.digest)
        if problem is not None:
            problems.append(problem)
    return problems


def _check_remote(reader: _Reader, manifest: ShardManifest, full: bool, workers: int | None,
                  on_bytes, on_file) -> list[Problem]:
    """Files read through a remote store, several streams at once."""

    def check(record: FileRecord) -> Problem | None:
        hasher = MultiHasher(sha256=full, xxh3=not full)
        try:
            digests = reader.digest(record, hasher, on_bytes).hexdigests()
        except (FileNotFoundError, NotFound):
            problem = Problem(record.path, "missing")
        except OSError as exc:
            problem = Problem(record.path, f"unreadable: {exc}")
        else:
            problem = _compare(record, full, digests.size,
                               digests.sha256 if full else digests.xxh3_128)
        if on_file is not None:
            on_file(record)
        return problem

    # A stream waits on the network more than on a core: at least REMOTE_STREAMS of them.
    streams = workers or max(REMOTE_STREAMS, usable_cores())
    with ThreadPoolExecutor(streams, thread_name_prefix="k3a-verify") as pool:
        return [p for p in pool.map(check, manifest.files) if p is not None]
