"""``artifact``: the weights the tuple binds are in the store, complete, as the manifest lists.

The revision's manifest is in the store (and ``k3a revision gc`` is not retiring it) and its
digest is the tuple's; every file it lists is present with its listed size and nothing unlisted sits
beside them; no file of a format staging refuses; the license in the manifest is the tuple's;
the image is pinned by digest; and what a server reading the revision's place by itself would
get is the revision as published (``RevisionStore.check_served``: on S3, HyperPod's
``s3Storage`` reads the current objects under the prefix, which must be the versions recorded
at publication; on a file tree, small files and safetensors headers are hashed against the
manifest). These are cheap (a manifest read, a listing, a HEAD per file or a few MB read):
re-hashing 1.5 TB is the job of ``k3a verify`` on the node, before the server starts.
"""

from __future__ import annotations

from k3artifacts.policy.results import GateResult
from k3artifacts.promotion.gates.context import GateContext, human_bytes, summarize
from k3artifacts.releases.retirement import read_tombstone
from k3artifacts.releases.tuples import DIGEST
from k3artifacts.staging.rules import PICKLE_SUFFIXES

NAME = "artifact"


def check(ctx: GateContext) -> GateResult:
    store, release, manifest = ctx.store, ctx.release, ctx.manifest
    w = release.binding.weights
    image = release.binding.image
    if manifest is None:
        return GateResult(name=NAME, passed=False, reason=ctx.missing)
    problems = []
    stone = read_tombstone(store, w.repo_id, w.commit)
    if stone is not None:
        problems.append(f"the revision is being retired by {stone.who} (k3a revision gc)")
    if manifest.license.sha256 != release.binding.license_sha256:
        problems.append(
            f"manifest license sha256 {manifest.license.sha256} is not the tuple's "
            f"{release.binding.license_sha256}"
        )
    stored = store.read_sizes(w.repo_id, w.commit)
    sized = set()
    for record in manifest.files:
        size = stored.pop(record.path, None)
        if size is None:
            problems.append(f"{record.path} is missing")
        elif size != record.size:
            problems.append(f"{record.path} is {size} bytes, manifest says {record.size}")
        else:
            sized.add(record.path)
        if record.path.lower().endswith(PICKLE_SUFFIXES):
            # Staged only with --allow-pickle: serving it needs a recorded override too.
            problems.append(f"{record.path} is a pickle-family format (runs code when loaded)")
        if record.path.endswith(".safetensors") and record.safetensors is None:
            problems.append(f"{record.path} has no checked safetensors header")
    problems.extend(f"{path} is in the store but not in the manifest" for path in sorted(stored))
    served = store.check_served(w.repo_id, w.commit, manifest)
    problems.extend(f"{path} as served: {why}" for path, why in sorted(served.items())
                    if path in sized)
    if not DIGEST.match(image.digest):
        problems.append(f"image {image.repository} is not pinned by a sha256 digest")
    if problems:
        return GateResult(name=NAME, passed=False, reason=summarize(problems))
    return GateResult(
        name=NAME,
        passed=True,
        reason=f"manifest {manifest.digest()[:12]} present, {len(manifest.files)} files "
        f"({human_bytes(manifest.total_bytes)}) at listed sizes, served as published; "
        f"image {image.reference}",
    )
