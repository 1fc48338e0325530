"""``k3a approve REQUEST`` (or ``--reject``): answering an approval request, planned, then
recorded.

The plan reads the request and checks the answer may be given: not already answered, and not
an approval by the identity that asked (approval needs a second identity). The act creates
the answer once beside the request (``policy/approvals.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

from k3artifacts.policy.actor import Actor
from k3artifacts.policy.approvals import (
    ApprovalRequest,
    Decision,
    InvalidApproval,
    already_answered,
    get_decision,
    get_request,
    record_decision,
)
from k3artifacts.stores.records import RecordStore


class DecisionPlan(BaseModel):
    """An answer checked against its request; not recorded yet."""

    model_config = ConfigDict(frozen=True)

    request: ApprovalRequest
    decision: Decision


def plan_decision(store: RecordStore, request_id: str, *, by: Actor, approve: bool,
                  reason: str | None = None, now: datetime | None = None) -> DecisionPlan:
    """Check ``by`` may answer ``request_id``: InvalidApproval (exit 5) for the requester
    approving their own request, Conflict (exit 6) when it is answered already, NotFound
    (exit 7) for no such request."""
    request = get_request(store, request_id)
    if approve and by.identities() & request.requested_by.identities():
        raise InvalidApproval(
            f"{by.label()} asked for {request.subject()} ({request_id}) and cannot approve it",
            hint="approval needs a second identity: another release engineer runs "
            f"`k3a approve {request_id}`")
    if get_decision(store, request_id) is not None:
        raise already_answered(store, request_id)
    return DecisionPlan(request=request, decision=Decision(
        request_id=request_id, decision="approved" if approve else "rejected", by=by,
        at=now or datetime.now(UTC), reason=reason))


def act_decision(store: RecordStore, plan: DecisionPlan) -> Decision:
    """Record the answer (create-once: an answer recorded meanwhile wins, Conflict)."""
    return record_decision(store, plan.decision)


def decide(store: RecordStore, request_id: str, *, by: Actor, approve: bool,
           reason: str | None = None, now: datetime | None = None) -> Decision:
    """The approve move: :func:`plan_decision`, then :func:`act_decision`."""
    return act_decision(store, plan_decision(store, request_id, by=by, approve=approve,
                                             reason=reason, now=now))


def show_request(store: RecordStore, request_id: str) -> ApprovalRequest:
    """The request as the approver reads it before answering (``k3a approve --show``)."""
    return get_request(store, request_id)
