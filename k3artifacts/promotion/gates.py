"""Promotion gates: what a tuple must satisfy to move onto a channel, each with its reason.

Which gates apply to which channel is data (``policies/promotion-gates.yaml``). The gates:

* ``artifact``: the revision's manifest is in the store and its digest is the tuple's; every file
  it lists is present with its listed size and nothing unlisted sits beside them; no file of a
  format staging refuses; the license in the manifest is the tuple's; the image is pinned by
  digest. These are cheap (one manifest read, one listing): re-hashing 1.5 TB is the job of
  ``k3a verify`` on the node, before the server starts.
* ``license``: the tuple's license sha256 is reviewed in ``policies/licenses/``.
* ``remote_code``: every ``*.py`` in the manifest's remote-code inventory is reviewed in
  ``policies/code-reviews/`` (by sha256).
* ``evaluation``: a readiness run of the policy's suite against an endpoint serving the tuple
  met the channel's thresholds (``promotion/gate_evaluation.py``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, computed_field

from k3artifacts.errors import NotFound
from k3artifacts.promotion.gate_evaluation import evaluation_gate
from k3artifacts.releases.channels import GateResult, check_channel
from k3artifacts.releases.policies import (
    GATES_FILE,
    ChannelPolicy,
    GatePolicy,
    load_code_reviews,
    load_gate_policy,
    load_license_reviews,
)
from k3artifacts.releases.tuples import DIGEST, ReleaseTuple, TupleStore
from k3artifacts.revisions.manifest import META_DIR, ShardManifest, manifest_key, revision_prefix
from k3artifacts.staging.rules import PICKLE_SUFFIXES
from k3artifacts.stores.base import Store

MAX_LISTED = 5  # problems named in one reason; the count says how many more


class GateReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    tuple_id: str
    channel: str
    results: list[GateResult]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[GateResult]:
        return [r for r in self.results if not r.passed]


def channel_policy(policy: GatePolicy, channel: str, policies_dir: Path) -> ChannelPolicy:
    check_channel(channel)
    if channel not in policy.channels:
        configured = ", ".join(sorted(policy.channels)) or "none"
        raise NotFound(
            f"channel {channel!r} is not configured in {Path(policies_dir) / GATES_FILE} "
            f"(configured: {configured})",
            hint=f"check the spelling, or add `{channel}: {{gates: [...]}}` under channels:",
        )
    return policy.channels[channel]


def _summarize(problems: list[str]) -> str:
    shown = "; ".join(problems[:MAX_LISTED])
    more = len(problems) - MAX_LISTED
    return shown + (f"; and {more} more" if more > 0 else "")


def _human_bytes(n: int) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    size, i = float(n), 0
    while size >= 1024 and i < len(units) - 1:
        size, i = size / 1024, i + 1
    return f"{n} B" if i == 0 else f"{size:.1f} {units[i]}"


def _read_manifest(store: Store, release: ReleaseTuple) -> tuple[ShardManifest | None, str]:
    """The tuple's manifest, or None and why not (a reason both gates that need it report)."""
    w = release.binding.weights
    key = manifest_key(w.repo_id, w.commit)
    try:
        manifest = store.read_manifest(w.repo_id, w.commit)
    except ValueError as exc:
        return None, f"{key} in {store.url} is malformed: {str(exc).splitlines()[0]}"
    if manifest is None:
        return (
            None,
            f"no manifest at {key} in {store.url}: the revision is not staged (or was deleted)",
        )
    return manifest, ""


def artifact_gate(
    store: Store, release: ReleaseTuple, manifest: ShardManifest | None, missing: str = ""
) -> GateResult:
    w = release.binding.weights
    image = release.binding.image
    if manifest is None:
        return GateResult(name="artifact", passed=False, reason=missing)
    problems = []
    digest = manifest.digest()
    if digest != w.manifest_digest:
        problems.append(f"manifest digest {digest} is not the tuple's {w.manifest_digest}")
    if manifest.license.sha256 != release.binding.license_sha256:
        problems.append(
            f"manifest license sha256 {manifest.license.sha256} is not the tuple's "
            f"{release.binding.license_sha256}"
        )
    prefix = revision_prefix(w.repo_id, w.commit) + "/"
    stored = {
        key[len(prefix) :]: size
        for key, size in store.object_sizes(prefix).items()
        if not key[len(prefix) :].startswith(f"{META_DIR}/")
    }
    for record in manifest.files:
        size = stored.pop(record.path, None)
        if size is None:
            problems.append(f"{record.path} is missing")
        elif size != record.size:
            problems.append(f"{record.path} is {size} bytes, manifest says {record.size}")
        if record.path.lower().endswith(PICKLE_SUFFIXES):
            # Staged only with --allow-pickle: serving it needs a recorded override too.
            problems.append(f"{record.path} is a pickle-family format (runs code when loaded)")
        if record.path.endswith(".safetensors") and record.safetensors is None:
            problems.append(f"{record.path} has no checked safetensors header")
    problems.extend(f"{path} is in the store but not in the manifest" for path in sorted(stored))
    if not DIGEST.match(image.digest):
        problems.append(f"image {image.repository} is not pinned by a sha256 digest")
    if problems:
        return GateResult(name="artifact", passed=False, reason=_summarize(problems))
    return GateResult(
        name="artifact",
        passed=True,
        reason=f"manifest {digest[:12]} present, {len(manifest.files)} files "
        f"({_human_bytes(manifest.total_bytes)}) at listed sizes; image {image.reference}",
    )


