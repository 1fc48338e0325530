"""Channels: named pointers to release tuples, each with an append-only history that cannot
be rewritten: a hash-chained log of entries each signed by its mover (:mod:`k3artifacts.trust.
chain`).

Keys (same under every store)::

    releases/channels/<channel>.json                        the head: the newest entry, as
                                                            signed (compare-and-swap)
    releases/channels/<channel>/history/<seq:010d>.json     one signed entry per move
                                                            (create-once): {"seq", "previous":
                                                            <digest of the entry before>,
                                                            "entry": HistoryEntry}
    releases/channels/<channel>/checkpoint.json             a mover's checkpoint, every
                                                            ``CHECKPOINT_EVERY`` moves

Who may sign an entry is the policy version that judged the move (the entry names it:
``policy_version`` and ``policy_digest``): an identity it holds with the role ``promote``. That
version, with that digest, must be one of the store's verified policy history
(:func:`k3artifacts.policy.record.in_force`; one digest may be several versions: a change
undone), and the versions a channel's entries name only move forward. Every reader (render,
pull, history, smoke, gates, promote, rollback, the flows, gc) verifies the whole chain to
its start (or a checkpoint) through :func:`read_state` and refuses, by name (exit 4), a
pointer written by hand or by a key the policy does not trust to move it, a gap, an edit, a
fork. Rollback targets come from the verified entries alone.

Order of writes: the pointer first, then the history entry
---------------------------------------------------------
A move is ``Store.replace`` of the pointer against the version token read before the move,
followed by ``Store.create`` of history entry ``seq``. The pointer holds the signed entry it
committed, byte for byte. The compare-and-swap of the pointer is the commit point; the
history write that follows is a copy of something already decided. Why this order and not
"log entry first, then pointer":

* The race is decided by one atomic operation on the one key that serving reads (``k3a render
  production``, the flows, a node resolving its channel). The loser has written nothing at all,
  so there is nothing to clean up or explain.
* A reader of the pointer alone gets the truth in one read. With the log first, a process that
  dies between the writes leaves an entry for a move the pointer never made: every reader would
  have to probe the log past the pointer, and the move a dead process decided on (perhaps killed
  by an operator who changed their mind) would be carried out later by whoever came next.
* Nothing is lost if a process dies between the two writes: the entry is the pointer. Readers
  verify it as the head, and the next move writes it to the log (create-once, the same bytes)
  *before* it swaps the pointer. So entry ``N+1`` is only ever written by someone who saw
  pointer ``N+1``, whose mover first made sure entry ``N`` was in the log: the log has no gaps
  and no orphans, at worst it lags the pointer by the one entry the pointer itself holds.

**Stores older than signing** (:attr:`~k3artifacts.policy.record.InForce.legacy`) hold a
pointer that copies its entry (:class:`ChannelPointer`) and unsigned entries: read as found,
checked against each other as before (:class:`PointerMismatch`), never moved on, until ``k3a
trust migrate`` re-signs their entries as found into the history's base
(``<channel>/base.json``, :class:`~k3artifacts.trust.chain.Base`), each marked with the root
whose identity signed it (``migrated_under``), and swaps the pointer to it
(:mod:`k3artifacts.migration.channels`). From then on the history is signed throughout: an
entry marked so counts signed by an identity of that root, and only in the base.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from k3artifacts import faultpoints
from k3artifacts.errors import (
    ConfigError,
    Conflict,
    MigrationNeeded,
    NotFound,
    StoredRecordRefused,
    UntrustedRecord,
)
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.freshness import not_behind
from k3artifacts.policy.model import CHANNEL_NAME
from k3artifacts.policy.record import InForce, in_force, read_document, renewed
from k3artifacts.policy.results import GateResult, Override
from k3artifacts.releases.record_log import head_mark
from k3artifacts.releases.tuples import TUPLE_ID
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust import heads
from k3artifacts.trust.chain import (
    Chain,
    ChainEntry,
    ChainLayout,
    Mark,
    append,
    checkpoint,
    entry_below,
    histories_under,
    logged_seqs,
    verify_chain,
)
from k3artifacts.trust.identities import Keyring
from k3artifacts.trust.pins import Roots, trusted_roots
from k3artifacts.trust.storage import Found

CHANNEL_SCHEMA = 1
CHANNELS_PREFIX = "releases/channels/"
ENTRY_KIND = "channel-entry"
#: A channel's mover signs a checkpoint every this many moves: a fresh reader verifies at
#: most this many entries back from the head.
CHECKPOINT_EVERY = 16
#: Reads of a pointer that moves while its history is read, before a refusal is believed.
_REREADS = 5


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Approval(_Frozen):
    """A release engineer's decision that authorized the move: an approval record in the
    store (``policy/approvals.py``), answered under the approver's own identity."""

    who: str = Field(min_length=1)
    #: Where ``who`` came from (``key``; older entries: ``sts``, ``os-user``, ``asserted``);
    #: None in entries written before approvals were records (then ``who`` was typed in a
    #: form).
    who_source: str | None = None
    decision: Literal["approved", "rejected"]
    reason: str | None = None
    when: datetime | None = None
    #: The approval request this answers (``k3a approve REQUEST``).
    request_id: str | None = None


