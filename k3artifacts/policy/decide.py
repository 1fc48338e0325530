"""``k3a approve REQUEST`` (or ``--reject``): answering an approval request, planned, then
recorded.

The plan checks the approver may sign answers (role ``approve``), reads the request (verified:
signed by the identity that asked) and checks the answer may be given: not already answered,
and not an approval by the identity that asked (approval needs a second identity, the two
compared by the keys that sign). The act creates the answer once beside the request, signed by
the approver's key (``policy/approvals.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from k3artifacts.policy.actor import Acting
from k3artifacts.policy.approvals import (
    ApprovalRequest,
    Decision,
    InvalidApproval,
    already_answered,
    get_decision,
    get_request,
    record_decision,
    same_identity,
)
from k3artifacts.policy.signed import require_role
from k3artifacts.stores.records import RecordStore


class DecisionPlan(BaseModel):
    """An answer checked against its request; not recorded yet."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    request: ApprovalRequest
    decision: Decision
    #: Who answers, with the key the answer is signed with (never shown or serialized).
    by: Acting = Field(exclude=True, repr=False)


def plan_decision(store: RecordStore, request_id: str, *, by: Acting, approve: bool,
                  reason: str | None = None, now: datetime | None = None) -> DecisionPlan:
    """Check ``by`` may answer ``request_id``: RoleRefused (exit 9) without the role
    ``approve``, InvalidApproval (exit 5) for the requester approving their own request,
    Conflict (exit 6) when it is answered already, NotFound (exit 7) for no such request."""
    require_role(by, "approval-decision", f"an answer to {request_id}")
    request = get_request(store, request_id)
    decision = Decision(request_id=request_id, decision="approved" if approve else "rejected",
                        by=by.actor, at=now or datetime.now(UTC), reason=reason)
    if approve and same_identity(decision, request):
        raise InvalidApproval(
            f"{by.actor.label()} asked for {request.subject()} ({request_id}) and cannot "
            "approve it",
            hint="approval needs a second identity: another release engineer runs "
            f"`k3a approve {request_id}`")
    if get_decision(store, request_id) is not None:
        raise already_answered(store, request_id)
    return DecisionPlan(request=request, decision=decision, by=by)


def act_decision(store: RecordStore, plan: DecisionPlan) -> Decision:
    """Record the answer, signed (create-once: an answer recorded meanwhile wins, Conflict)."""
    return record_decision(store, plan.decision, by=plan.by)


def decide(store: RecordStore, request_id: str, *, by: Acting, approve: bool,
           reason: str | None = None, now: datetime | None = None) -> Decision:
    """The approve move: :func:`plan_decision`, then :func:`act_decision`."""
    return act_decision(store, plan_decision(store, request_id, by=by, approve=approve,
                                             reason=reason, now=now))


def show_request(store: RecordStore, request_id: str) -> ApprovalRequest:
    """The request as the approver reads it before answering (``k3a approve --show``)."""
    return get_request(store, request_id)
