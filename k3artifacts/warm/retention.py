"""A warm artifact lives in the store exactly as long as its tuple's weights.

``k3a gc`` retires a revision (``releases/retention.py``); the tuples bound to it can no
longer serve, so their warm artifacts (manifest, then release signature) are deleted right after the
revision, and then every blob no remaining warm manifest names. A blob younger than
:data:`BLOB_GRACE` is kept: a capture running meanwhile may have just stored it, its manifest
not yet written. (A capture that found a blob already stored and saw it deleted before its
manifest landed yields an artifact with a missing blob: a named ``corrupt`` miss at pull,
never a wrong use.)

:func:`gc` is the act of ``k3a revision gc --apply``: the revisions' retirement
(``releases/retention.py``, below this package) with each retired revision's warm artifacts.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from k3artifacts.policy.actor import Actor
from k3artifacts.policy.signed import claimed_body
from k3artifacts.releases.retention import GcPlan, RevisionVerdict, act_gc
from k3artifacts.releases.tuples import TupleStore
from k3artifacts.stores.base import Store
from k3artifacts.warm.model import (
    ARTIFACT_PREFIX,
    BLOB_PREFIX,
    WarmManifest,
    artifact_prefix,
    signature_key,
)

BLOB_GRACE = timedelta(hours=24)


def warm_keys_of_revision(store: Store, repo_id: str, commit: str) -> list[str]:
    """Manifest keys of every warm artifact of a tuple bound to ``repo_id@commit``."""
    tuples = TupleStore(store)
    keys = []
    for tuple_id in tuples.list_ids():
        w = tuples.get(tuple_id).binding.weights
        if (w.repo_id, w.commit) == (repo_id, commit):
            keys += [k for k in store.list_keys(artifact_prefix(tuple_id)) if k.endswith(".json")]
    return keys


def retire_warm(store: Store, repo_id: str, commit: str, *,
                now: datetime | None = None) -> list[str]:
    """Delete the warm artifacts of the retired revision's tuples, then unreferenced blobs;
    returns the manifest keys deleted."""
    doomed = warm_keys_of_revision(store, repo_id, commit)
    for key in doomed:
        store.delete(key)  # the manifest first: from here no reader sees the artifact
        store.delete(signature_key(key))
    sweep_blobs(store, now=now)
    return doomed


def sweep_blobs(store: Store, *, now: datetime | None = None) -> int:
    now = now or datetime.now(UTC)
    named: set[str] = set()
    for key in store.list_keys(ARTIFACT_PREFIX):
        if key.endswith(".json"):
            found = store.read(key)
            if found is None:
                continue
            # Whoever made it: a blob is kept while any manifest names it (one that does not
            # verify is never used, and keeping its blobs costs only space).
            body = claimed_body(found.data)
            try:
                named |= {f.blob_key for f in WarmManifest.model_validate(body or {}).files}
            except ValueError:
                continue
    deleted = 0
    for key in store.list_keys(BLOB_PREFIX):
        if key in named:
            continue
        when = store.modified_at(key)
        if when is not None and now - when < BLOB_GRACE:
            continue
        store.delete(key)
        deleted += 1
    return deleted


def gc(store: Store, plan: GcPlan, *, by: Actor) -> list[RevisionVerdict]:
    """Carry out a gc plan (``releases.retention.plan_gc``): retire its revisions and, with
    each, the warm artifacts of its tuples."""
    return act_gc(store, plan, by=by, also=retire_warm)