class HistoryEntry(_Frozen):
    schema_version: int = CHANNEL_SCHEMA
    channel: str
    seq: int = Field(ge=1)
    action: Literal["promote", "rollback"]
    tuple_id: str = Field(pattern=TUPLE_ID.pattern)
    previous_tuple_id: str | None = Field(default=None, pattern=TUPLE_ID.pattern)
    who: str
    #: Where ``who`` came from (``key``: the identity whose key signed the entry; older
    #: entries: ``sts``, ``os-user``, ``asserted``; see ``policy/actor.py``);
    #: None for entries written before identities were resolved.
    who_source: str | None = None
    #: For an asserted ``who``: the identity that typed it.
    who_account: str | None = None
    when: datetime
    why: str | None = None
    gates: list[GateResult] = Field(default_factory=list)
    overrides: list[Override] = Field(default_factory=list)
    approval: Approval | None = None
    #: The store's policy version the move was judged by (``policy/record.py``); None in
    #: entries written before the policy was the store's.
    policy_digest: str | None = None
    policy_version: int | None = None
    #: An entry older than signing, re-signed as found by a root identity of this root
    #: version (``k3a trust migrate``): it vouches for the move, it did not make it.
    migrated_under: int | None = Field(default=None, ge=1)


class ChannelPointer(_Frozen):
    """A channel's head as readers see it: the newest entry, with the fields a reader of the
    pointer alone wants. (Before signing, pointers were stored in this shape.)"""

    schema_version: int = CHANNEL_SCHEMA
    channel: str
    tuple_id: str = Field(pattern=TUPLE_ID.pattern)
    seq: int = Field(ge=1)
    updated_at: datetime
    updated_by: str
    #: The history entry this move committed.
    entry: HistoryEntry

    @model_validator(mode="after")
    def _matches_entry(self) -> ChannelPointer:
        e = self.entry
        if (e.channel, e.seq, e.tuple_id) != (self.channel, self.seq, self.tuple_id):
            raise ValueError("pointer and its history entry disagree on channel, seq or tuple")
        return self

    @classmethod
    def for_entry(cls, entry: HistoryEntry) -> ChannelPointer:
        return cls(
            channel=entry.channel,
            tuple_id=entry.tuple_id,
            seq=entry.seq,
            updated_at=entry.when,
            updated_by=entry.who,
            entry=entry,
        )


class ChannelMoved(Conflict):
    """Lost the race: the pointer moved between our read and our compare-and-swap."""

    def __init__(self, message: str, *, winner: ChannelPointer | None, hint: str):
        super().__init__(message, hint=hint)
        self.winner = winner


class CorruptRecord(StoredRecordRefused):
    """A channel record that does not parse or contradicts another: the store was edited."""

    hint = "inspect the key named above; channel records are written only by k3a"


class PointerMismatch(CorruptRecord):
    """A store older than signing whose pointer is not the move its history's latest entry
    records (a hand-edited pointer, or a history entry deleted): nobody may follow it until
    someone looks."""

    def __init__(self, message: str, channel: str):
        super().__init__(
            message,
            hint=f"compare releases/channels/{channel}.json with `k3a channel history {channel}`; "
            "channel pointers are moved only by `k3a promote` / `k3a rollback`: restore the "
            "pointer the history's latest entry records",
        )


def check_channel(name: str) -> str:
    if not CHANNEL_NAME.match(name):
        raise ConfigError(
            f"{name!r} is not a valid channel name",
            hint="channel names are 1-63 of a-z, 0-9 and '-', starting with a letter or digit",
        )
    return name


