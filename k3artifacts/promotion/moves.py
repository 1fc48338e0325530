"""Promote a tuple onto a channel through its gates; roll a channel back to a tuple it served.

Both are one compare-and-swap of the channel pointer (see
:mod:`k3artifacts.releases.channels`); neither
touches weight bytes. They are idempotent: asking for the tuple the channel already points at
changes nothing and succeeds, so a retried flow task does not fail on its own earlier success.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

from k3artifacts.errors import Conflict, GateFailed, NotFound, VerifyMismatch
from k3artifacts.policy.actor import Actor
from k3artifacts.policy.approvals import approved
from k3artifacts.policy.gates import apply_overrides, check_overrides
from k3artifacts.policy.record import InForce, ensure_seeded, in_force
from k3artifacts.policy.results import GateResult
from k3artifacts.promotion.gates import channel_policy, judging, run_gates
from k3artifacts.releases.channels import (
    Approval,
    ChannelMoved,
    ChannelPointer,
    ChannelState,
    HistoryEntry,
    check_channel,
    commit_move,
    iter_history_reversed,
    read_state,
    unknown_channel,
)
from k3artifacts.releases.retirement import pinned
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


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(UTC)


def _unchanged(pointer: ChannelPointer, gates: list[GateResult]) -> MoveResult:
    entry = pointer.entry
    return MoveResult(
        channel=pointer.channel,
        tuple_id=entry.tuple_id,
        previous_tuple_id=entry.previous_tuple_id,
        changed=False,
        entry=entry,
        gates=gates,
    )


def _commit(
    store: Store,
    state: ChannelState,
    entry: HistoryEntry,
    gates: list[GateResult],
    unused: list[str],
) -> MoveResult:
    try:
        pointer = commit_move(store, state, entry)
    except ChannelMoved as lost:
        if lost.winner is not None and lost.winner.tuple_id == entry.tuple_id:
            # Someone moved it where we wanted it: the goal holds, report their entry.
            return _unchanged(lost.winner, gates)
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


class ApprovalNeeded(GateFailed):
    """The store's policy wants an approval record for this move and none was given."""


def _approval(store: Store, request_id: str | None, *, action: str, channel: str,
              tuple_id: str | None) -> tuple[Approval, Actor] | None:
    """The approval record ``request_id`` as the history entry records it, and the approver,
    checked against the move at hand (its subject, an approving answer) and read from the
    store, never from the caller."""
    if request_id is None:
        return None
    request, decision = approved(store, request_id, action=action,  # type: ignore[arg-type]
                                 channel=channel, tuple_id=tuple_id)
    return Approval(who=decision.by.name, who_source=decision.by.source,
                    decision=decision.decision, reason=decision.reason, when=decision.at,
                    request_id=request.id), decision.by


def _recorded(store: Store, judged: InForce, actor: Actor) -> InForce:
    """The policy that judged, as a version the store holds: a store still on the packaged
    defaults records them now, just before the move that needs them (a refused move writes
    nothing). Refuses if another version got there first: the move must be judged again."""
    if judged.version != 0:
        return judged
    recorded = ensure_seeded(store, by=actor)
    if recorded.digest != judged.digest:
        raise Conflict(
            f"the store's policy became {recorded.label()} while this move was judged by "
            f"{judged.label()}; nothing was written", hint="run the move again")
    return recorded


def _entry(state: ChannelState, *, action: str, tuple_id: str, actor: Actor, when: datetime,
           why: str | None, gates: list[GateResult], policy: InForce,
           approval: Approval | None, overrides=()) -> HistoryEntry:  # type: ignore[no-untyped-def]
    return HistoryEntry(
        channel=state.channel, seq=state.next_seq, action=action,  # type: ignore[arg-type]
        tuple_id=tuple_id, previous_tuple_id=state.tuple_id, who=actor.name,
        who_source=actor.source, who_account=actor.account, when=when, why=why, gates=gates,
        overrides=list(overrides), approval=approval, policy_digest=policy.digest,
        policy_version=policy.version,
    )


