"""Asking for an approval of a promotion or a rollback: one request builder for every front end.

``k3a promote --request-approval``, ``k3a rollback --request-approval`` and the promote and
rollback flows all record the request through :func:`plan_move_request` and
:func:`act_move_request`, so the same move gets the same record, field for field. The plan is
the move's own (gates for a promotion, judged for nobody yet since the approver will be the
promoter; target and weights for a rollback): a move that would be refused is never put to an
approver, and the request names exactly the tuple the move will go to. What the request asks
is answered by ``k3a approve`` (:mod:`k3artifacts.policy.decide`) under the approver's own
identity.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from k3artifacts.errors import ConfigError
from k3artifacts.policy.actor import Acting, Actor
from k3artifacts.policy.approvals import (
    ApprovalRequest,
    Decision,
    get_decision,
    request_approval,
    requesting_role,
)
from k3artifacts.policy.results import GateResult
from k3artifacts.policy.signed import require_role
from k3artifacts.promotion.moves import plan_promote
from k3artifacts.promotion.rollback import draft_rollback
from k3artifacts.stores.base import Store

__all__ = ["ApprovalRequest", "Decision", "MoveRequestPlan", "act_move_request",
           "plan_move_request", "request_move", "wait_for_answer"]

MoveAction = Literal["promote", "rollback"]


class MoveRequestPlan(BaseModel):
    """The approval request a move would record, and what its plan found."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    action: MoveAction
    channel: str
    #: The tuple the move points the channel at (a rollback's target, decided now).
    tuple_id: str
    #: What the channel serves now.
    serving: str | None
    #: The store's policy that judged the plan.
    policy_digest: str
    policy_version: int
    #: What the approval stands for, in the policy's words (shown to the approver).
    needs: list[str]
    #: The store's policy requires this approval for the move to happen.
    required: bool
    requested_by: Actor
    #: Who asks, with the key the request is signed with (never shown or serialized).
    acting: Acting = Field(exclude=True, repr=False)
    #: A name typed where the request was made (a flow parameter): shown, never an identity.
    requested_for: str | None = None
    why: str | None = None
    #: The plan's gates (a promotion) or checks (a rollback), as judged now.
    gates: list[GateResult]
    #: The channel already points at ``tuple_id``: the move changes nothing, so there is
    #: nothing to ask anyone.
    unchanged: bool = False


def plan_move_request(store: Store, action: MoveAction, channel: str, *,
                      tuple_id: str | None = None, overrides: Mapping[str, str] | None = None,
                      requested_by: Acting, requested_for: str | None = None,
                      why: str | None = None) -> MoveRequestPlan:
    """Plan the move, then the request for it; writes nothing. ``tuple_id`` is the tuple to
    promote, or a rollback's ``--to`` (None: the previous distinct tuple). RoleRefused (exit
    9) for an asker without the role ``promote``; then what the move's own plan raises (a
    failed gate, a target that never served the channel...)."""
    require_role(requested_by, "approval-request", f"asking for a {action} of {channel}",
                 roles=[requesting_role(action)])
    if action == "promote":
        if tuple_id is None:
            raise ConfigError("a promotion request names the tuple to promote")
        promote = plan_promote(store, tuple_id, channel, acting=None, overrides=overrides)
        gates = promote.policy.document.gates.channels[channel].gates
        return MoveRequestPlan(
            action=action, channel=channel, tuple_id=tuple_id, serving=promote.state.tuple_id,
            policy_digest=promote.policy.digest, policy_version=promote.policy.version,
            required=False, requested_by=requested_by.actor, acting=requested_by,
            needs=["separation_of_duties"] if "separation_of_duties" in gates else [],
            requested_for=requested_for, why=why, gates=promote.gates,
            unchanged=promote.unchanged)
    rollback = draft_rollback(store, channel, to=tuple_id, acting=requested_by, reason=why)
    return MoveRequestPlan(
        action=action, channel=channel, tuple_id=rollback.tuple_id,
        serving=rollback.state.tuple_id, policy_digest=rollback.policy.digest,
        policy_version=rollback.policy.version, required=rollback.approval_required,
        requested_by=requested_by.actor, acting=requested_by,
        needs=["rollback_approval"] if rollback.approval_required else [],
        requested_for=requested_for, why=why, gates=rollback.checks,
        unchanged=rollback.target is None)


def act_move_request(store: Store, plan: MoveRequestPlan) -> ApprovalRequest:
    """Record the request (create-once), signed by who asks (role ``promote``); its id is what
    ``k3a approve`` answers. A move that changes nothing is not put to anyone (ConfigError,
    exit 9)."""
    if plan.unchanged:
        raise ConfigError(f"{plan.channel} already points at {plan.tuple_id}: nothing to "
                          "approve", hint=f"see `k3a channel history {plan.channel}`")
    return request_approval(
        store, action=plan.action, by=plan.acting, channel=plan.channel,
        tuple_id=plan.tuple_id, policy_digest=plan.policy_digest,
        requested_for=plan.requested_for, why=plan.why, needs=plan.needs)


def request_move(store: Store, action: MoveAction, channel: str, *, tuple_id: str | None = None,
                 overrides: Mapping[str, str] | None = None, requested_by: Acting,
                 requested_for: str | None = None,
                 why: str | None = None) -> tuple[MoveRequestPlan, ApprovalRequest]:
    """The request move: :func:`plan_move_request`, then :func:`act_move_request`."""
    plan = plan_move_request(store, action, channel, tuple_id=tuple_id, overrides=overrides,
                             requested_by=requested_by, requested_for=requested_for, why=why)
    return plan, act_move_request(store, plan)


def wait_for_answer(store: Store, request_id: str, *, timeout: float,
                    poll_interval: float) -> Decision | None:
    """Poll the store for the request's answer; None when ``timeout`` seconds pass without
    one."""
    deadline = time.monotonic() + timeout
    while True:
        decision = get_decision(store, request_id)
        if decision is not None or time.monotonic() >= deadline:
            return decision
        time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