def pointer_key(channel: str) -> str:
    return f"{CHANNELS_PREFIX}{check_channel(channel)}.json"


def layout(channel: str) -> ChainLayout:
    """Where ``channel``'s history lives, as a chain."""
    check_channel(channel)
    return ChainLayout(name=f"channel {channel}", pointer_key=pointer_key(channel),
                       entries_prefix=f"{CHANNELS_PREFIX}{channel}/history/",
                       entry_kind=ENTRY_KIND,
                       checkpoint_key=f"{CHANNELS_PREFIX}{channel}/checkpoint.json",
                       base_key=f"{CHANNELS_PREFIX}{channel}/base.json")


def history_key(channel: str, seq: int) -> str:
    return layout(channel).entry_key(seq)


def _parse(model: type[BaseModel], key: str, data: bytes):  # type: ignore[no-untyped-def]
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise CorruptRecord(f"{key} is malformed: {exc.errors()[0]['msg']}") from None


@dataclass(frozen=True)
class ChannelState:
    """A channel as read and verified just before a move (or for a reader): its entries,
    oldest first (none: never moved), and what the next move compare-and-swaps against."""

    channel: str
    entries: tuple[HistoryEntry, ...]
    token: str | None
    #: The verified chain the next move appends to; None for a store older than signing,
    #: read as found (nothing is moved on it).
    chain: Chain[HistoryEntry] | None
    #: Where :attr:`entries` are only what was new to this reader: the older ones, newest
    #: first, read and verified on demand.
    further: Callable[[], Iterator[HistoryEntry]] | None = None

    @property
    def pointer(self) -> ChannelPointer | None:
        return ChannelPointer.for_entry(self.entries[-1]) if self.entries else None

    @property
    def tuple_id(self) -> str | None:
        return self.entries[-1].tuple_id if self.entries else None

    @property
    def next_seq(self) -> int:
        return len(self.entries) + 1 if self.chain is None else self.chain.next_seq

    def newest_first(self) -> Iterator[HistoryEntry]:
        """Every entry, newest first: those verified, then older ones as they are asked for
        (a rollback's target is mostly the one before the head)."""
        yield from reversed(self.entries)
        if self.further is not None:
            yield from self.further()

    def require_signed(self) -> None:
        """MigrationNeeded (exit 9) for a channel of a store older than signing: it is read
        as found and never moved on."""
        if self.chain is None and self.entries:
            raise MigrationNeeded(f"channel {self.channel}'s history predates signed records")


class _Identities:
    """Who may sign each entry: the identities of the policy version it names, a version of
    the verified policy history (read once per version); for an entry older than signing,
    the identities of the root it names (its migration's)."""

    def __init__(self, store: RecordStore, policy: InForce, roots: Roots, where: str):
        self.store, self.policy, self.roots, self.where = store, policy, roots, where
        self._keyrings: dict[str, Keyring] = {}

    def __call__(self, entry: dict[str, Any]) -> Keyring:
        migrated = entry.get("migrated_under")
        if isinstance(migrated, int):
            # The root's identities vouch for the move here, as promote would sign it.
            root = self.roots.at(migrated, key=self.where)
            return Keyring.of((name, keys, frozenset({"promote"}))
                              for name, keys in root.identities.items())
        digest = entry.get("policy_digest")
        if not isinstance(digest, str) or digest not in self.policy.digests.values():
            raise UntrustedRecord(self.where, "untrusted-key", f"a move judged by policy "
                                  f"{str(digest)[:12]}, which was never in force in "
                                  f"{self.store.url}")
        if digest not in self._keyrings:
            self._keyrings[digest] = read_document(self.store, digest).identities.keyring()
        return self._keyrings[digest]


