"""The shard manifest: what a published revision holds, byte for byte.

Persisted as canonical JSON at ``models/<org>/<name>/<commit>/.k3a/manifest.json``; its sha256
is the manifest digest that release tuples bind to. Only what identifies the weights goes in
(commit, paths, sizes, hashes, license and remote-code records): the same commit staged into two
stores, fresh in one and by reuse in the other, gets one digest. Where a file's bytes came from
is provenance, kept beside it in ``.k3a/provenance.json`` (:class:`Provenance`).

Manifests published before that split carry provenance inside (``source: reused``). They still
parse; :meth:`ShardManifest.digest` is their canonical digest, and
:meth:`ShardManifest.legacy_digest` the sha256 of the bytes as stored, which tuples bound then
cite: :meth:`ShardManifest.answers_to` accepts either.

Large texts are files of the revision, never copied in: the license record names the license
file and its sha256 (``LicenseRecord.text`` is null in manifests written now). Manifests
published when the text was inline keep it, unread, and keep their digest: nothing is
rewritten. A commit staged again now gets a manifest without the text, so its digest differs
from a copy published before; tuples bind the digest of the copy they were made from.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from k3artifacts.canonical import canonical_digest, canonical_json
from k3artifacts.errors import CorruptManifest, plain_validation_errors

MANIFEST_SCHEMA = 1
META_DIR = ".k3a"
MANIFEST_NAME = "manifest.json"
PROVENANCE_NAME = "provenance.json"
PROVENANCE_SCHEMA = 1

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
    #: Provenance, not identity: carried with the record (quarantine log, task results) but
    #: never part of the manifest's bytes (:meth:`ShardManifest.canonical`, :class:`Provenance`).
    source: FileSource = "downloaded"
    reused_from: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}$")

    @model_serializer(mode="wrap")
    def _omit_default_provenance(self, handler: SerializerFunctionWrapHandler) -> dict:
        # A downloaded file serializes as records did before provenance existed: that form,
        # with reused files' provenance inside, is what manifests published then hold.
        data = handler(self)
        if data.get("source") == "downloaded":
            del data["source"]
        if data.get("reused_from") is None:
            data.pop("reused_from", None)
        return data

    def provenance(self) -> FileProvenance:
        return FileProvenance(path=self.path, source=self.source, reused_from=self.reused_from)


class LicenseRecord(Frozen):
    #: Path of the license file in the revision (the model card, README.md, when only its
    #: metadata names a license), or None when the revision carries none.
    path: str | None
    sha256: str | None
    #: The license text inline, as manifests published before it was kept as a file hold it
    #: (kept so their bytes, and digest, stay what they were); None in every manifest written
    #: now. Never read: the text is the file at ``path``, checked against ``sha256``.
    text: str | None = None
    #: From the model card's YAML front matter (README.md): license, license_name, license_link.
    card_license: str | None = None
    card_license_name: str | None = None
    card_license_link: str | None = None


class RemoteCodeEntry(Frozen):
    path: str
    sha256: str


class FileProvenance(Frozen):
    path: str
    source: FileSource
    reused_from: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}$")


class Provenance(Frozen):
    """Where the bytes of one store's copy of a revision came from, beside its manifest.

    Differs between stores holding the same commit, so it is outside the manifest digest; it
    names the digest it describes so that it cannot be taken for another manifest's."""

    schema_version: int = PROVENANCE_SCHEMA
    repo_id: str
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    manifest_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    files: list[FileProvenance]

    def canonical(self) -> bytes:
        return canonical_json(self)

    @classmethod
    def parse(cls, data: bytes) -> Provenance:
        return cls.model_validate_json(data)


class ShardManifest(Frozen):
    schema_version: int = MANIFEST_SCHEMA
    repo_id: str
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    files: list[FileRecord]
    license: LicenseRecord
    remote_code: list[RemoteCodeEntry]
    total_bytes: int

    def _identity(self) -> dict:
        data = self.model_dump(mode="json")
        for plain in data["files"]:
            plain.pop("source", None)
            plain.pop("reused_from", None)
        return data

    def canonical(self) -> bytes:
        """The bytes of ``manifest.json``: identity only, whatever provenance the files carry."""
        return canonical_json(self._identity())

    def digest(self) -> str:
        """sha256 of :meth:`canonical`: one digest per commit, whichever store and however
        its bytes got there."""
        return canonical_digest(self._identity())

    def legacy_digest(self) -> str:
        """The digest this manifest had when provenance was inside it (sha256 of the canonical
        JSON with ``source``/``reused_from`` on reused files, nothing on downloaded ones): what
        a tuple bound to a manifest published then cites. Equal to :meth:`digest` when no file
        was reused."""
        return canonical_digest(self)

    def answers_to(self, digest: str) -> bool:
        """Whether a tuple or an operator citing ``digest`` means these weights."""
        return digest in (self.digest(), self.legacy_digest())

    def provenance(self) -> Provenance:
        return Provenance(repo_id=self.repo_id, commit=self.commit, manifest_digest=self.digest(),
                          files=[f.provenance() for f in self.files])

    def with_provenance(self, provenance: Provenance | None) -> ShardManifest:
        """This manifest with its files' provenance taken from the sibling record; unchanged
        when there is none or it describes another manifest (provenance is informative: a
        missing or stray record never makes weights unreadable)."""
        if provenance is None or provenance.manifest_digest != self.digest():
            return self
        by_path = {p.path: p for p in provenance.files}
        files = [f.model_copy(update={"source": by_path[f.path].source,
                                      "reused_from": by_path[f.path].reused_from})
                 if f.path in by_path else f for f in self.files]
        return self.model_copy(update={"files": files})

    def file(self, path: str) -> FileRecord | None:
        for record in self.files:
            if record.path == path:
                return record
        return None

    @classmethod
    def parse(cls, data: bytes, where: str = "the revision manifest") -> ShardManifest:
        """The manifest in ``data``; CorruptManifest (exit 4) naming ``where`` (its store key
        or path) when it does not parse."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise CorruptManifest(
                f"{where} does not parse as a revision manifest: "
                f"{plain_validation_errors(exc)}") from None


def is_weights(record: FileRecord) -> bool:
    """A safetensors file at the revision's top: what vLLM loads as weights (and what the
    verified load, ``--load-format k3a``, hashes as it reads them)."""
    return "/" not in record.path and record.path.endswith(".safetensors")


def revision_prefix(repo_id: str, commit: str) -> str:
    """Store key prefix of a revision: ``models/<org>/<name>/<commit>``."""
    return f"models/{repo_id}/{commit}"


def manifest_key(repo_id: str, commit: str) -> str:
    return f"{revision_prefix(repo_id, commit)}/{META_DIR}/{MANIFEST_NAME}"


def provenance_key(repo_id: str, commit: str) -> str:
    return f"{revision_prefix(repo_id, commit)}/{META_DIR}/{PROVENANCE_NAME}"
