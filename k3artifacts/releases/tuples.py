"""Release tuples: the immutable binding that serving consumes as its only input.

A tuple binds weights (repo, commit, manifest digest, where they are stored), the serving image
by digest, the serving args/env, and the license sha256. Its id is derived from the canonical
JSON of those binding fields alone, so the same inputs give the same id on any machine and any
changed byte gives a new id. Who made it and when are recorded beside, outside the id.
"""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from k3artifacts.canonical import canonical_digest, canonical_json
from k3artifacts.errors import (
    AlreadyExists,
    ConfigError,
    NotFound,
    Refusal,
    TamperedRecord,
    UsageError,
    VerifyMismatch,
)
from k3artifacts.revisions.manifest import ShardManifest, manifest_key
from k3artifacts.stores.records import RecordStore
from k3artifacts.stores.revisions import RevisionStore

TUPLE_SCHEMA = 1
TUPLE_PREFIX = "releases/tuples/"
ID_HEX = 24  # 96 bits of the binding digest: far beyond accidental collision, short to type
TUPLE_ID = re.compile(rf"^k3t-[0-9a-f]{{{ID_HEX}}}$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ImageRef(_Frozen):
    """An image pinned by digest. ``tag`` records what a human asked for; it binds nothing."""

    repository: str
    digest: str
    tag: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_a_tag_alone(cls, data: object) -> object:
        if isinstance(data, dict) and not data.get("digest") and data.get("tag"):
            raise ValueError(
                f"image {data.get('repository')} has tag {data['tag']} and no digest; "
                "a tuple binds images by digest (k3a tuple create resolves tags)"
            )
        return data

    @field_validator("digest")
    @classmethod
    def _pinned(cls, value: str) -> str:
        if not DIGEST.match(value):
            raise ValueError(f"image digest must be sha256:<64 hex>, got {value!r}")
        return value

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"


class WeightsRef(_Frozen):
    repo_id: str
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    manifest_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    #: Store URL of the revision (``file:///fsx/k3a/models/...`` or ``s3://bucket/.../models/...``).
    location: str


class ServingSpec(_Frozen):
    profile: str
    #: Path where the pod sees the weights; vLLM's model argument, never a Hub id.
    model_path: str
    args: list[str]
    env: dict[str, str]
    port: int
    #: Profile data the renderers need besides args/env (instance type, GPUs, request limits...).
    resources: dict[str, object] = Field(default_factory=dict)


class TupleBinding(_Frozen):
    schema_version: int = TUPLE_SCHEMA
    weights: WeightsRef
    image: ImageRef
    serving: ServingSpec
    license_sha256: str | None

    def tuple_id(self) -> str:
        return "k3t-" + canonical_digest(self)[:ID_HEX]


class ReleaseTuple(_Frozen):
    id: str
    binding: TupleBinding
    created_at: datetime
    created_by: str

    @classmethod
    def make(cls, binding: TupleBinding, *, created_at: datetime, created_by: str) -> ReleaseTuple:
        return cls(
            id=binding.tuple_id(), binding=binding, created_at=created_at, created_by=created_by
        )


def tuple_manifest(store: RevisionStore, release: ReleaseTuple) -> ShardManifest:
    """The published manifest of the revision ``release`` binds, held to the digest the tuple
    binds (``answers_to``: canonical or as stored): the one reader every gate, review, pull
    and rollback uses. NotFound, saying to stage it, when the revision is not in ``store``;
    VerifyMismatch (exit 4) when the store's manifest is another."""
    w = release.binding.weights
    manifest = store.read_manifest(w.repo_id, w.commit)
    if manifest is None:
        raise NotFound(
            f"the weights of {release.id} ({w.repo_id}@{w.commit}) are not in {store.url}: "
            f"no {manifest_key(w.repo_id, w.commit)}",
            hint=f"stage the revision first: `k3a stage {w.repo_id} --revision {w.commit}`",
        )
    if not manifest.answers_to(w.manifest_digest):
        raise VerifyMismatch(
            f"{w.repo_id}@{w.commit} in {store.url}: manifest digest {manifest.digest()} is not "
            f"the tuple's {w.manifest_digest}",
            hint="the store's manifest was replaced behind the tuple: do not serve it; "
            "investigate the store")
    return manifest


def tuple_key(tuple_id: str) -> str:
    return f"{TUPLE_PREFIX}{tuple_id}.json"


def check_tuple_id(tuple_id: str) -> str:
    if not TUPLE_ID.match(tuple_id):
        raise UsageError(
            f"{tuple_id!r} is not a tuple id",
            hint="tuple ids look like k3t-<24 hex>; list them with `k3a tuple list`",
        )
    return tuple_id


class TupleStore:
    """Tuples in a store: written once, re-derived on every read."""

    def __init__(self, store: RecordStore):
        self.store = store

    def put(self, release: ReleaseTuple) -> bool:
        """Store ``release``; True if written, False if the identical binding already exists."""
        if release.id != release.binding.tuple_id():
            raise ConfigError(f"tuple id {release.id} does not match its binding")
        try:
            self.store.create(tuple_key(release.id), canonical_json(release))
        except AlreadyExists:
            existing = self.get(release.id)  # re-derives; raises on a tampered body
            if existing.binding != release.binding:
                raise
            return False
        return True

    def get(self, tuple_id: str) -> ReleaseTuple:
        check_tuple_id(tuple_id)
        found = self.store.read(tuple_key(tuple_id))
        if found is None:
            raise NotFound(
                f"tuple {tuple_id} is not in {self.store.url}",
                hint="list tuples with `k3a tuple list`",
            )
        key = tuple_key(tuple_id)
        try:
            release = ReleaseTuple.model_validate_json(found.data)
        except ValueError as exc:
            raise TamperedRecord([Refusal(key, "tuple-malformed", str(exc))]) from None
        derived = release.binding.tuple_id()
        if release.id != tuple_id or derived != tuple_id:
            raise TamperedRecord(
                [Refusal(key, "tuple-tampered", f"body derives id {derived}, not {tuple_id}")]
            )
        return release

    def list_ids(self) -> list[str]:
        return [
            key[len(TUPLE_PREFIX) : -len(".json")]
            for key in self.store.list_keys(TUPLE_PREFIX)
            if key.endswith(".json")
        ]


def diff_bindings(a: TupleBinding, b: TupleBinding) -> list[tuple[str, object, object]]:
    """Fields that differ, as (dotted path, value in a, value in b), sorted by path."""

    def flatten(value: object, prefix: str, out: dict[str, object]) -> dict[str, object]:
        if isinstance(value, dict) and value:
            for key, sub in value.items():
                flatten(sub, f"{prefix}.{key}" if prefix else key, out)
        else:
            out[prefix] = value
        return out

    left = flatten(a.model_dump(mode="json"), "", {})
    right = flatten(b.model_dump(mode="json"), "", {})
    return [
        (key, left.get(key), right.get(key))
        for key in sorted(left.keys() | right.keys())
        if left.get(key) != right.get(key)
    ]
