"""Changing the store's policy, each change planned, then recorded: ``k3a policy init``
(the first version), ``propose DIR`` (a document, an approval request naming what it loosens,
and the change signed by the proposer if a root identity), ``k3a approve REQUEST`` for a
policy change (:func:`answer`: the decision, and the approver's signature on the change if a
root identity) and ``apply REQUEST`` (the change in force, signed by the applier too if a
root identity, once it carries the signatures it needs).

What a change needs is the root's: the threshold of its identities' signatures, or one where
the change is provably stricter than the version in force (nothing :mod:`.loosening` finds).
The records and the history are :mod:`.record`'s, the signatures a proposal collects
:mod:`.proposal`'s. ``k3a policy show`` and ``history`` read through :func:`policy_in_force`
and :func:`policy_history`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

from k3artifacts.errors import ConfigError, Conflict, MigrationNeeded
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.approvals import (
    ApprovalRequest,
    Decision,
    InvalidApproval,
    get_request,
    request_approval,
)
from k3artifacts.policy.decide import act_decision, plan_decision
from k3artifacts.policy.document import IDENTITIES_FILE, PolicyDocument
from k3artifacts.policy.loosening import loosening
from k3artifacts.policy.proposal import Pending, assent, pending
from k3artifacts.policy.record import (
    InForce,
    Recorded,
    changes,
    ensure_seeded,
    in_force,
    packaged_document,
    read_document,
    renewed,
    seed,
    seeding_document,
    store_document,
)
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.chain import append_record


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
    #: The root identities whose signatures it will carry (the applier's included).
    signers: frozenset[str]
    by: Acting


def policy_in_force(store: RecordStore) -> InForce:
    """The policy that judges moves on ``store`` (the packaged defaults, version 0, until the
    store records one)."""
    return in_force(store)


def policy_history(store: RecordStore) -> list[Recorded]:
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
    that named none. RoleRefused (exit 9), before anything is read further, when ``by`` may not
    propose policy changes."""
    by.require("policy", "proposing a policy change")
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
    """Store the document (create-once, by digest), the approval request for it, and the
    change signed by the proposer if a root identity."""
    current = _held(store, plan.current, plan.by)
    store_document(store, plan.document)
    request = request_approval(
        store, action="policy", by=plan.by, policy_digest=plan.document.digest,
        base_digest=current.digest, why=plan.why, needs=plan.loosens, now=plan.when)
    assent(store, request, current, plan.by)
    return request


def propose(store: RecordStore, document: PolicyDocument, *, by: Acting, why: str | None = None,
            now: datetime | None = None) -> tuple[ApprovalRequest, InForce]:
    """The propose move: :func:`plan_propose`, then :func:`act_propose`; returns the request
    and the policy it would replace."""
    plan = plan_propose(store, document, by=by, why=why, now=now)
    return act_propose(store, plan), plan.current


def _proposed(store: RecordStore, request_id: str) -> tuple[ApprovalRequest, InForce]:
    """A policy change's request and the version it was proposed against, in force still."""
    request = get_request(store, request_id)
    if request.action != "policy" or request.policy_digest is None:
        raise InvalidApproval(f"{request_id} is a request for {request.subject()}, "
                              "not a policy change")
    current = in_force(store)
    if current.legacy:
        raise MigrationNeeded(f"the policy of {store.url} predates signed records")
    if request.base_digest != current.digest:
        raise Conflict(
            f"{request_id} was proposed against policy {str(request.base_digest)[:12]}, but "
            f"{current.label()} is in force now; nothing was written",
            hint="propose the change again against the policy in force")
    return request, current


def plan_apply(store: RecordStore, request_id: str, *, by: Acting) -> ApplyPlan:
    """Judge the proposal ``request_id`` by the policy in force and its root: InvalidApproval
    (exit 5) for a request that is not a policy change, or one without the root identities'
    signatures it needs (the applier's counted); Conflict (exit 6) when the policy changed
    since the proposal."""
    request, current = _proposed(store, request_id)
    document = read_document(store, str(request.policy_digest))
    loosens = loosening(current.document, document)
    assert current.roots is not None
    root = current.roots.current
    found = pending(store, request, current)
    me = root.identity_of(by.signer)
    signers = (frozenset() if found is None else found.signers) | ({me} if me else set())
    need = root.needs(stricter=not loosens)
    if len(signers) < need:
        what = "it loosens the policy" if loosens else "it only tightens the policy"
        raise InvalidApproval(
            f"{request_id} needs {need} root identit{'y' if need == 1 else 'ies'} of root "
            f"v{root.version} ({', '.join(root.identities)}) to sign it ({what}); signed by "
            f"{', '.join(sorted(signers)) or 'none'}; nothing was written",
            hint=f"another root identity approves it (`k3a approve {request_id}` signs it), "
            f"then `k3a policy apply {request_id}`")
    return ApplyPlan(request=request, document=document, current=current, loosens=loosens,
                     signers=signers, by=by)


def act_apply(store: RecordStore, plan: ApplyPlan) -> InForce:
    """Put the proposal in force with the signatures it carries (and the applier's):
    compare-and-swap of the history's head against the version the plan judged by."""
    signed: Pending | None = assent(store, plan.request, plan.current, plan.by) \
        or pending(store, plan.request, plan.current)
    assert signed is not None and plan.current.chain is not None
    try:
        append_record(store, plan.current.chain, signed.data)
    except Conflict:
        now = in_force(store)
        raise Conflict(
            f"the policy of {store.url} changed to {now.label()} while this change was made; "
            "nothing was written",
            hint="review `k3a policy show` and propose again against it") from None
    return renewed(store, plan.by.signer)


def apply(store: RecordStore, request_id: str, *, by: Acting) -> InForce:
    """The apply move: :func:`plan_apply`, then :func:`act_apply`."""
    return act_apply(store, plan_apply(store, request_id, by=by))


def answer(store: RecordStore, request_id: str, *, by: Acting, approve: bool,
           reason: str | None = None) -> tuple[Decision, frozenset[str]]:
    """``k3a approve`` (or ``--reject``): the decision (:mod:`.decide`), and, approving a
    policy change, ``by``'s signature on it if a root identity. Returns the decision and the
    root identities the change carries now (empty for any other request)."""
    plan = plan_decision(store, request_id, by=by, approve=approve, reason=reason)
    policy = approve and plan.request.action == "policy"
    current = _proposed(store, request_id)[1] if policy else None
    decision = act_decision(store, plan)
    if current is None:
        return decision, frozenset()
    signed = assent(store, plan.request, current, by) or pending(store, plan.request, current)
    return decision, frozenset() if signed is None else signed.signers
