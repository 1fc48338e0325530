"""``k3a stage --repair``: put back the published files of a revision that fail verification.

A published revision is immutable, so re-staging it finds it published and does nothing. A
file damaged in the store afterwards (bit rot, a hand edit, a deleted object) is fetched again
from the Hub at the revision's commit, checked against the manifest's own sha256 and size
(not only the Hub's word), and handed to the store (:meth:`Store.repair_file`), which replaces
that file alone. The manifest is never rewritten: the revision keeps its digest, so every tuple
bound to it stays valid. A final full verification proves it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from k3artifacts.errors import VerifyMismatch
from k3artifacts.net.attempt import PermanentError
from k3artifacts.revisions.hashing import MultiHasher
from k3artifacts.staging.download import Expected, fetch
from k3artifacts.staging.hub import HubSource
from k3artifacts.stores.base import Store
from k3artifacts.stores.verify import verify_revision


@dataclass
class RepairResult:
    repo_id: str
    commit: str
    manifest_digest: str
    files: int
    #: Paths fetched again and put back, with what was wrong with each.
    repaired: dict[str, str] = field(default_factory=dict)
    downloaded_bytes: int = 0


def repair_revision(source: HubSource, store: Store, repo_id: str, commit: str,
                    workdir: Path, *, workers: int = 4,
                    on_file: Callable[[str, str], None] | None = None) -> RepairResult:
    """Re-hash every file (sha256); fetch and put back each one that fails; verify again."""
    manifest = store.published_manifest(repo_id, commit)
    before = verify_revision(store=store, repo_id=repo_id, commit=commit, full=True,
                             workers=workers)
    unrepairable = [p for p in before.problems if p.kind != "file"]
    if unrepairable:
        raise VerifyMismatch(
            f"{repo_id}@{commit} in {store.url}: "
            + "; ".join(f"{p.path}: {p.reason}" for p in unrepairable[:5]),
            hint="--repair puts back files the manifest lists; a different manifest or files "
            "it does not list need an investigation of the store, not a re-fetch")
    result = RepairResult(repo_id, commit, manifest.digest(), len(manifest.files))
    workdir.mkdir(parents=True, exist_ok=True)
    for problem in before.problems:
        record = manifest.file(problem.path)
        assert record is not None  # a "file" problem names a file of the manifest
        part = workdir / f"repair-{record.sha256}.part"
        try:
            hasher = fetch(source.file_url(repo_id, commit, record.path), source.headers(),
                           part, record.size, MultiHasher, policy=source.retry,
                           label=record.path,
                           expected=Expected(commit=commit, sha256=record.upstream_sha256))
        except PermanentError as exc:
            raise VerifyMismatch(f"{record.path}: the Hub cannot give it back: {exc}",
                                 hint="restore the file from a backup of the store") from None
        got = hasher.hexdigests()
        if (got.size, got.sha256) != (record.size, record.sha256):
            part.unlink(missing_ok=True)
            raise VerifyMismatch(
                f"{record.path}: the Hub now serves other bytes at {commit} (sha256 "
                f"{got.sha256}, {got.size} bytes; the manifest says {record.sha256}, "
                f"{record.size} bytes); nothing was put back",
                hint="restore the file from a backup of the store")
        store.repair_file(repo_id, commit, record, part)
        part.unlink()
        result.repaired[record.path] = problem.reason
        result.downloaded_bytes += record.size
        if on_file is not None:
            on_file(record.path, problem.reason)
    after = verify_revision(store=store, repo_id=repo_id, commit=commit, full=True,
                            expect_digest=result.manifest_digest, workers=workers)
    after.raise_for_problems()
    return result
