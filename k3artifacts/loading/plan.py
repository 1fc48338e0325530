"""What a verified load may read, decided before any weight byte is: the tuple the server was
started for, its signature, the revision's signature over its manifest in the tuple's store,
both by keys the store's policy in force trusts (that policy verified under the root this
process pins), that manifest being the one the tuple binds, and the copy vLLM reads (a node's
cache, or the store's own directory, writable by no other account) holding that manifest.

The copy's ``.k3a/manifest.json`` is not evidence: it must have the signed manifest's digest
(an edited one does not). The small files vLLM reads besides the weights (config, index) are
hashed here against the signed manifest, and any file it does not list is refused, before the
weights are touched; the weights are left to the reader, which hashes them as it loads them
(:mod:`.stream`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from k3artifacts.errors import VerifyMismatch
from k3artifacts.loading.stream import Shard
from k3artifacts.loading.witness import check_directory
from k3artifacts.policy.signing_keys import trusted_keys
from k3artifacts.releases.signatures import check_tuple_signature
from k3artifacts.releases.tuples import TupleStore
from k3artifacts.revisions.manifest import is_weights
from k3artifacts.signing.verify import verify_signed_revision
from k3artifacts.stores.base import Store
from k3artifacts.stores.verify import verify_revision

INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class LoadPlan:
    tuple_id: str
    tuple_signed_by: str
    revision_signed_by: str
    manifest_digest: str
    #: The weights files vLLM loads, in its order, each with the signed xxh3-128.
    shards: list[Shard]


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def plan_load(store: Store, tuple_id: str, directory: Path, *,
              channel: str | None = None) -> LoadPlan:
    """Signatures, manifest and small files checked; the weights to read. Raises the refusal
    that names the record or file (:class:`~k3artifacts.errors.VerifyMismatch`, a tuple
    signature refusal) before any weight byte is read."""
    trusted = trusted_keys(store).for_channel(channel)
    tuple_signer = check_tuple_signature(store, tuple_id, trusted)
    weights = TupleStore(store).get(tuple_id).binding.weights
    signed = verify_signed_revision(trusted, store=store, repo_id=weights.repo_id,
                                    commit=weights.commit, read_weights=False)
    signed.raise_for_problems()
    manifest = signed.manifest
    if not manifest.answers_to(weights.manifest_digest):
        raise VerifyMismatch(
            f"tuple {tuple_id} binds manifest {weights.manifest_digest}; the signed manifest "
            f"of {weights.repo_id}@{weights.commit} in {store.url} is {manifest.digest()}",
            hint="the store's revision is not the tuple's; do not serve this tuple")
    # The copy vLLM reads: its manifest must be the signed one, its small files match it.
    check_directory(directory)
    verify_revision(directory=directory, expect_digest=manifest.digest(),
                    leave=is_weights).raise_for_problems()
    records = [r for r in manifest.files if is_weights(r)]
    index = next((r for r in manifest.files if r.path == INDEX), None)
    if index is not None:  # as vLLM does: only the shards the index maps (hashed just now)
        listed = set(json.loads((directory / INDEX).read_bytes())["weight_map"].values())
        records = [r for r in records if r.path in listed]
    return LoadPlan(
        tuple_id=tuple_id, tuple_signed_by=tuple_signer,
        revision_signed_by=signed.key_name or "", manifest_digest=manifest.digest(),
        shards=[Shard(r.path, directory / r.path, r.size, r.xxh3_128)
                for r in sorted(records, key=lambda r: _natural(r.path))],
    )
