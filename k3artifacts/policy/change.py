"""Changing the store's policy, each change planned, then recorded: ``k3a policy init``
(the first version), ``propose DIR`` (a document and an approval request naming what it
loosens) and ``apply REQUEST`` (the proposal in force, judged by the version it replaces).

The records and the compare-and-swap of the version in force are :mod:`.record`'s; what a
change loosens is :mod:`.loosening`'s. ``k3a policy show`` and ``history`` read through
:func:`policy_in_force` and :func:`policy_history`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

from k3artifacts.errors import ConfigError, Conflict
from k3artifacts.policy.actor import Acting, Actor
from k3artifacts.policy.approvals import (
    ApprovalRequest,
    InvalidApproval,
    approved,
    get_request,
    request_approval,
)
from k3artifacts.policy.document import IDENTITIES_FILE, PolicyDocument
from k3artifacts.policy.loosening import loosening
from k3artifacts.policy.record import (
    InForce,
    PolicyChange,
    changes,
    commit_change,
    ensure_seeded,
    in_force,
    packaged_document,
    read_document,
    seed,
    seeding_document,
    store_document,
)
from k3artifacts.stores.records import RecordStore


class _Plan(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)


class InitPlan(_Plan):
    document: PolicyDocument
    by: Acting
    why: str | None


class ProposePlan(_Plan):
    document: PolicyDocument
    #: The policy the proposal would replace.
    current: InForce
    loosens: list[str]
    by: Acting
    why: str | None
    when: datetime


class ApplyPlan(_Plan):
    request: ApprovalRequest
    document: PolicyDocument
    current: InForce
    loosens: list[str]
    #: The second identity that approved a loosening change; None when it only tightens.
    approved_by: Actor | None
    by: Acting
    when: datetime


def policy_in_force(store: RecordStore) -> InForce:
    """The policy that judges moves on ``store`` (the packaged defaults, version 0, until the
    store records one)."""
    return in_force(store)


def policy_history(store: RecordStore) -> list[PolicyChange]:
    """Every recorded version of the store's policy, oldest first."""
    return changes(store)


def plan_init(store: RecordStore, document: PolicyDocument | None, *, by: Acting,
              why: str | None = None) -> InitPlan:
    """The store's first policy: ``document``, or the packaged defaults, naming the root's
    identities where it names none (:func:`~.record.seeding_document`). Conflict (exit 6)
    when the store already has one (a change is proposed instead)."""
    current = in_force(store)
    if current.version != 0 or by.seeding is None:
        raise Conflict(
            f"{store.url} already has a policy ({current.label()}); a change is proposed and "
            "applied, never seeded over", hint="`k3a policy propose DIR`")
    return InitPlan(document=seeding_document(document or packaged_document(), by), by=by,
                    why=why)


def act_init(store: RecordStore, plan: InitPlan) -> InForce:
    return seed(store, plan.document, acting=plan.by, why=plan.why)


def init_policy(store: RecordStore, document: PolicyDocument | None, *, by: Acting,
                why: str | None = None) -> InForce:
    """The init move: :func:`plan_init`, then :func:`act_init`."""
    return act_init(store, plan_init(store, document, by=by, why=why))


def _held(store: RecordStore, planned: InForce, by: Acting) -> InForce:
    """The version ``planned`` as the store holds it: a store still on the packaged defaults
    records them first (first use). Conflict when another version got there meanwhile."""
    if planned.version:
        current = planned
    else:
        expected = seeding_document(planned.document, by)
        current = ensure_seeded(store, acting=by, document=expected)
        planned = InForce(1, expected.digest, expected)
    if current.digest != planned.digest:
        raise Conflict(f"the store's policy became {current.label()} while this change was "
                       f"planned against {planned.label()}; nothing was proposed",
                       hint="review `k3a policy show` and run it again")
    return current


def plan_propose(store: RecordStore, document: PolicyDocument, *, by: Acting,
                 why: str | None = None, now: datetime | None = None) -> ProposePlan:
    """What proposing ``document`` would ask: ConfigError (exit 9) when it is the policy in
    force already. A document that names no identities keeps the ones in force (a copy of the
    packaged ``policies/`` changes the gates, not who may sign); nobody could act on a policy
    that named none."""
    current = in_force(store)
    base = current.document if current.version else seeding_document(current.document, by)
    if not document.identities.identities and IDENTITIES_FILE in base.files:
        document = document.with_file(IDENTITIES_FILE, base.files[IDENTITIES_FILE])
    if document.digest == base.digest:
        raise ConfigError(f"the proposed policy is the one in force ({current.label()})",
                          hint="nothing to change")
    return ProposePlan(document=document, current=current, loosens=loosening(base, document),
                       by=by, why=why, when=now or datetime.now(UTC))


def act_propose(store: RecordStore, plan: ProposePlan) -> ApprovalRequest:
    """Store the document (create-once, by digest) and the approval request for it."""
    current = _held(store, plan.current, plan.by)
    store_document(store, plan.document)
    return request_approval(
        store, action="policy", by=plan.by, policy_digest=plan.document.digest,
        base_digest=current.digest, why=plan.why, needs=plan.loosens, now=plan.when)


def propose(store: RecordStore, document: PolicyDocument, *, by: Acting, why: str | None = None,
            now: datetime | None = None) -> tuple[ApprovalRequest, InForce]:
    """The propose move: :func:`plan_propose`, then :func:`act_propose`; returns the request
    and the policy it would replace."""
    plan = plan_propose(store, document, by=by, why=why, now=now)
    return act_propose(store, plan), plan.current


def plan_apply(store: RecordStore, request_id: str, *, by: Acting,
               now: datetime | None = None) -> ApplyPlan:
    """Judge the proposal ``request_id`` by the policy in force: InvalidApproval (exit 5) for
    a request that is not a policy change, or a loosening change without an approval by
    another identity; Conflict (exit 6) when the policy changed since the proposal."""
    request = get_request(store, request_id)
    if request.action != "policy" or request.policy_digest is None:
        raise InvalidApproval(f"{request_id} is a request for {request.subject()}, "
                              "not a policy change")
    current = in_force(store)
    if request.base_digest != current.digest:
        raise Conflict(
            f"{request_id} was proposed against policy {str(request.base_digest)[:12]}, but "
            f"{current.label()} is in force now; nothing was written",
            hint="propose the change again against the policy in force")
    document = read_document(store, request.policy_digest)
    loosens = loosening(current.document, document)
    approver = None
    if loosens:
        # decide() refuses the proposer's own approval: this is the second identity.
        _, decision = approved(store, request_id, action="policy",
                               policy_digest=request.policy_digest)
        approver = decision.by
    return ApplyPlan(request=request, document=document, current=current, loosens=loosens,
                     approved_by=approver, by=by, when=now or datetime.now(UTC))


def act_apply(store: RecordStore, plan: ApplyPlan) -> InForce:
    """Put the proposal in force (compare-and-swap against the version the plan judged by)."""
    current = _held(store, plan.current, plan.by)
    change = PolicyChange(
        version=current.version + 1, digest=plan.document.digest, previous_digest=current.digest,
        action="change", by=plan.by.actor, at=plan.when, why=plan.request.why,
        request_id=plan.request.id, proposed_by=plan.request.requested_by,
        approved_by=plan.approved_by, loosens=plan.loosens)
    return commit_change(store, current, change)


def apply(store: RecordStore, request_id: str, *, by: Acting,
          now: datetime | None = None) -> InForce:
    """The apply move: :func:`plan_apply`, then :func:`act_apply`."""
    return act_apply(store, plan_apply(store, request_id, by=by, now=now))
