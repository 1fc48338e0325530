"""The ``signature`` gate: a tuple moves onto a channel whose release rule requires it only
if its revision and the tuple itself are signed by release identities the channel counts.

Policy: ``identities.yaml`` of the store's policy in force (its identities holding the
``release`` role, and ``release_channels``: which channels require release signatures, whose,
and whether the gate re-reads the weights). With
``verify_bytes`` (the default) the revision's bytes are checked once with xxh3-128 against the
signed manifest, as a node does before serving: a byte changed in the store after signing is
caught here, before the channel moves, not on the first node that pulls it.
"""

from __future__ import annotations

from collections.abc import Callable

from k3artifacts.errors import K3AError
from k3artifacts.policy.release_keys import ReleaseKeys
from k3artifacts.policy.results import GateResult
from k3artifacts.promotion.gates.context import GateContext
from k3artifacts.releases.signatures import check_tuple_signature
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.signing.verify import SIGNATURE_STAGE, verify_signed_revision
from k3artifacts.stores.base import Store

NAME = "signature"


def check(ctx: GateContext) -> GateResult:
    return signature_gate(ctx.store, ctx.release, ctx.channel, ctx.document.release_keys)


def signature_gate(
    store: Store, release: ReleaseTuple, channel: str, keys: Callable[[], ReleaseKeys]
) -> GateResult:
    """``keys``: the release keys and rules the channel is judged by (read inside, so that a policy
    that does not load fails the gate, naming why)."""
    try:
        policy = keys()
    except K3AError as exc:
        return GateResult(name=NAME, passed=False, reason=str(exc))
    if not policy.required(channel):
        return GateResult(name=NAME, passed=True,
                          reason=f"signatures are not required on {channel}")
    weights = release.binding.weights
    try:
        trusted = policy.for_channel(channel)
        checked = verify_signed_revision(
            trusted, store=store, repo_id=weights.repo_id, commit=weights.commit,
            read_weights=policy.verify_bytes(channel),
        )
    except K3AError as exc:
        return GateResult(name=NAME, passed=False, reason=str(exc))
    report = checked.report
    if report.problems:
        listed = "; ".join(f"{p.path}: {p.reason}" for p in report.problems[:5])
        more = f" (+{len(report.problems) - 5} more)" if len(report.problems) > 5 else ""
        return GateResult(name=NAME, passed=False,
                          reason=f"revision {weights.repo_id}@{weights.commit}: {listed}{more}")
    if report.manifest_digest != weights.manifest_digest:
        return GateResult(name=NAME, passed=False, reason=(
            f"the signed manifest has digest {report.manifest_digest}, the tuple binds "
            f"{weights.manifest_digest}"))
    try:
        tuple_key_name = check_tuple_signature(store, release.id, trusted)
    except K3AError as exc:
        return GateResult(name=NAME, passed=False, reason=str(exc))
    how = "signature" if report.algorithm == SIGNATURE_STAGE else "signature and bytes"
    return GateResult(name=NAME, passed=True, reason=(
        f"revision {how} verified (key {checked.key_name}); tuple signed by {tuple_key_name}"))