def _placed(link: ChainEntry[HistoryEntry], channel: str, policy: InForce,
            key: str) -> int | None:
    """The policy version entry ``link`` names (None: older than signing, in the history's
    base), once it says what its place says: this channel and its seq, judged by a version of
    the verified policy history."""
    e = link.entry
    if (e.channel, e.seq) != (channel, link.seq) or (link.seq == 1) != (
            e.previous_tuple_id is None):
        raise UntrustedRecord(key, "edit", f"entry #{link.seq} of channel {channel} says "
                              f"it is {e.channel}#{e.seq}, after {e.previous_tuple_id}")
    if (e.migrated_under is not None) != link.in_base:
        raise UntrustedRecord(key, "edit", f"entry #{link.seq} of channel {channel} says it is "
                              "older than signing where it is not in the history's base, or "
                              "the other way round")
    if link.in_base:
        return None
    # Checked as a pair: one digest may be in force as several versions (a change undone).
    if e.policy_version is None or policy.digests.get(e.policy_version) != e.policy_digest:
        raise UntrustedRecord(key, "edit", f"entry #{link.seq} of channel {channel} names "
                              f"policy v{e.policy_version}, not the version of its digest")
    return e.policy_version


def _follows(below: ChainEntry[HistoryEntry], above: ChainEntry[HistoryEntry], channel: str,
             versions: tuple[int | None, int | None], key: str) -> None:
    """``above`` moves on from ``below``: from its tuple, by a policy version never older."""
    e = above.entry
    low, high = versions
    if e.previous_tuple_id != below.entry.tuple_id:
        raise UntrustedRecord(key, "edit", f"entry #{above.seq} of channel {channel} says it "
                              f"is {e.channel}#{e.seq}, after {e.previous_tuple_id}")
    if low is not None and high is not None and high < low:
        raise UntrustedRecord(key, "edit", f"entry #{above.seq} of channel {channel} names "
                              f"policy v{high}, out of order (#{below.seq} names v{low})")


def _consistent(chain: Chain[HistoryEntry], channel: str, policy: InForce) -> None:
    """The entries say what their places say (:func:`_placed`), each moving on from the one
    before (:func:`_follows`)."""
    before: tuple[ChainEntry[HistoryEntry], int | None] | None = None
    for link in chain.entries:
        key = chain.layout.entry_key(link.seq)
        version = _placed(link, channel, policy, key)
        if before is not None:
            _follows(before[0], link, channel, (before[1], version), key)
        before = (link, version)


@dataclass(frozen=True)
class _Further:
    """Reads a channel's history back past what a reader verified as new, each entry
    verified as the one the entry above it follows."""

    store: RecordStore
    channel: str
    policy: InForce
    chain: Chain[HistoryEntry]
    keyring: _Identities

    def __call__(self) -> Iterator[HistoryEntry]:
        above = self.chain.entries[0]
        above_version = _placed(above, self.channel, self.policy,
                                self.chain.layout.entry_key(above.seq))
        while (below := entry_below(self.store, self.chain, above, HistoryEntry,
                                    keyring=self.keyring, roles=["promote"])) is not None:
            key = self.chain.layout.entry_key(below.seq)
            version = _placed(below, self.channel, self.policy, key)
            _follows(below, above, self.channel, (version, above_version),
                     self.chain.layout.entry_key(above.seq))
            yield below.entry
            above, above_version = below, version


def _checkpointers(root: Keyring, policy: InForce) -> Keyring:
    """Who may sign a channel's checkpoint: its movers (those holding ``promote`` in the
    policy in force, as they sign its entries) and the root identities (before a key is
    retired: the entries it signed would no longer verify)."""
    movers = {} if policy.version == 0 else {
        k: v for k, v in policy.document.identities.keyring().keys.items()
        if "promote" in v.roles}
    return Keyring({**root.keys, **movers})


def _verified(store: RecordStore, channel: str, policy: InForce, *,
              full: bool = False) -> ChannelState:
    where = layout(channel)
    # A store migrated before its first policy has roots and re-signed histories, no policy.
    roots = policy.roots or trusted_roots(store)
    keyring = _Identities(store, policy, roots, where.pointer_key)
    chain = verify_chain(store, where, HistoryEntry, keyring=keyring, roles=["promote"],
                         bound=roots.bound,
                         checkpoint_keyring=_checkpointers(roots.current.keyring(), policy),
                         last_seen=heads.seen(store.url, where.name), full=full)
    _consistent(chain, channel, policy)
    if policy.freshness is not None:
        not_behind(where.name, where.pointer_key, policy.freshness.channels.get(channel),
                   chain.mark, {e.seq: e.digest for e in chain.entries})
    heads.remember(store.url, where.name, chain.mark)
    further = None if chain.whole else _Further(store, channel, policy, chain, keyring)
    return ChannelState(channel, tuple(e.entry for e in chain.entries), chain.token, chain,
                        further)


