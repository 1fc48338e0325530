"""The store: where published revisions and release records live.

Implementations: :mod:`.file` (a POSIX tree: local disk or an FSx mount) and :mod:`.s3`;
:func:`k3artifacts.stores.registry.open_store` picks one from a URL. Two kinds of content share
one key space (docs/architecture.md, "Storage layout"), each behind its own interface:

* :class:`~.records.RecordStore`: small records (tuples, channel pointers, history), written
  with ``create`` (exclusive: never overwrites) or ``replace`` (compare-and-swap on a version
  token). What ``policy/``, ``releases/`` and the record gates are typed against.
* :class:`~.revisions.RevisionStore`: revisions, ``models/<org>/<name>/<commit>/...``, large,
  written once through a :class:`~.revisions.RevisionWriter` and visible only once complete
  (``.k3a/manifest.json`` exists). What ``staging/`` is typed against.

:class:`Store` is both, and holds what the revision side does with records (a manifest is a
record under the revision's prefix). The revision types are defined in :mod:`.revisions` and
named here too, where their importers have always found them.
"""

from __future__ import annotations

from k3artifacts.revisions.manifest import (
    META_DIR,
    Provenance,
    ShardManifest,
    manifest_key,
    provenance_key,
    revision_prefix,
)
from k3artifacts.stores.records import RecordStore, Versioned
from k3artifacts.stores.revisions import (
    OBJECT_RECORDS_NAME,
    OBJECT_RECORDS_REL,
    SMALL_FILE,
    NotPublished,
    ObjectRecord,
    Placement,
    ProgressCallback,
    PutReceipt,
    RangeReader,
    ReuseFailed,
    RevisionStore,
    RevisionWriter,
    ShortRead,
    Sink,
    StreamedPut,
    receipt_stats,
)

__all__ = [
    "OBJECT_RECORDS_NAME", "OBJECT_RECORDS_REL", "SMALL_FILE", "NotPublished", "ObjectRecord",
    "Placement", "ProgressCallback", "PutReceipt", "RangeReader", "RecordStore", "ReuseFailed",
    "RevisionStore", "RevisionWriter", "ShortRead", "Sink", "Store", "StreamedPut", "Versioned",
    "receipt_stats",
]


class Store(RecordStore, RevisionStore):
    """A record store and a revision store over one key space (what ``open_store`` returns).

    Subclasses implement the record methods and the revision methods that touch bytes; the
    manifest and metadata reads and writes below go through the record methods."""

    url: str

    def add_to_revision(self, repo_id: str, commit: str, rel: str, data: bytes) -> None:
        self.published_manifest_bytes(repo_id, commit)
        self.create(f"{revision_prefix(repo_id, commit)}/{rel}", data)

    def list_revisions(self, repo_id: str) -> list[str]:
        suffix = f"/{META_DIR}/manifest.json"
        prefix = f"models/{repo_id}/"
        return sorted(
            key[len(prefix) : -len(suffix)]
            for key in self.list_keys(prefix)
            if key.endswith(suffix) and "/" not in key[len(prefix) : -len(suffix)]
        )

    def read_manifest(self, repo_id: str, commit: str) -> ShardManifest | None:
        key = manifest_key(repo_id, commit)
        found = self.read(key)
        return None if found is None else ShardManifest.parse(
            found.data, f"{self.url.rstrip('/')}/{key}")

    def read_provenance(self, repo_id: str, commit: str) -> Provenance | None:
        found = self.read(provenance_key(repo_id, commit))
        return None if found is None else Provenance.parse(found.data)

    def published_manifest_bytes(self, repo_id: str, commit: str, *,
                                 hint: str | None = None) -> bytes:
        found = self.read(manifest_key(repo_id, commit))
        if found is None:
            raise NotPublished(repo_id, commit, self.url, hint=hint)
        return found.data
