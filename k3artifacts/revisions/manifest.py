"""The shard manifest: what a published revision holds, byte for byte.

Persisted as canonical JSON at ``models/<org>/<name>/<commit>/.k3a/manifest.json``; its sha256
is the manifest digest that release tuples bind to. Nothing time- or host-dependent goes in, so
staging the same revision twice gives the same digest.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from k3artifacts.canonical import canonical_digest, canonical_json

MANIFEST_SCHEMA = 1
META_DIR = ".k3a"
MANIFEST_NAME = "manifest.json"

FileKind = Literal["weights", "index", "license", "code", "card", "config", "other"]
FileSource = Literal["downloaded", "reused"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SafetensorsSummary(Frozen):
    header_len: int
    tensor_count: int
    dtypes: list[str]
    #: sha256 of the raw header JSON bytes: identifies the tensor layout without the data.
    header_sha256: str
    data_bytes: int


class FileRecord(Frozen):
    path: str
    size: int
    kind: FileKind
    sha256: str
    xxh3_128: str
    #: What the hub listed for this file: LFS sha256 for large files, git blob sha1 for small ones.
    upstream_sha256: str | None = None
    upstream_git_oid: str | None = None
    safetensors: SafetensorsSummary | None = None
    #: Where this revision's bytes of the file came from: a Hub transfer checked against the
    #: upstream hash, or a copy inside the store of the file of another published revision
    #: (``reused_from``: its commit), which was itself downloaded and checked that way.
    source: FileSource = "downloaded"
    reused_from: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}$")

    @model_serializer(mode="wrap")
    def _omit_default_provenance(self, handler: SerializerFunctionWrapHandler) -> dict:
        # Provenance came after manifests were first published: a downloaded file serializes
        # as it always did, so the digests of existing manifests (bound into tuples) hold.
        data = handler(self)
        if data.get("source") == "downloaded":
            del data["source"]
        if data.get("reused_from") is None:
            data.pop("reused_from", None)
        return data


class LicenseRecord(Frozen):
    #: Path of the license file in the revision, or None when the revision carries none.
    path: str | None
    sha256: str | None
    text: str | None
    #: From the model card's YAML front matter (README.md): license, license_name, license_link.
    card_license: str | None = None
    card_license_name: str | None = None
    card_license_link: str | None = None


class RemoteCodeEntry(Frozen):
    path: str
    sha256: str


class ShardManifest(Frozen):
    schema_version: int = MANIFEST_SCHEMA
    repo_id: str
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    files: list[FileRecord]
    license: LicenseRecord
    remote_code: list[RemoteCodeEntry]
    total_bytes: int

    def canonical(self) -> bytes:
        return canonical_json(self)

    def digest(self) -> str:
        return canonical_digest(self)

    def content_digest(self) -> str:
        """The digest with every file counted as downloaded: two stagings of one revision that
        reused different files (a revision was published between their plans) hold the same
        bytes, and a writer that finds the other's manifest published accepts it."""
        plain = [f.model_copy(update={"source": "downloaded", "reused_from": None})
                 for f in self.files]
        return canonical_digest(self.model_copy(update={"files": plain}))

    def file(self, path: str) -> FileRecord | None:
        for record in self.files:
            if record.path == path:
                return record
        return None

    @classmethod
    def parse(cls, data: bytes) -> ShardManifest:
        return cls.model_validate_json(data)


def revision_prefix(repo_id: str, commit: str) -> str:
    """Store key prefix of a revision: ``models/<org>/<name>/<commit>``."""
    return f"models/{repo_id}/{commit}"


def manifest_key(repo_id: str, commit: str) -> str:
    return f"{revision_prefix(repo_id, commit)}/{META_DIR}/{MANIFEST_NAME}"
