"""Approvals with an identity: a request, and at most one decision answering it.

A move or policy change that needs someone's approval creates a **request** in the store
(what would change, who asks, the policy digest in force), signed by the key of the identity
that asks (role ``promote`` for a move, ``policy`` for a policy change); the approver answers it
with ``k3a approve REQUEST`` (or ``--reject``; the move is :mod:`.decide`), signed by their own
key (role ``approve``), and the answer is created once beside it: the first answer is the
answer. Both are signed records (:mod:`.signed`), read only through their signatures against
the store's policy in force: one written by hand, or signed by an identity without the role, is
refused by name (UntrustedRecord, exit 4); so is an answer signed by the identity that asked
(approval needs a second identity, compared by the keys that signed). A form field, a flow
parameter or any other typed name is never an approver. Keys::

    releases/approvals/<request-id>/request.json     create-once
    releases/approvals/<request-id>/decision.json    create-once
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from k3artifacts.canonical import canonical_digest
from k3artifacts.errors import (
    AlreadyExists,
    ConfigError,
    Conflict,
    GateFailed,
    NotFound,
    UntrustedRecord,
)
from k3artifacts.policy.actor import Acting, Actor
from k3artifacts.policy.signed import Family, create_signed, parse_signed, record_trust
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.identities import Role

PREFIX = "releases/approvals/"
REQUEST_ID = r"^k3r-[0-9a-f]{24}$"

Action = Literal["promote", "rollback", "policy"]


class ApprovalRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    id: str = Field(pattern=REQUEST_ID)
    action: Action
    #: The channel a move would change (None for a policy change).
    channel: str | None = None
    #: The tuple a move would point the channel at.
    tuple_id: str | None = None
    #: A policy change: the proposed document's digest; a move: the policy in force.
    policy_digest: str | None = None
    #: A policy change: the digest of the policy it would replace.
    base_digest: str | None = None
    requested_by: Actor
    #: A name typed where the request was made (a flow parameter): shown, never an identity.
    requested_for: str | None = None
    requested_at: datetime
    why: str | None = None
    #: Why an approval is needed, in words for the approver.
    needs: list[str] = Field(default_factory=list)

    def subject(self) -> str:
        if self.action == "policy":
            return f"policy change to {self.policy_digest and self.policy_digest[:12]}"
        return f"{self.action} of {self.channel} to {self.tuple_id or 'its previous tuple'}"


class Decision(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    request_id: str = Field(pattern=REQUEST_ID)
    decision: Literal["approved", "rejected"]
    by: Actor
    at: datetime
    reason: str | None = None


REQUESTS: Family[ApprovalRequest] = Family(PREFIX, "approval-request", ApprovalRequest,
                                           "requested_by")
DECISIONS: Family[Decision] = Family(PREFIX, "approval-decision", Decision, "by")


def requesting_role(action: Action) -> Role:
    """The role that signs a request for ``action``: a policy change is proposed with
    ``policy``, a move asked for with ``promote``."""
    return "policy" if action == "policy" else "promote"


class InvalidApproval(GateFailed):
    """An approval that cannot authorize this move: another subject, a rejection, the
    requester approving their own request."""


def request_key(request_id: str) -> str:
    return f"{PREFIX}{request_id}/request.json"


def decision_key(request_id: str) -> str:
    return f"{PREFIX}{request_id}/decision.json"


def request_approval(store: RecordStore, *, action: Action, by: Acting,
                     channel: str | None = None, tuple_id: str | None = None,
                     policy_digest: str | None = None, base_digest: str | None = None,
                     requested_for: str | None = None, why: str | None = None,
                     needs: list[str] | None = None,
                     now: datetime | None = None) -> ApprovalRequest:
    """Create a request signed by ``by`` (create-once) and return it; its id names it for
    ``k3a approve``. RoleRefused (exit 9) unless ``by`` holds the role the action asks with."""
    body = dict(action=action, channel=channel, tuple_id=tuple_id, policy_digest=policy_digest,
                base_digest=base_digest, requested_by=by.actor, requested_for=requested_for,
                requested_at=now or datetime.now(UTC), why=why, needs=needs or [])
    draft = ApprovalRequest(id="k3r-" + "0" * 24, **body)  # type: ignore[arg-type]
    rid = "k3r-" + canonical_digest(draft.model_dump(mode="json", exclude={"id"}))[:24]
    request = draft.model_copy(update={"id": rid})
    _, written = create_signed(store, request_key(rid), REQUESTS, request, by=by,
                               roles=[requesting_role(action)])
    if not written:
        raise AlreadyExists(request_key(rid))
    return request


def get_request(store: RecordStore, request_id: str) -> ApprovalRequest:
    """The request ``request_id``, verified: signed by an identity of the policy in force with
    the role its action asks with."""
    if not isinstance(request_id, str) or not request_id.startswith("k3r-"):
        raise ConfigError(f"{request_id!r} is not an approval request id (k3r-<24 hex>)")
    key = request_key(request_id)
    found = store.read(key)
    if found is None:
        raise NotFound(f"no approval request {request_id} in {store.url}",
                       hint="the id is printed by the move or flow that asked for approval")
    trust = record_trust(store)
    # Which role must have signed depends on what is asked; a body edited to ask for
    # something else no longer matches its signature, so reading the action first is safe.
    claimed = parse_signed(found.data, key=key, family=REQUESTS, trust=trust)
    request = parse_signed(found.data, key=key, family=REQUESTS, trust=trust,
                           roles=[requesting_role(claimed.action)])
    if request.id != request_id:
        raise UntrustedRecord(key, "wrong-key", f"the request {request.id}, not {request_id}")
    return request


def get_decision(store: RecordStore, request_id: str) -> Decision | None:
    """The answer to ``request_id``, verified (signed by an identity with the role
    ``approve``), or None while there is none."""
    key = decision_key(request_id)
    found = store.read(key)
    if found is None:
        return None
    decision = parse_signed(found.data, key=key, family=DECISIONS, trust=record_trust(store))
    if decision.request_id != request_id:
        raise UntrustedRecord(key, "wrong-key", f"answers {decision.request_id}, not "
                              f"{request_id}")
    return decision


def already_answered(store: RecordStore, request_id: str) -> Conflict:
    first = get_decision(store, request_id)
    return Conflict(
        f"{request_id} was already {first.decision if first else 'answered'}"
        + (f" by {first.by.label()} at {first.at:%Y-%m-%d %H:%M}" if first else ""),
        hint="a request is answered once; ask for a new one to decide again")


def record_decision(store: RecordStore, decision: Decision, *, by: Acting) -> Decision:
    """Create the answer to its request, signed by ``by``, once: the first answer is the
    answer (Conflict, exit 6, naming it, for any later one)."""
    _, written = create_signed(store, decision_key(decision.request_id), DECISIONS, decision,
                               by=by)
    if not written:
        raise already_answered(store, decision.request_id)
    return decision


def same_identity(decision: Decision, request: ApprovalRequest) -> bool:
    """The answer is signed by the identity that asked (both records are verified: their
    makers are the identities whose keys signed them)."""
    return decision.by.name == request.requested_by.name


def approved(store: RecordStore, request_id: str, *, action: Action, channel: str | None = None,
             tuple_id: str | None = None, policy_digest: str | None = None
             ) -> tuple[ApprovalRequest, Decision]:
    """The request and its approving decision, checked against the subject at hand; raises
    InvalidApproval (exit 5) for a rejection, another subject or an unanswered request."""
    request = get_request(store, request_id)
    wanted = (action, channel, tuple_id, policy_digest)
    got = (request.action, request.channel, request.tuple_id, request.policy_digest)
    if any(w is not None and w != g for w, g in zip(wanted, got, strict=True)):
        raise InvalidApproval(
            f"approval request {request_id} is for {request.subject()}, not this "
            f"{action} ({' '.join(str(w) for w in wanted if w)})",
            hint="ask for an approval of this change")
    decision = get_decision(store, request_id)
    if decision is None:
        raise InvalidApproval(f"{request_id} ({request.subject()}) has no answer yet",
                              hint=f"another release engineer runs `k3a approve {request_id}`")
    if decision.decision == "approved" and same_identity(decision, request):
        raise InvalidApproval(
            f"{request_id} ({request.subject()}) was approved by {decision.by.label()}, who "
            "asked for it: approval needs a second identity",
            hint=f"another release engineer runs `k3a approve {request_id}`")
    if decision.decision != "approved":
        raise InvalidApproval(
            f"{request.subject()} was rejected by {decision.by.label()}"
            + (f": {decision.reason}" if decision.reason else ""),
            hint="nothing was written; address the rejection and request approval again")
    return request, decision
