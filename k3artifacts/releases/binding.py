"""Bind a published revision, a pinned image and a serving profile into a release tuple.

Everything bound comes from something already pinned: the revision's manifest (read from the
store, so an unpublished revision cannot be bound), the image digest (resolved once by
:mod:`k3artifacts.serving.images`) and the profile data. Making the same tuple twice is
harmless: the id is the same and the store keeps the first body.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from k3artifacts.policy.actor import os_account
from k3artifacts.releases.tuples import (
    ImageRef,
    ReleaseTuple,
    ServingSpec,
    TupleBinding,
    TupleStore,
    WeightsRef,
)
from k3artifacts.revisions.manifest import ShardManifest
from k3artifacts.stores.base import Store
from k3artifacts.stores.revisions import RevisionStore


@dataclass(frozen=True)
class Created:
    release: ReleaseTuple
    #: False when an identical binding was already stored (its first record is returned).
    new: bool


def published_manifest(store: RevisionStore, repo_id: str, commit: str) -> ShardManifest:
    return store.published_manifest(
        repo_id, commit,
        hint="stage it first (`k3a stage`); a tuple binds only a verified, published revision",
    )


def bind(
    store: RevisionStore, repo_id: str, commit: str, image: ImageRef, serving: ServingSpec
) -> TupleBinding:
    manifest = published_manifest(store, repo_id, commit)
    # A tuple's location is a prefix a server may read by itself (HyperPod's s3Storage, a
    # mount): it must hold every file, not references to a published neighbour's objects.
    store.materialize(repo_id, commit)
    weights = WeightsRef(
        repo_id=repo_id,
        commit=commit,
        manifest_digest=manifest.digest(),
        location=store.location(repo_id, commit),
    )
    return TupleBinding(
        weights=weights, image=image, serving=serving, license_sha256=manifest.license.sha256
    )


def create_tuple(
    store: Store,
    repo_id: str,
    commit: str,
    image: ImageRef,
    serving: ServingSpec,
    *,
    created_by: str | None = None,
    now: datetime | None = None,
) -> Created:
    binding = bind(store, repo_id, commit, image, serving)
    release = ReleaseTuple.make(
        binding, created_at=now or datetime.now(UTC), created_by=created_by or os_account()
    )
    tuples = TupleStore(store)
    if tuples.put(release):
        return Created(release, new=True)
    return Created(tuples.get(release.id), new=False)