def read_state(store: RecordStore, channel: str, *,
               policy: InForce | None = None, full: bool = False) -> ChannelState:
    """The channel as every reader and mover sees it, verified (module doc) against the
    store's policy in force (``policy``, if read already): from the head this client verified
    before (only what is new), else from its checkpoint or its start; ``full``: every entry
    down to its checkpoint or its start, whatever this client saw."""
    check_channel(channel)
    policy = policy or in_force(store)
    key = pointer_key(channel)
    for attempt in range(_REREADS):
        found = store.read(key)
        try:
            if policy.legacy:
                return read_as_found(store, channel, found)
            return _verified(store, channel, policy, full=full)
        except (UntrustedRecord, PointerMismatch):
            # The pointer and the history are several reads: a mover that swapped the pointer
            # and logged its entry between them makes the history look ahead. Only a pointer
            # that stays put while its history disagrees was set by hand.
            again = store.read(key)
            moved = (again is None) != (found is None) or (
                again is not None and found is not None and again.data != found.data)
            if attempt + 1 < _REREADS and moved:
                continue
            raise
    raise AssertionError("unreachable")


def read_as_found(store: RecordStore, channel: str, found: Found | None) -> ChannelState:
    """A channel of a store older than signing, its pointer as ``found``: its pointer and log,
    checked against each other (a pointer set back, edited, or not following its log is
    refused, :class:`PointerMismatch`)."""
    if found is None:
        return ChannelState(channel, (), None, None)
    key = pointer_key(channel)
    pointer = _parse(ChannelPointer, key, found.data)
    if pointer.channel != channel:
        raise CorruptRecord(f"{key} names channel {pointer.channel!r}")
    where = layout(channel)
    seqs = logged_seqs(store, where)
    latest = seqs[-1] if seqs else 0
    shown = f"{key} in {store.url}"
    if latest > pointer.seq:
        raise PointerMismatch(f"{shown} says #{pointer.seq} ({pointer.tuple_id}), but the "
                              f"history goes on to #{latest}: the pointer was set back by hand",
                              channel)
    entries = [_read_entry(store, channel, seq) for seq in range(1, latest + 1)]
    if latest == pointer.seq:
        if entries[-1] != pointer.entry:
            raise PointerMismatch(f"{shown} points at {pointer.tuple_id} as #{pointer.seq}, but "
                                  f"history entry #{latest} records another move: the pointer "
                                  "was edited by hand", channel)
    elif latest == pointer.seq - 1 and (
            latest == 0 or entries[-1].tuple_id == pointer.entry.previous_tuple_id):
        entries.append(pointer.entry)  # its mover died before logging it
    else:
        raise PointerMismatch(f"{shown} says #{pointer.seq} ({pointer.tuple_id}), but the "
                              f"history's latest entry is #{latest}: the pointer does not "
                              "follow its history", channel)
    return ChannelState(channel, tuple(entries), found.token, None)


def _read_entry(store: RecordStore, channel: str, seq: int) -> HistoryEntry:
    key = history_key(channel, seq)
    found = store.read(key)
    if found is None:
        raise CorruptRecord(f"{key} is missing from the history of {channel}")
    entry = _parse(HistoryEntry, key, found.data)
    if (entry.channel, entry.seq) != (channel, seq):
        raise CorruptRecord(f"{key} holds entry {entry.channel}#{entry.seq}")
    return entry


def channel_names(store: RecordStore) -> list[str]:
    """Channels that have a pointer or a history in ``store`` (:func:`histories_under`)."""
    return histories_under(store, CHANNELS_PREFIX, lambda name: bool(CHANNEL_NAME.match(name)))


def unknown_channel(
    store: RecordStore, channel: str, policy_channels: Collection[str] | None = None
) -> NotFound:
    """NotFound for a channel with no pointer. ``policy_channels``: the channels the gate
    policy allows, when known; promoting is suggested only onto one of those."""
    known = channel_names(store)
    listed = ", ".join(known) if known else "none yet"
    message = f"channel {channel!r} has never been promoted to in {store.url} (channels: {listed})"
    if policy_channels is not None and channel not in policy_channels:
        allowed = ", ".join(sorted(policy_channels)) or "none"
        return NotFound(
            message,
            hint=f"{channel!r} is not a channel of the gate policy (it allows: {allowed}); "
            "check the name, or add the channel to policies/promotion-gates.yaml first",
        )
    return NotFound(message, hint=f"promote a tuple first: `k3a promote <tuple-id> {channel}`")


