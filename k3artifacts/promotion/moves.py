"""Promote a tuple onto a channel through its gates: planned, then acted.

:func:`plan_promote` reads every record the move needs (the store's policy, the approval, the
tuple, the channel) and runs every gate and check; a refusal (a failed gate, an approval of
another move, weights gone or being retired by gc) is raised from there, before anything is
written. :func:`act_promote` takes that plan, pins the weights, checks they are still there and
compare-and-swaps the channel pointer (see :mod:`k3artifacts.releases.channels`); no weight
byte moves. ``k3a gates`` is the plan alone. Rollback is :mod:`.rollback`; what both share
(the approval record, the history entry, the commit) is here.

Moves are idempotent: asking for the tuple the channel already points at changes nothing and
succeeds, so a retried flow task does not fail on its own earlier success.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

from k3artifacts.errors import ConfigError, Conflict, GateFailed, NotFound
from k3artifacts.policy.actor import Acting, Actor
from k3artifacts.policy.approvals import approved
from k3artifacts.policy.gates import Verdict, apply_overrides, check_overrides
from k3artifacts.policy.record import InForce, ensure_seeded, in_force, seeding_document
from k3artifacts.policy.results import GateReport, GateResult
from k3artifacts.promotion.gates import channel_policy, judging, run_gates
from k3artifacts.releases.channels import (
    Approval,
    ChannelMoved,
    ChannelPointer,
    ChannelState,
    HistoryEntry,
    check_channel,
    commit_move,
    read_state,
)
from k3artifacts.releases.retirement import check_not_retiring, pinned
from k3artifacts.releases.tuples import ReleaseTuple, TupleStore, check_tuple_id
from k3artifacts.revisions.manifest import manifest_key
from k3artifacts.stores.base import Store


class MoveResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    channel: str
    tuple_id: str
    previous_tuple_id: str | None
    #: False: the channel already pointed at ``tuple_id``; nothing was written.
    changed: bool
    #: The history entry that made ``tuple_id`` current (ours, or the earlier one if unchanged).
    entry: HistoryEntry
    gates: list[GateResult]
    #: Overrides given for gates that passed anyway; not recorded.
    unused_overrides: list[str] = []


class ApprovalNeeded(GateFailed):
    """The store's policy wants an approval record for this move and none was given."""


@dataclass(frozen=True)
class Granted:
    """An approval record as the history entry records it, and who decided."""

    approval: Approval
    approver: Actor


@dataclass(frozen=True)
class PromotePlan:
    """A promotion judged and checked; nothing written yet."""

    tuple_id: str
    channel: str
    release: ReleaseTuple
    #: The policy that judged (a version of the store's, or the packaged defaults).
    policy: InForce
    report: GateReport
    verdict: Verdict
    #: The channel as judged: the compare-and-swap expects exactly this pointer.
    state: ChannelState
    #: Who moves. None: judged for nobody (a flow before its approval); such a plan is shown,
    #: or asked about, never acted on.
    acting: Acting | None
    granted: Granted | None
    reason: str | None
    when: datetime

    @property
    def gates(self) -> list[GateResult]:
        return self.verdict.gates

    @property
    def unchanged(self) -> bool:
        return self.state.tuple_id == self.tuple_id


def now_or(now: datetime | None) -> datetime:
    return now or datetime.now(UTC)


def granted_approval(store: Store, request_id: str | None, *, action: str, channel: str,
                     tuple_id: str | None) -> Granted | None:
    """The approval record ``request_id``, checked against the move at hand (its subject, an
    approving answer) and read from the store, never from the caller."""
    if request_id is None:
        return None
    request, decision = approved(store, request_id, action=action,  # type: ignore[arg-type]
                                 channel=channel, tuple_id=tuple_id)
    return Granted(Approval(who=decision.by.name, who_source=decision.by.source,
                            decision=decision.decision, reason=decision.reason, when=decision.at,
                            request_id=request.id), decision.by)


def weights_in_store(store: Store, release: ReleaseTuple) -> None:
    """NotFound unless the tuple's manifest is in the store."""
    w = release.binding.weights
    if store.read(manifest_key(w.repo_id, w.commit)) is None:
        raise NotFound(
            f"the weights of {release.id} ({w.repo_id}@{w.commit}) are not in {store.url}",
            hint=f"re-stage them: `k3a stage {w.repo_id} --revision {w.commit}`",
        )


def plan_promote(
    store: Store,
    tuple_id: str,
    channel: str,
    *,
    acting: Acting | None,
    reason: str | None = None,
    overrides: Mapping[str, str] | None = None,
    approval: str | None = None,
    now: datetime | None = None,
) -> PromotePlan:
    """Judge moving ``channel`` onto ``tuple_id`` by the gates the store's policy requires of
    it; write nothing.

    ``acting`` is who moves, resolved by ``policy/acting.py``: an identity of the store's
    policy holding the role ``promote`` (RoleRefused, exit 9, otherwise). ``approval`` is an
    approval request id (``k3a approve``): its record must answer this move, and the approver is
    then the promoter the separation_of_duties gate judges. ``now`` is the move's time, the one the
    promotion_order gate measures against.

    Raises GatesRefused (exit 5) listing every failed gate with the whole report, GateFailed
    (exit 5) for a rejected or unrelated approval, RevisionRetiring (exit 6) when ``k3a
    revision gc`` is deleting the weights, NotFound (exit 7) for an unknown tuple, a channel the
    policy does not configure or weights gone, ConfigError (exit 9) for a bad override,
    PointerMismatch (exit 4) for a hand-edited pointer.
    """
    check_channel(channel)
    check_tuple_id(tuple_id)
    if acting is not None:
        acting.require("promote", f"moving {channel}")
    policy = in_force(store)
    chan = channel_policy(policy, channel)
    overrides = dict(overrides or {})
    check_overrides(chan.gates, channel, overrides)
    granted = granted_approval(store, approval, action="promote", channel=channel,
                               tuple_id=tuple_id)
    # With an approval record, the person who decided is the approver: the one the
    # separation_of_duties gate judges (the mover may be a flow's service identity).
    decider = (None if acting is None else acting.actor) if granted is None \
        else granted.approver
    release = TupleStore(store).get(tuple_id)
    w = release.binding.weights
    check_not_retiring(store, w.repo_id, w.commit)
    # The channel judged must be the one its verified history explains.
    state = read_state(store, channel, policy=policy)
    state.require_signed()
    when = now_or(now)
    with judging(store, release, channel, policy, decider, when) as ctx:
        report = run_gates(ctx, policy)
    verdict = apply_overrides(chan.gates, report, overrides)
    # Whatever the gates said (an overridden artifact gate included), the weights must be there.
    weights_in_store(store, release)
    return PromotePlan(tuple_id=tuple_id, channel=channel, release=release, policy=policy,
                       report=report, verdict=verdict, state=state, acting=acting,
                       granted=granted, reason=reason, when=when)