def license_gate(release: ReleaseTuple, policies_dir: Path) -> GateResult:
    sha = release.binding.license_sha256
    if sha is None:
        return GateResult(
            name="license", passed=False, reason="the revision carries no license text"
        )
    reviews = load_license_reviews(policies_dir)
    if sha not in reviews:
        repo = release.binding.weights.repo_id
        earlier = [r for r, _ in reviews.values() if r.repo_id == repo]
        changed = (
            f"; the text differs from the one {earlier[-1].reviewed_by} reviewed for {repo} "
            f"on {earlier[-1].reviewed_on} ({earlier[-1].sha256[:12]})"
            if earlier
            else ""
        )
        return GateResult(
            name="license",
            passed=False,
            reason=f"license sha256 {sha} has not been reviewed{changed}; read it, then "
            f"`k3a review license {release.id} --by NAME`",
        )
    review, path = reviews[sha]
    return GateResult(
        name="license",
        passed=True,
        reason=f"sha256 {sha[:12]} reviewed by {review.reviewed_by} on {review.reviewed_on} "
        f"({path.name})",
    )


def remote_code_gate(
    release: ReleaseTuple, manifest: ShardManifest | None, policies_dir: Path, missing: str = ""
) -> GateResult:
    if manifest is None:
        return GateResult(
            name="remote_code", passed=False, reason=f"no remote-code inventory: {missing}"
        )
    if not manifest.remote_code:
        return GateResult(name="remote_code", passed=True, reason="the revision has no *.py files")
    reviews = load_code_reviews(policies_dir)
    unreviewed = [e for e in manifest.remote_code if e.sha256 not in reviews]
    if unreviewed:
        names = [f"{e.path} ({e.sha256[:12]})" for e in unreviewed]
        return GateResult(
            name="remote_code",
            passed=False,
            reason=f"not reviewed: {_summarize(names)}; read them, then "
            f"`k3a review code {release.id} --by NAME`",
        )
    reviewers = sorted({reviews[e.sha256][0].reviewed_by for e in manifest.remote_code})
    return GateResult(
        name="remote_code",
        passed=True,
        reason=f"{len(manifest.remote_code)} file(s) reviewed by {', '.join(reviewers)}",
    )


def check_gates(store: Store, tuple_id: str, channel: str, *, policies_dir: Path) -> GateReport:
    """Run the gates ``channel`` requires on ``tuple_id``. Nothing is written."""
    chan = channel_policy(load_gate_policy(policies_dir), channel, policies_dir)
    release = TupleStore(store).get(tuple_id)
    return run_gates(store, release, channel, chan, policies_dir=policies_dir)


def run_gates(
    store: Store, release: ReleaseTuple, channel: str, chan: ChannelPolicy, *, policies_dir: Path
) -> GateReport:
    manifest, missing = (
        _read_manifest(store, release)
        if {"artifact", "remote_code"} & set(chan.gates)
        else (None, "")
    )
    results = []
    for name in chan.gates:
        if name == "artifact":
            results.append(artifact_gate(store, release, manifest, missing))
        elif name == "license":
            results.append(license_gate(release, policies_dir))
        elif name == "remote_code":
            results.append(remote_code_gate(release, manifest, policies_dir, missing))
        else:
            assert chan.evaluation is not None  # ChannelPolicy validates this
            results.append(evaluation_gate(store, release, chan.evaluation, channel=channel,
                                           policies_dir=policies_dir))
    return GateReport(tuple_id=release.id, channel=channel, results=results)
