"""Whether the place a render points a server at serves the tuple's revision as published.

A HyperPod endpoint reads the weights' place itself (its ``s3Storage`` reads whatever object is
current under the revision's prefix; FSx imports the same): no k3a code between the bytes and
vLLM. On S3 an insider can replace an object there after publication, and every k3a reader
(through the object records, at the versions recorded) would still read the recorded bytes
while the endpoint reads the new ones. So before rendering for such a target, the place is
checked as the artifact gate checks it (``RevisionStore.check_served``: one HEAD per file).
EKS targets verify the bytes in the pod (``k3a verify``/``k3a pull``) and are not checked here.
"""

from __future__ import annotations

from k3artifacts.errors import ConfigError
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.stores.base import Store
from k3artifacts.stores.registry import weights_store

#: Targets whose server reads the weights' place by itself, never through k3a.
PLACE_READERS = frozenset({"hyperpod"})


def check_place(store: Store, release: ReleaseTuple, target: str) -> None:
    """VerifyMismatch (exit 4) naming each file the place ``target``'s server reads does not
    serve as published; nothing for other targets."""
    if target not in PLACE_READERS:
        return
    w = release.binding.weights
    try:
        where = weights_store(w.location, w.repo_id, w.commit, beside=store)
    except ConfigError as exc:
        raise ConfigError(f"tuple {release.id}: {exc}", hint=exc.hint) from None
    where.refuse_unserved(w.repo_id, w.commit)