def mover(acting: Acting | None, what: str) -> Acting:
    if acting is None:
        raise ConfigError(f"{what} was planned for nobody (a dry run); it cannot be carried out",
                          hint="plan it again with the identity that moves the channel")
    return acting


def act_promote(store: Store, plan: PromotePlan) -> MoveResult:
    """Carry out ``plan``: pin the weights (``releases/retirement.py``), check them again
    under the pin, record the policy that judged if the store holds none yet, and
    compare-and-swap the pointer. Conflict/ChannelMoved (exit 6) names the winner when the
    channel moved since the plan read it; nothing is written then."""
    acting = mover(plan.acting, f"the promotion of {plan.tuple_id} to {plan.channel}")
    if plan.unchanged:
        assert plan.state.pointer is not None
        return unchanged(plan.state.pointer, plan.gates)
    w = plan.release.binding.weights
    # The pin keeps `k3a revision gc` off these weights until the pointer references them; it
    # refuses here if gc started retiring them since the plan.
    with pinned(store, w.repo_id, w.commit, who=acting.name, why=f"promote to {plan.channel}"):
        weights_in_store(store, plan.release)  # read under the pin: what the protocol needs
        policy = recorded(store, plan.policy, acting)
        entry = history_entry(plan.state, action="promote", tuple_id=plan.tuple_id,
                              actor=acting.actor,
                              when=plan.when, why=plan.reason, gates=plan.gates, policy=policy,
                              granted=plan.granted, overrides=plan.verdict.used)
        return commit(store, plan.state, entry, plan.gates, plan.verdict.unused, acting)


def promote(
    store: Store,
    tuple_id: str,
    channel: str,
    *,
    acting: Acting,
    reason: str | None = None,
    overrides: Mapping[str, str] | None = None,
    approval: str | None = None,
    now: datetime | None = None,
) -> MoveResult:
    """The promotion move: :func:`plan_promote`, then :func:`act_promote`."""
    return act_promote(store, plan_promote(store, tuple_id, channel, acting=acting, reason=reason,
                                           overrides=overrides, approval=approval, now=now))


def unchanged(pointer: ChannelPointer, gates: list[GateResult]) -> MoveResult:
    entry = pointer.entry
    return MoveResult(
        channel=pointer.channel,
        tuple_id=entry.tuple_id,
        previous_tuple_id=entry.previous_tuple_id,
        changed=False,
        entry=entry,
        gates=gates,
    )


def recorded(store: Store, judged: InForce, acting: Acting) -> InForce:
    """The policy that judged, as a version the store holds: a store still on the packaged
    defaults records them now, just before the move that needs them (a refused move writes
    nothing), naming ``acting``'s root as its identities (first use). Refuses if another
    version got there first: the move must be judged again."""
    if judged.version != 0:
        return judged
    expected = seeding_document(judged.document, acting)
    seeded = ensure_seeded(store, acting=acting, document=expected)
    if seeded.digest != expected.digest:
        raise Conflict(
            f"the store's policy became {seeded.label()} while this move was judged by "
            f"{judged.label()}; nothing was written", hint="run the move again")
    return seeded


def history_entry(state: ChannelState, *, action: str, tuple_id: str, actor: Actor,
                  when: datetime, why: str | None, gates: list[GateResult], policy: InForce,
                  granted: Granted | None, overrides=()) -> HistoryEntry:  # type: ignore[no-untyped-def]
    return HistoryEntry(
        channel=state.channel, seq=state.next_seq, action=action,  # type: ignore[arg-type]
        tuple_id=tuple_id, previous_tuple_id=state.tuple_id, who=actor.name,
        who_source=actor.source, who_account=actor.account, when=when, why=why, gates=gates,
        overrides=list(overrides), approval=None if granted is None else granted.approval,
        policy_digest=policy.digest, policy_version=policy.version,
    )


def commit(store: Store, state: ChannelState, entry: HistoryEntry, gates: list[GateResult],
           unused: list[str], acting: Acting) -> MoveResult:
    try:
        pointer = commit_move(store, state, entry, acting=acting)
    except ChannelMoved as lost:
        if lost.winner is not None and lost.winner.tuple_id == entry.tuple_id:
            # Someone moved it where we wanted it: the goal holds, report their entry.
            return unchanged(lost.winner, gates)
        raise
    return MoveResult(
        channel=state.channel,
        tuple_id=entry.tuple_id,
        previous_tuple_id=entry.previous_tuple_id,
        changed=True,
        entry=pointer.entry,
        gates=gates,
        unused_overrides=unused,
    )
