"""The staging plan: for each file of a revision, whether its bytes must come from the Hub.

Made after the listing and before any byte moves. A file is

* ``present`` when it is already verified in this revision's quarantine (or already handed to
  the store-side revision by an earlier, interrupted run);
* ``reuse`` when a published revision of the same repo holds the same content: the listing's
  upstream hash (LFS sha256, or git blob id for a small file) and size equal those recorded for
  a file of that revision's manifest, which staging verified when it downloaded it. The store
  copies it inside itself (:meth:`RevisionWriter.reuse`), never through this machine;
* ``download`` otherwise, and when a reuse fails its check (the run says so).

Only ``download`` files become per-file jobs. ``k3a stage --plan`` prints a plan without
running it; the Prefect flows show it as an artifact before any transfer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from k3artifacts.revisions.manifest import FileRecord, ShardManifest
from k3artifacts.staging.hub import RemoteFile
from k3artifacts.staging.quarantine import VerifiedEntry
from k3artifacts.staging.rules import file_kind
from k3artifacts.stores.revisions import RevisionStore

Action = Literal["download", "reuse", "present"]
ACTIONS: tuple[Action, ...] = ("download", "reuse", "present")


class ContentIndex:
    """Files of the published revisions of one repo, by the content the Hub lists for them."""

    def __init__(self) -> None:
        self._by_sha256: dict[tuple[str, int], tuple[str, FileRecord]] = {}
        self._by_git_oid: dict[tuple[str, int], tuple[str, FileRecord]] = {}

    @classmethod
    def of_store(cls, store: RevisionStore, repo_id: str, exclude_commit: str) -> ContentIndex:
        index = cls()
        # Newest commits are not known by name; any published copy of the bytes will do, and
        # a source that vanishes before it is copied only turns that file into a download.
        for commit in store.list_revisions(repo_id):
            if commit == exclude_commit:
                continue
            manifest = store.read_manifest(repo_id, commit)
            if manifest is not None:  # deleted between the listing and the read
                index.add(manifest)
        return index

    def add(self, manifest: ShardManifest) -> None:
        for record in manifest.files:
            found = (manifest.commit, record)
            # sha256 is what staging computed and held to the upstream hash: the content's.
            self._by_sha256.setdefault((record.sha256, record.size), found)
            if record.upstream_git_oid:
                self._by_git_oid.setdefault((record.upstream_git_oid, record.size), found)

    def find(self, remote: RemoteFile) -> tuple[str, FileRecord] | None:
        """(commit, record) of a published file with ``remote``'s upstream hash and size."""
        if remote.lfs_sha256:
            return self._by_sha256.get((remote.lfs_sha256, remote.size))
        if remote.git_oid:
            return self._by_git_oid.get((remote.git_oid, remote.size))
        return None


class PlannedFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    size: int
    action: Action
    #: ``reuse``: the published revision holding the same bytes, and their path there.
    source_commit: str | None = None
    source_path: str | None = None
    #: ``reuse``: what that revision's manifest records for them (not shown in a plan).
    source_record: FileRecord | None = Field(default=None, exclude=True)


class PlanTotal(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    files: int = 0
    bytes: int = 0


class StagePlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    repo_id: str
    commit: str
    #: The revision is published already: a run does nothing.
    already_published: bool = False
    files: list[PlannedFile]
    #: The Hub's listing the plan was made from, rules checked: what the run fetches from
    #: (not shown in a plan).
    listing: list[RemoteFile] = Field(default_factory=list, exclude=True)
    #: The published revisions' files the plan looked its reuses up in (not shown in a plan):
    #: the run plans again under its lock from the same index rather than reading every
    #: manifest of the repo a second time. A source retired meanwhile fails its reuse's check,
    #: and that file is downloaded.
    index: ContentIndex | None = Field(default=None, exclude=True)

    def of(self, action: Action) -> list[PlannedFile]:
        return [f for f in self.files if f.action == action]

    def totals(self) -> dict[str, PlanTotal]:
        return {
            action: PlanTotal(
                files=len(self.of(action)), bytes=sum(f.size for f in self.of(action))
            )
            for action in ACTIONS
        }

    def summary(self) -> dict[str, dict[str, int]]:
        """Files and bytes per action, as plain values (results, JSON, artifacts)."""
        return {action: total.model_dump() for action, total in self.totals().items()}

    def describe(self) -> str:
        t = self.totals()
        return (
            f"download {t['download'].files} file(s), {t['download'].bytes:,} bytes from the Hub;"
            f" reuse {t['reuse'].files} file(s), {t['reuse'].bytes:,} bytes from published "
            f"revisions; {t['present'].files} file(s), {t['present'].bytes:,} bytes already here"
        )


def matches_listing(record: FileRecord, remote: RemoteFile) -> bool:
    """``record`` (a verified file) is the file the Hub lists as ``remote``."""
    return (
        record.size == remote.size
        and record.upstream_sha256 == remote.lfs_sha256
        and record.upstream_git_oid == remote.git_oid
    )


def plan_files(
    repo_id: str,
    commit: str,
    files: Iterable[RemoteFile],
    verified: dict[str, VerifiedEntry],
    index: ContentIndex,
    still_stored: Callable[[FileRecord], bool] | None = None,
) -> StagePlan:
    """Plan each listed file. ``still_stored`` confirms that a file an earlier run handed to the
    store-side revision (and dropped locally) is still there; without it (a dry plan, which
    opens no writer) such a file counts as present and the run re-checks it."""
    listing = list(files)
    planned = []
    for f in listing:
        entry = verified.get(f.path)
        if entry is not None and matches_listing(entry.record, f) and (
            not entry.stored or still_stored is None or still_stored(entry.record)
        ):
            planned.append(PlannedFile(path=f.path, size=f.size, action="present"))
            continue
        found = index.find(f)
        if found is not None:
            source_commit, record = found
            planned.append(PlannedFile(
                path=f.path, size=f.size, action="reuse", source_commit=source_commit,
                source_path=record.path, source_record=record,
            ))
            continue
        planned.append(PlannedFile(path=f.path, size=f.size, action="download"))
    return StagePlan(repo_id=repo_id, commit=commit, files=planned, listing=listing,
                     index=index)


def reused_record(remote: RemoteFile, planned: PlannedFile) -> FileRecord:
    """The record of ``remote`` in the new revision, its bytes taken from ``planned``'s source:
    digests from the source's record, upstream hashes from this listing, provenance set."""
    source = planned.source_record
    assert source is not None and planned.source_commit is not None
    kind = file_kind(remote.path)
    return source.model_copy(update={
        "path": remote.path,
        "kind": kind,
        "upstream_sha256": remote.lfs_sha256,
        "upstream_git_oid": remote.git_oid,
        "safetensors": source.safetensors if kind == "weights" else None,
        "source": "reused",
        "reused_from": planned.source_commit,
    })