def promote(
    store: Store,
    tuple_id: str,
    channel: str,
    *,
    actor: Actor,
    reason: str | None = None,
    overrides: Mapping[str, str] | None = None,
    approval: str | None = None,
    now: datetime | None = None,
) -> MoveResult:
    """Run the gates the store's policy requires of ``channel`` on ``tuple_id`` and, if they
    pass (or failures are overridden with a reason), compare-and-swap the channel onto it and
    record the move with the policy's digest.

    ``actor`` is who moves, resolved by ``policy/actor.py``. ``approval`` is an approval
    request id (``k3a approve``): the library reads its record, checks it answers this move,
    and the approver is then the promoter the separation_of_duties gate judges. ``now`` is the
    move's time, the one the promotion_order gate measures against.

    Raises GateFailed (exit 5) listing every failed gate or for a rejected/unrelated approval,
    Conflict/ChannelMoved (exit 6) naming the winner when another move got there first,
    RevisionRetiring (exit 6) when ``k3a revision gc`` is deleting the weights, NotFound (exit 7)
    for an unknown tuple, a channel the policy does not configure or weights gone, ConfigError
    (exit 9) for a bad override, PointerMismatch (exit 4) for a hand-edited pointer.
    """
    check_channel(channel)
    check_tuple_id(tuple_id)
    policy = in_force(store)
    chan = channel_policy(policy, channel)
    overrides = dict(overrides or {})
    check_overrides(chan.gates, channel, overrides)
    granted = _approval(store, approval, action="promote", channel=channel, tuple_id=tuple_id)
    # With an approval record, the person who decided is the approver: the one the
    # separation_of_duties gate judges (the mover may be a flow's service identity).
    decider = actor if granted is None else granted[1]
    release = TupleStore(store).get(tuple_id)
    when = _now(now)
    w = release.binding.weights
    # The pin keeps `k3a revision gc` off these weights until the pointer references them (see
    # releases/retirement.py); it refuses here if gc is already retiring them.
    with pinned(store, w.repo_id, w.commit, who=actor.name, why=f"promote to {channel}"):
        with judging(store, release, channel, policy, decider, when) as ctx:
            report = run_gates(ctx, policy)
        verdict = apply_overrides(chan.gates, report, overrides)
        if store.read(manifest_key(w.repo_id, w.commit)) is None:
            # Read under the pin whatever the gates (an overridden artifact gate included):
            # what the retirement protocol relies on.
            raise NotFound(
                f"the weights of {tuple_id} ({w.repo_id}@{w.commit}) are not in {store.url}",
                hint=f"re-stage them: `k3a stage {w.repo_id} --revision {w.commit}`",
            )
        state = read_state(store, channel)
        if state.pointer is not None and state.pointer.tuple_id == tuple_id:
            return _unchanged(state.pointer, verdict.gates)
        policy = _recorded(store, policy, actor)
        entry = _entry(state, action="promote", tuple_id=tuple_id, actor=actor, when=when,
                       why=reason, gates=verdict.gates, policy=policy,
                       approval=granted and granted[0], overrides=verdict.used)
        return _commit(store, state, entry, verdict.gates, verdict.unused)


def rollback(
    store: Store,
    channel: str,
    *,
    to: str | None = None,
    actor: Actor,
    reason: str | None = None,
    approval: str | None = None,
    now: datetime | None = None,
) -> MoveResult:
    """Point ``channel`` back at a tuple it served before: ``to``, or by default the previous
    distinct tuple in its history (so two rollbacks in a row swap back, like an undo).

    Gates are not re-run (the target passed them, or was overridden, to serve this channel);
    what is checked is that its weights are still in the store, by one manifest read: the cost
    does not grow with the size of the release. Where the store's policy sets
    ``rollback_approval`` for the channel, ``approval`` must name an approval record of this
    rollback (``k3a approve``): ApprovalNeeded (exit 5) otherwise, and nothing is written.
    Raises NotFound (exit 7) for an unknown channel, a target never on this channel, or a
    target whose weights are gone.
    """
    check_channel(channel)
    policy = in_force(store)
    state = read_state(store, channel)
    if state.pointer is None:
        raise unknown_channel(store, channel, policy.document.gates.channels)
    target = _rollback_target(store, state, to)
    if target is None:
        return _unchanged(state.pointer, [])
    granted = _rollback_approval(store, policy, channel, target.tuple_id, approval)
    release = TupleStore(store).get(target.tuple_id)
    w = release.binding.weights
    with pinned(store, w.repo_id, w.commit, who=actor.name, why=f"rollback of {channel}"):
        check = _weights_present(store, release, channel, target)
        policy = _recorded(store, policy, actor)
        entry = _entry(state, action="rollback", tuple_id=release.id, actor=actor,
                       when=_now(now), why=reason, gates=[check], policy=policy,
                       approval=granted and granted[0])
        return _commit(store, state, entry, [check], [])


