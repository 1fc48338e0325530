"""Roll a channel back to a tuple it served before: planned, then acted; no weight byte moves.

:func:`rollback_target` is the one decision of where a rollback goes (``--to``, or the
previous distinct tuple in the channel's history); the single-node procedure, the approval
request and the flows all ask it. :func:`draft_rollback` plans everything but the approval (what
an approval request asks about); :func:`plan_rollback` adds the approval the store's policy
requires; :func:`act_rollback` pins the weights, checks them again and compare-and-swaps the
pointer.

Gates are not re-run (the target passed them, or was overridden, to serve this channel); what
is checked is that its weights are still in the store with the digest the tuple binds, by one
manifest read: the cost does not grow with the size of the release.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime

from k3artifacts.errors import NotFound, VerifyMismatch
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.record import InForce, in_force
from k3artifacts.policy.results import GateResult
from k3artifacts.promotion.moves import (
    ApprovalNeeded,
    Granted,
    MoveResult,
    commit,
    granted_approval,
    history_entry,
    now_or,
    recorded,
    unchanged,
)
from k3artifacts.releases.channels import (
    ChannelState,
    HistoryEntry,
    check_channel,
    read_state,
    unknown_channel,
)
from k3artifacts.releases.retirement import check_not_retiring, pinned
from k3artifacts.releases.tuples import ReleaseTuple, TupleStore, check_tuple_id, tuple_manifest
from k3artifacts.revisions.manifest import manifest_key
from k3artifacts.stores.base import Store


@dataclass(frozen=True)
class RollbackPlan:
    """A rollback decided and checked; nothing written yet."""

    channel: str
    #: The channel as read: the compare-and-swap expects exactly this pointer.
    state: ChannelState
    policy: InForce
    #: The history entry of the target's stint on the channel; None: the channel is there.
    target: HistoryEntry | None
    release: ReleaseTuple | None
    #: The rollback's one check (weights present with the bound manifest digest).
    check: GateResult | None
    #: The store's policy sets ``rollback_approval`` for the channel.
    approval_required: bool
    granted: Granted | None
    acting: Acting
    reason: str | None
    when: datetime

    @property
    def tuple_id(self) -> str:
        """Where the channel points once the plan is carried out."""
        if self.target is not None:
            return self.target.tuple_id
        assert self.state.tuple_id is not None
        return self.state.tuple_id

    @property
    def checks(self) -> list[GateResult]:
        return [] if self.check is None else [self.check]


def rollback_target(state: ChannelState, to: str | None) -> HistoryEntry | None:
    """The history entry a rollback of ``state``'s channel returns to: ``to``'s, or the newest
    entry of another tuple than the current one (so two rollbacks in a row swap back, like an
    undo); None when ``to`` is where the channel already is. NotFound when ``to`` never served
    the channel or there is nothing to go back to. Only the entries of ``state``, a history
    verified to its start (or a checkpoint), are candidates: an entry edited or forged in the
    store was refused before it got here."""
    assert state.pointer is not None
    channel, current_id = state.channel, state.pointer.tuple_id
    if to is not None:
        check_tuple_id(to)
        if to == current_id:
            return None
        found = next((e for e in state.newest_first() if e.tuple_id == to), None)
        if found is None:
            raise NotFound(
                f"{to} has never been on channel {channel}; rollback only returns to a tuple "
                "that served this channel",
                hint=f"see `k3a channel history {channel}`; to move to a new tuple, "
                f"`k3a promote {to} {channel}` (through the gates)",
            )
        return found
    found = next((e for e in state.newest_first() if e.tuple_id != current_id), None)
    if found is None:
        raise NotFound(
            f"channel {channel} has only ever pointed at {current_id}: nothing to roll back to",
            hint=f"see `k3a channel history {channel}`",
        )
    return found


def weights_present(store: Store, release: ReleaseTuple, channel: str,
                    target: HistoryEntry) -> GateResult:
    """The one check a rollback makes: the target's manifest is in the store with the digest
    the tuple binds, read as every gate and pull reads it (:func:`tuple_manifest`)."""
    w = release.binding.weights
    try:
        tuple_manifest(store, release)
    except NotFound:
        raise NotFound(
            f"cannot roll {channel} back to {release.id}: its weights "
            f"{w.repo_id}@{w.commit} are no longer in {store.url} "
            f"(no {manifest_key(w.repo_id, w.commit)})",
            hint=f"re-stage them (`k3a stage {w.repo_id} --revision {w.commit}` gives the same "
            f"manifest digest), or roll back to another tuple with --to",
        ) from None
    except VerifyMismatch as exc:
        raise VerifyMismatch(f"cannot roll {channel} back to {release.id}: {exc}",
                             hint=exc.hint) from None
    return GateResult(
        name="weights_present",
        passed=True,
        reason=f"manifest {w.manifest_digest[:12]} of {w.repo_id}@{w.commit[:12]} is in the "
        f"store; {release.id} served {channel} at #{target.seq}",
    )


def draft_rollback(store: Store, channel: str, *, to: str | None = None, acting: Acting,
                   reason: str | None = None, now: datetime | None = None) -> RollbackPlan:
    """Everything a rollback plans but its approval: the target, its tuple, its weights (and
    that gc is not retiring them). Writes nothing. NotFound (exit 7) for an unknown channel, a
    target never on it or weights gone; VerifyMismatch (exit 4) for a manifest that changed."""
    check_channel(channel)
    acting.require("promote", f"rolling {channel} back")
    policy = in_force(store)
    state = read_state(store, channel, policy=policy)
    if state.pointer is None:
        raise unknown_channel(store, channel, policy.document.gates.channels)
    state.require_signed()
    chan = policy.document.gates.channels.get(channel)
    plan = RollbackPlan(channel=channel, state=state, policy=policy, target=None, release=None,
                        check=None, approval_required=bool(chan and chan.rollback_approval),
                        granted=None, acting=acting, reason=reason, when=now_or(now))
    target = rollback_target(state, to)
    if target is None:
        return plan
    release = TupleStore(store).get(target.tuple_id)
    check = weights_present(store, release, channel, target)
    w = release.binding.weights
    check_not_retiring(store, w.repo_id, w.commit)
    return dataclasses.replace(plan, target=target, release=release, check=check)


def plan_rollback(store: Store, channel: str, *, to: str | None = None, acting: Acting,
                  reason: str | None = None, approval: str | None = None,
                  now: datetime | None = None) -> RollbackPlan:
    """:func:`draft_rollback`, then the approval: where the store's policy sets
    ``rollback_approval`` for the channel, ``approval`` must name an approved request of this
    rollback (``k3a approve``): ApprovalNeeded (exit 5) otherwise; an approval of another move,
    or a rejection, is refused too (exit 5)."""
    plan = draft_rollback(store, channel, to=to, acting=acting, reason=reason, now=now)
    if plan.target is None:
        return plan
    if approval is None and plan.approval_required:
        target = plan.target.tuple_id
        raise ApprovalNeeded(
            f"the store's policy ({plan.policy.label()}) requires an approval to roll {channel} "
            f"back to {target}; nothing was written",
            hint=f"ask for one: `k3a rollback {channel} --to {target} --request-approval`, "
            "have another release engineer run `k3a approve REQUEST`, then roll back with "
            "`--approval REQUEST`",
        )
    granted = granted_approval(store, approval, action="rollback", channel=channel,
                               tuple_id=plan.target.tuple_id)
    return dataclasses.replace(plan, granted=granted)


def act_rollback(store: Store, plan: RollbackPlan) -> MoveResult:
    """Carry out ``plan``: pin the target's weights, check them again under the pin, and
    compare-and-swap the pointer (Conflict, exit 6, when the channel moved since the plan)."""
    if plan.target is None:
        assert plan.state.pointer is not None
        return unchanged(plan.state.pointer, [])
    assert plan.release is not None
    w = plan.release.binding.weights
    with pinned(store, w.repo_id, w.commit, who=plan.acting.name,
                why=f"rollback of {plan.channel}"):
        check = weights_present(store, plan.release, plan.channel, plan.target)
        policy = recorded(store, plan.policy, plan.acting)
        entry = history_entry(plan.state, action="rollback", tuple_id=plan.release.id,
                              actor=plan.acting.actor, when=plan.when, why=plan.reason,
                              gates=[check], policy=policy, granted=plan.granted)
        return commit(store, plan.state, entry, [check], [], plan.acting)


def rollback(store: Store, channel: str, *, to: str | None = None, acting: Acting,
             reason: str | None = None, approval: str | None = None,
             now: datetime | None = None) -> MoveResult:
    """The rollback move: :func:`plan_rollback`, then :func:`act_rollback`."""
    return act_rollback(store, plan_rollback(store, channel, to=to, acting=acting, reason=reason,
                                             approval=approval, now=now))
