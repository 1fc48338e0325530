"""Promote a tuple onto a channel through its gates; roll a channel back to a tuple it served.

Both are one compare-and-swap of the channel pointer (see
:mod:`k3artifacts.releases.channels`); neither
touches weight bytes. They are idempotent: asking for the tuple the channel already points at
changes nothing and succeeds, so a retried flow task does not fail on its own earlier success.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from k3artifacts.errors import GateFailed, NotFound, VerifyMismatch
from k3artifacts.promotion.gates import (
    apply_overrides,
    channel_policy,
    check_overrides,
    context,
    run_gates,
)
from k3artifacts.releases.channels import (
    Approval,
    ChannelMoved,
    ChannelPointer,
    ChannelState,
    GateResult,
    HistoryEntry,
    check_channel,
    commit_move,
    iter_history_reversed,
    read_state,
    unknown_channel,
)
from k3artifacts.releases.policies import load_gate_policy
from k3artifacts.releases.retirement import pinned
from k3artifacts.releases.tuples import TupleStore, check_tuple_id
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


def promote(
    store: Store,
    tuple_id: str,
    channel: str,
    *,
    actor: str,
    actor_source: str | None = None,
    reason: str | None = None,
    overrides: Mapping[str, str] | None = None,
    policies_dir: Path,
    approval: Approval | None = None,
    now: datetime | None = None,
) -> MoveResult:
    """Run the channel's gates on ``tuple_id`` and, if they pass (or failures are overridden
    with a reason), compare-and-swap the channel onto it and record the move.

    ``actor`` is who promotes as the caller established it (the CLI: ``releases/actor.py``);
    the separation_of_duties gate compares it with the reviewers. ``now`` is the move's time,
    the one the promotion_order gate measures against.

    Raises GateFailed (exit 5) listing every failed gate, Conflict/ChannelMoved (exit 6) naming
    the winner when another move got there first, RevisionRetiring (exit 6) when ``k3a gc`` is
    deleting the weights, NotFound (exit 7) for an unknown tuple, a channel the policy does not
    configure or weights gone, ConfigError (exit 9) for a bad policy or override.
    """
    check_channel(channel)
    check_tuple_id(tuple_id)
    chan = channel_policy(load_gate_policy(policies_dir), channel, policies_dir)
    overrides = dict(overrides or {})
    check_overrides(chan, channel, overrides)
    if approval is not None and approval.decision != "approved":
        raise GateFailed(
            f"promotion of {tuple_id} to {channel} was rejected by {approval.who}"
            + (f": {approval.reason}" if approval.reason else ""),
            hint="nothing was written; address the rejection and request approval again",
        )
    release = TupleStore(store).get(tuple_id)
    when = _now(now)
    w = release.binding.weights
    # The pin keeps `k3a gc` off these weights until the pointer references them (see
    # releases/retirement.py); it refuses here if gc is already retiring them.
    with pinned(store, w.repo_id, w.commit, who=actor, why=f"promote to {channel}"):
        report = run_gates(context(store, release, channel, chan, policies_dir, actor, when))
        verdict = apply_overrides(chan, report, overrides)
        gates = verdict.gates
        if store.read(manifest_key(w.repo_id, w.commit)) is None:
            # Read under the pin whatever the gates (an overridden artifact gate included):
            # what the retirement protocol relies on.
            raise NotFound(
                f"the weights of {tuple_id} ({w.repo_id}@{w.commit}) are not in {store.url}",
                hint=f"re-stage them: `k3a stage {w.repo_id} --revision {w.commit}`",
            )

        state = read_state(store, channel)
        if state.pointer is not None and state.pointer.tuple_id == tuple_id:
            return _unchanged(state.pointer, gates)
        entry = HistoryEntry(
            channel=channel,
            seq=state.next_seq,
            action="promote",
            tuple_id=tuple_id,
            previous_tuple_id=state.tuple_id,
            who=actor,
            who_source=actor_source,
            when=when,
            why=reason,
            gates=gates,
            overrides=verdict.used,
            approval=approval,
        )
        return _commit(store, state, entry, gates, verdict.unused)


def rollback(
    store: Store,
    channel: str,
    *,
    to: str | None = None,
    actor: str,
    actor_source: str | None = None,
    reason: str | None = None,
    approval: Approval | None = None,
    now: datetime | None = None,
    policy_channels: Collection[str] | None = None,
) -> MoveResult:
    """Point ``channel`` back at a tuple it served before: ``to``, or by default the previous
    distinct tuple in its history (so two rollbacks in a row swap back, like an undo).

    Gates are not re-run (the target passed them, or was overridden, to serve this channel);
    what is checked is that its weights are still in the store, by one manifest read: the cost
    does not grow with the size of the release. Raises NotFound (exit 7) for an unknown channel,
    a target never on this channel, or a target whose weights are gone. ``approval`` (when the
    channel's policy asks for one, see ``ChannelPolicy.rollback_approval``) is recorded in the
    history entry; a rejection raises GateFailed and writes nothing. ``policy_channels`` (the
    gate policy's channels, when the caller has them) shapes the advice for an unknown channel.
    """
    check_channel(channel)
    if approval is not None and approval.decision != "approved":
        raise GateFailed(
            f"rollback of {channel} was rejected by {approval.who}"
            + (f": {approval.reason}" if approval.reason else ""),
            hint="nothing was written; the channel still points where it did",
        )
    state = read_state(store, channel)
    if state.pointer is None:
        raise unknown_channel(store, channel, policy_channels)
    current_id = state.pointer.tuple_id
    target: HistoryEntry | None = None
    if to is not None:
        check_tuple_id(to)
        if to == current_id:
            return _unchanged(state.pointer, [])
        target = next(
            (e for e in iter_history_reversed(store, channel, state.pointer) if e.tuple_id == to),
            None,
        )
        if target is None:
            raise NotFound(
                f"{to} has never been on channel {channel}; rollback only returns to a tuple "
                "that served this channel",
                hint=f"see `k3a channel history {channel}`; to move to a new tuple, "
                f"`k3a promote {to} {channel}` (through the gates)",
            )
    else:
        target = next(
            (
                e
                for e in iter_history_reversed(store, channel, state.pointer)
                if e.tuple_id != current_id
            ),
            None,
        )
        if target is None:
            raise NotFound(
                f"channel {channel} has only ever pointed at {current_id}: nothing to roll back to",
                hint=f"see `k3a channel history {channel}`",
            )

    release = TupleStore(store).get(target.tuple_id)
    w = release.binding.weights
    # The raw bytes, not the parsed model: manifests are stored canonical, so their sha256 is
    # the manifest digest, and hashing ~1 MB is cheaper than parsing thousands of records:
    # a rollback costs the same whatever the release's file count.
    with pinned(store, w.repo_id, w.commit, who=actor, why=f"rollback of {channel}"):
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
        check = GateResult(
            name="weights_present",
            passed=True,
            reason=f"manifest {w.manifest_digest[:12]} of {w.repo_id}@{w.commit[:12]} is in the "
            f"store; {release.id} served {channel} at #{target.seq}",
        )
        entry = HistoryEntry(
            channel=channel,
            seq=state.next_seq,
            action="rollback",
            tuple_id=release.id,
            previous_tuple_id=current_id,
            who=actor,
            who_source=actor_source,
            when=_now(now),
            why=reason,
            gates=[check],
            approval=approval,
        )
        return _commit(store, state, entry, [check], [])