def _rollback_target(store: Store, state: ChannelState, to: str | None) -> HistoryEntry | None:
    """The history entry to return to; None when ``to`` is where the channel already is."""
    assert state.pointer is not None
    channel, current_id = state.channel, state.pointer.tuple_id
    if to is not None:
        check_tuple_id(to)
        if to == current_id:
            return None
        found = next((e for e in iter_history_reversed(store, channel, state.pointer)
                      if e.tuple_id == to), None)
        if found is None:
            raise NotFound(
                f"{to} has never been on channel {channel}; rollback only returns to a tuple "
                "that served this channel",
                hint=f"see `k3a channel history {channel}`; to move to a new tuple, "
                f"`k3a promote {to} {channel}` (through the gates)",
            )
        return found
    found = next((e for e in iter_history_reversed(store, channel, state.pointer)
                  if e.tuple_id != current_id), None)
    if found is None:
        raise NotFound(
            f"channel {channel} has only ever pointed at {current_id}: nothing to roll back to",
            hint=f"see `k3a channel history {channel}`",
        )
    return found


def _rollback_approval(store: Store, policy: InForce, channel: str, target: str,
                       request_id: str | None) -> tuple[Approval, Actor] | None:
    """The approval record a rollback carries; required where the policy says so."""
    chan = policy.document.gates.channels.get(channel)
    if request_id is None and chan is not None and chan.rollback_approval:
        raise ApprovalNeeded(
            f"the store's policy ({policy.label()}) requires an approval to roll {channel} "
            f"back to {target}; nothing was written",
            hint=f"ask for one: `k3a rollback {channel} --to {target} --request-approval`, "
            "have another release engineer run `k3a approve REQUEST`, then roll back with "
            "`--approval REQUEST`",
        )
    return _approval(store, request_id, action="rollback", channel=channel, tuple_id=target)


def _weights_present(store: Store, release: ReleaseTuple, channel: str,
                     target: HistoryEntry) -> GateResult:
    """The one check a rollback makes: the target's manifest is in the store with the digest
    the tuple binds. The raw bytes, not the parsed model: manifests are stored canonical, so
    their sha256 is the manifest digest, and hashing ~1 MB is cheaper than parsing thousands of
    records: a rollback costs the same whatever the release's file count."""
    w = release.binding.weights
    found = store.read(manifest_key(w.repo_id, w.commit))
    if found is None:
        raise NotFound(
            f"cannot roll {channel} back to {release.id}: its weights "
            f"{w.repo_id}@{w.commit} are no longer in {store.url} "
            f"(no {manifest_key(w.repo_id, w.commit)})",
            hint=f"re-stage them (`k3a stage {w.repo_id} --revision {w.commit}` gives the same "
            f"manifest digest), or roll back to another tuple with --to",
        )
    stored_digest = hashlib.sha256(found.data).hexdigest()
    if stored_digest != w.manifest_digest:
        raise VerifyMismatch(
            f"cannot roll {channel} back to {release.id}: the manifest of "
            f"{w.repo_id}@{w.commit} in {store.url} has digest {stored_digest}, the tuple "
            f"binds {w.manifest_digest}"
        )
    return GateResult(
        name="weights_present",
        passed=True,
        reason=f"manifest {w.manifest_digest[:12]} of {w.repo_id}@{w.commit[:12]} is in the "
        f"store; {release.id} served {channel} at #{target.seq}",
    )
