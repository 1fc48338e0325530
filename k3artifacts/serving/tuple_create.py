"""``k3a tuple create`` (and the ``stage-release`` flow's last step): a published revision, an
image pinned by digest and a serving profile bound into a release tuple, planned, then stored.

The plan parses the revision, loads the signing key and the profile, checks the revision is
published (before any registry is asked: no network for a typo'd commit), pins the image (and
the verifier image) to digests, and works out where the weights are served from; a refusal
there writes nothing. The act binds (``releases/binding.py``: the store makes the revision's
prefix self-contained), stores the tuple create-once and signs it when a key was given.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from k3artifacts.errors import ConfigError
from k3artifacts.releases.binding import create_tuple, published_manifest
from k3artifacts.releases.signatures import sign_tuple
from k3artifacts.releases.tuples import ImageRef, ReleaseTuple, ServingSpec
from k3artifacts.revisions.refs import parse_revision_ref
from k3artifacts.serving.images import resolve_image
from k3artifacts.serving.profiles import (
    FsxTarget,
    StorageTarget,
    load_profile,
    serving_spec,
)
from k3artifacts.signing.keys import KeyReference, ReleaseSigner
from k3artifacts.stores.base import Store
from k3artifacts.trust.keys import release_signer

FsxDetails = tuple[str | None, str | None, str | None, str | None]


@dataclass(frozen=True)
class TuplePlan:
    repo_id: str
    commit: str
    image: ImageRef
    serving: ServingSpec
    signer: ReleaseSigner | None
    created_by: str | None


@dataclass(frozen=True)
class TupleCreated:
    release: ReleaseTuple
    #: False when an identical binding was already stored (its first record is returned).
    new: bool
    #: Store key of the tuple's signature, when signed.
    signature: str | None


def storage_target(store: Store, s3_region: str | None,
                   fsx: FsxDetails = (None, None, None, None)) -> StorageTarget | None:
    """Where the tuple's weights are served from: the FSx file system holding a file store
    (all four details, or none), else an S3 store's region; None for a plain file store."""
    if any(fsx):
        if not all(fsx):
            raise ConfigError(
                "FSx details are all-or-nothing",
                hint="pass --fsx-id, --fsx-dns-name, --fsx-mount-name and --fsx-mounted-at",
            )
        fs_id, dns, mount, at = fsx
        try:
            target = FsxTarget(file_system_id=fs_id, dns_name=dns, mount_name=mount, mounted_at=at)
        except ValueError as exc:
            raise ConfigError(f"FSx details: {exc}") from None
        return StorageTarget(fsx=target)
    if store.regional:
        region = s3_region or store.region()
        if not region:
            raise ConfigError(
                f"the region of {store.url} is unknown", hint="pass --s3-region REGION"
            )
        return StorageTarget(s3_region=region)
    return None


def plan_tuple(store: Store, revision: str, image: str, profile: str, *,
               verifier_image: str | None = None, insecure_registries: Iterable[str] = (),
               offline: bool = False, s3_region: str | None = None,
               fsx: FsxDetails = (None, None, None, None),
               signing_key: str | KeyReference | None = None,
               created_by: str | None = None) -> TuplePlan:
    """UsageError (exit 2) for a revision that is not ``org/name@<commit>``; NotFound (exit 7)
    for a revision not published, a profile or an image not found; Unavailable (exit 8) for a
    registry that cannot be reached; ConfigError (exit 9) for a bad key, profile, reference or
    storage details."""
    repo_id, commit = parse_revision_ref(revision)
    signer = release_signer(signing_key) if signing_key else None
    loaded = load_profile(profile)
    published_manifest(store, repo_id, commit)
    pinned = resolve_image(image, insecure_registries=insecure_registries, offline=offline)
    verifier = None
    if verifier_image:
        verifier = resolve_image(verifier_image, insecure_registries=insecure_registries,
                                 offline=offline).reference
    spec = serving_spec(loaded, storage=storage_target(store, s3_region, fsx),
                        verifier_image=verifier)
    return TuplePlan(repo_id, commit, pinned, spec, signer, created_by)


def act_tuple(store: Store, plan: TuplePlan) -> TupleCreated:
    created = create_tuple(store, plan.repo_id, plan.commit, plan.image, plan.serving,
                           created_by=plan.created_by)
    signed = None if plan.signer is None else sign_tuple(store, created.release.id, plan.signer)
    return TupleCreated(created.release, created.new, None if signed is None else signed.key)


def create_release_tuple(store: Store, revision: str, image: str, profile: str, *,
                         verifier_image: str | None = None,
                         insecure_registries: Iterable[str] = (), offline: bool = False,
                         s3_region: str | None = None,
                         fsx: FsxDetails = (None, None, None, None),
                         signing_key: str | KeyReference | None = None,
                         created_by: str | None = None) -> TupleCreated:
    """The tuple-create move: :func:`plan_tuple`, then :func:`act_tuple`."""
    return act_tuple(store, plan_tuple(
        store, revision, image, profile, verifier_image=verifier_image,
        insecure_registries=insecure_registries, offline=offline, s3_region=s3_region, fsx=fsx,
        signing_key=signing_key, created_by=created_by))