def current(store: RecordStore, channel: str) -> ChannelPointer:
    """The channel's head; NotFound (with the known channels) if it was never moved."""
    pointer = read_state(store, channel).pointer
    if pointer is None:
        raise unknown_channel(store, channel)
    return pointer


def list_channels(store: RecordStore) -> list[ChannelPointer]:
    policy = in_force(store)
    return [p for p in (read_state(store, n, policy=policy).pointer
                        for n in channel_names(store)) if p]


def history(
    store: RecordStore, channel: str, policy_channels: Collection[str] | None = None
) -> list[HistoryEntry]:
    """Every move of ``channel``, oldest first, verified (seq 1..N, those older than signing
    read from the history's base).
    ``policy_channels`` shapes the advice when the channel is unknown
    (see :func:`unknown_channel`)."""
    state = read_state(store, channel)
    if not state.entries:
        raise unknown_channel(store, channel, policy_channels)
    return list(reversed(list(state.newest_first())))


def commit_move(store: RecordStore, state: ChannelState, entry: HistoryEntry, *,
                acting: Acting) -> ChannelPointer:
    """Sign ``entry`` as ``acting`` and append it after ``state``'s head: its mover's entry
    logged first if it died before, then the pointer compare-and-swapped, then the entry
    logged (module doc).

    Raises :class:`ChannelMoved` naming the winner if the pointer changed since ``state`` was
    read; then nothing was written.
    """
    if entry.channel != state.channel or entry.seq != state.next_seq:
        raise ValueError(f"entry {entry.channel}#{entry.seq} does not follow {state.channel}")
    if entry.previous_tuple_id != state.tuple_id:
        raise ValueError("entry.previous_tuple_id must be the tuple the state points at")
    state.require_signed()
    chain = state.chain
    if chain is None:
        # The first move of a store with no policy until this move seeded one: its history
        # starts now, empty (or someone else's first move won).
        chain = _verified(store, state.channel, in_force(store)).chain
        assert chain is not None
        if chain.head is not None:
            raise _lost_race(store, state, entry)
    faultpoints.pause("channel-move", state.channel)
    try:
        moved = append(store, chain, entry, signer=acting.signer, identity=acting.name)
    except Conflict:
        raise _lost_race(store, state, entry) from None
    heads.remember(store.url, chain.layout.name, moved.mark)
    assert moved.mark is not None
    renewed(store, acting.signer, {state.channel: moved.mark}, _record_log(store, entry))
    if entry.seq % CHECKPOINT_EVERY == 0:
        # A fresh reader's walk starts here, not at #1: what a read costs stays bounded. A
        # checkpoint lost to a race only leaves the walk longer.
        with contextlib.suppress(Conflict):
            checkpoint(store, moved, signer=acting.signer, identity=acting.name)
    # If we die here the entry survives in the pointer; the next move logs it.
    return ChannelPointer.for_entry(entry)


def _record_log(store: RecordStore, entry: HistoryEntry) -> dict[str, Mark]:
    """The head of the record log of the tuple the channel now points at, for the freshness
    head to name, so a fresh reader of the tuple served next notices its records set back.
    The move is committed already: a log that does not verify is named by the next reader of
    the tuple's records, not here."""
    with contextlib.suppress(StoredRecordRefused):
        mark = head_mark(store, entry.tuple_id)
        return {} if mark is None else {entry.tuple_id: mark}
    return {}


def _lost_race(store: RecordStore, state: ChannelState, entry: HistoryEntry) -> ChannelMoved:
    winner = read_state(store, state.channel).pointer
    wanted = f"{entry.action} of {state.channel} to {entry.tuple_id}"
    if winner is None:
        return ChannelMoved(
            f"{wanted} lost a race: the channel pointer changed and is now absent",
            winner=None,
            hint=f"check `k3a channel history {state.channel}` and retry",
        )
    w = winner.entry
    return ChannelMoved(
        f"{wanted} lost a race: {state.channel} moved to {winner.tuple_id} "
        f"({w.action} #{w.seq} by {w.who} at {w.when.isoformat()}) first; nothing was written",
        winner=winner,
        hint=(
            f"review `k3a channel history {state.channel}`; if {entry.tuple_id} should still "
            f"replace {winner.tuple_id}, run the {entry.action} again"
        ),
    )
