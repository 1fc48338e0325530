"""A policy change collecting root signatures before it is put in force.

``releases/policy/proposals/<request-id>.json`` holds the signed change a proposal would
record (the history's next entry, :mod:`.record`), signed by each root identity that assents
to it: the proposer if it is one, each that approves it (``k3a approve``), and whoever puts
it in force (``k3a policy apply``). It is replaceable and trusted by nobody: what is put in
force is verified again, signature by signature, by every reader.

Its body is fixed by the approval request and the version it would follow
(:func:`expected_link`), so every signer signs exactly what the request shows whatever the
store holds meanwhile; a proposal whose body is another is refused, never signed.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3artifacts.canonical import canonical_digest
from k3artifacts.errors import Conflict, UntrustedRecord
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.approvals import ApprovalRequest
from k3artifacts.policy.record import KIND, PREFIX, InForce, PolicyChange, change_key
from k3artifacts.policy.signed import claimed_body
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.chain import Link, next_link
from k3artifacts.trust.envelope import sign_record, verify_record


def proposal_key(request_id: str) -> str:
    return f"{PREFIX}proposals/{request_id}.json"


def expected_link(request: ApprovalRequest, current: InForce) -> Link:
    """The entry ``request`` would add to the history ``current`` heads."""
    assert current.chain is not None and current.roots is not None
    assert request.policy_digest is not None
    change = PolicyChange(
        version=current.version + 1, digest=request.policy_digest, previous_digest=current.digest,
        action="change", by=request.requested_by, at=request.requested_at, why=request.why,
        request_id=request.id, proposed_by=request.requested_by, loosens=request.needs,
        root_version=current.roots.current.version)
    return next_link(current.chain, change)


def _root_version(data: bytes) -> int | None:
    """The root version a stored proposal says it was signed under, unverified (for naming a
    stale proposal as such before its signatures are checked against today's root); None
    when it says none."""
    claimed = claimed_body(data)
    entry = claimed.get("entry") if claimed is not None else None
    version = entry.get("root_version") if isinstance(entry, dict) else None
    return version if isinstance(version, int) else None


@dataclass(frozen=True)
class Pending:
    data: bytes
    token: str | None
    #: The root identities (of the root in force) that signed it so far.
    signers: frozenset[str]


def pending(store: RecordStore, request: ApprovalRequest, current: InForce) -> Pending | None:
    """The change ``request`` proposes, as signed so far; None before any root identity
    signed it. UntrustedRecord when the store holds another body there, or signatures that
    do not verify."""
    key = proposal_key(request.id)
    found = store.read(key)
    if found is None:
        return None
    link = expected_link(request, current)
    assert current.roots is not None
    signed_under = _root_version(found.data)
    if signed_under is not None and signed_under != current.roots.current.version:
        # Signed under a root since rotated: its signatures were a root's that is no longer
        # the one in force, and it follows a change the store moved past (the docs' exit 6).
        raise Conflict(f"{request.id} was signed under root v{signed_under}; the root rotated "
                       f"to v{current.roots.current.version} since; nothing was written",
                       hint="propose the change again (`k3a policy propose DIR`): the root in "
                       "force signs it")
    verified = verify_record(found.data, key=change_key(link.seq), kind=KIND,
                             keyring=current.roots.current.keyring(), roles=None,
                             bound=current.roots.bound)
    if verified.digest != canonical_digest(link):
        raise UntrustedRecord(key, "tampered", f"the proposal of {request.id} is not the change "
                              "it asks for (another body, or it follows another version)",
                              hint="propose the change again (`k3a policy propose DIR`), and "
                              "find who can write to the store")
    return Pending(found.data, found.token, verified.signers)


def assent(store: RecordStore, request: ApprovalRequest, current: InForce,
           acting: Acting) -> Pending | None:
    """``acting``'s signature on the change ``request`` proposes, if it is a root identity
    (None otherwise: its assent counts for nothing here). Conflict (exit 6) when another
    signer replaced the proposal meanwhile."""
    assert current.roots is not None
    me = current.roots.current.identity_of(acting.signer)
    if me is None:
        return None
    before = pending(store, request, current)
    link = expected_link(request, current)
    key = change_key(link.seq)
    if before is None:  # signed as the root names it, which the policy's name need not be
        data = sign_record(key=key, kind=KIND, body=link, signer=acting.signer, identity=me,
                           store_id=current.roots.current.store_id)
    else:
        data = acting.cosign(before.data, key=key)
    try:
        store.replace(proposal_key(request.id), data, None if before is None else before.token)
    except Conflict:
        raise Conflict(f"another root identity signed {request.id} at the same moment; "
                       "nothing was written", hint="run it again") from None
    return Pending(data, None, (frozenset() if before is None else before.signers) | {me})
