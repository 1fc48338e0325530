"""Approvals with an identity: a request, and at most one decision answering it.

A move or policy change that needs someone's approval creates a **request** in the store
(what would change, who asks, the policy digest in force); the approver answers it with
``k3a approve REQUEST`` (or ``--reject``; the move is :mod:`.decide`), under their own identity
(``policy/actor.py``), and the answer is created once beside it: the first answer is the
answer. A form field, a flow
parameter or any other typed name is never an approver. Keys::

    releases/approvals/<request-id>/request.json     create-once
    releases/approvals/<request-id>/decision.json    create-once
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k3artifacts.canonical import canonical_digest, canonical_json
from k3artifacts.errors import AlreadyExists, ConfigError, Conflict, GateFailed, NotFound
from k3artifacts.policy.actor import Actor
from k3artifacts.stores.records import RecordStore

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


class InvalidApproval(GateFailed):
    """An approval that cannot authorize this move: another subject, a rejection, the
    requester approving their own request."""


def request_key(request_id: str) -> str:
    return f"{PREFIX}{request_id}/request.json"


def decision_key(request_id: str) -> str:
    return f"{PREFIX}{request_id}/decision.json"


def request_approval(store: RecordStore, *, action: Action, by: Actor, channel: str | None = None,
                     tuple_id: str | None = None, policy_digest: str | None = None,
                     base_digest: str | None = None, requested_for: str | None = None,
                     why: str | None = None, needs: list[str] | None = None,
                     now: datetime | None = None) -> ApprovalRequest:
    """Create a request (create-once) and return it; its id names it for ``k3a approve``."""
    body = dict(action=action, channel=channel, tuple_id=tuple_id, policy_digest=policy_digest,
                base_digest=base_digest, requested_by=by, requested_for=requested_for,
                requested_at=now or datetime.now(UTC), why=why, needs=needs or [])
    draft = ApprovalRequest(id="k3r-" + "0" * 24, **body)  # type: ignore[arg-type]
    rid = "k3r-" + canonical_digest(draft.model_dump(mode="json", exclude={"id"}))[:24]
    request = draft.model_copy(update={"id": rid})
    store.create(request_key(rid), canonical_json(request))
    return request


def _read(store: RecordStore, key: str, model: type[BaseModel]):  # type: ignore[no-untyped-def]
    found = store.read(key)
    if found is None:
        return None
    try:
        return model.model_validate_json(found.data)
    except ValidationError as exc:
        raise ConfigError(f"{key} in {store.url} is malformed: {exc.errors()[0]['msg']}",
                          hint="approval records are written only by k3a") from None


def get_request(store: RecordStore, request_id: str) -> ApprovalRequest:
    if not isinstance(request_id, str) or not request_id.startswith("k3r-"):
        raise ConfigError(f"{request_id!r} is not an approval request id (k3r-<24 hex>)")
    request = _read(store, request_key(request_id), ApprovalRequest)
    if request is None or request.id != request_id:
        raise NotFound(f"no approval request {request_id} in {store.url}",
                       hint="the id is printed by the move or flow that asked for approval")
    return request


def get_decision(store: RecordStore, request_id: str) -> Decision | None:
    decision = _read(store, decision_key(request_id), Decision)
    if decision is not None and decision.request_id != request_id:
        raise ConfigError(f"{decision_key(request_id)} answers {decision.request_id}")
    return decision


def already_answered(store: RecordStore, request_id: str) -> Conflict:
    first = get_decision(store, request_id)
    return Conflict(
        f"{request_id} was already {first.decision if first else 'answered'}"
        + (f" by {first.by.label()} at {first.at:%Y-%m-%d %H:%M}" if first else ""),
        hint="a request is answered once; ask for a new one to decide again")


def record_decision(store: RecordStore, decision: Decision) -> Decision:
    """Create the answer to its request, once: the first answer is the answer (Conflict,
    exit 6, naming it, for any later one)."""
    try:
        store.create(decision_key(decision.request_id), canonical_json(decision))
    except AlreadyExists:
        raise already_answered(store, decision.request_id) from None
    return decision


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
    if decision.decision != "approved":
        raise InvalidApproval(
            f"{request.subject()} was rejected by {decision.by.label()}"
            + (f": {decision.reason}" if decision.reason else ""),
            hint="nothing was written; address the rejection and request approval again")
    return request, decision
