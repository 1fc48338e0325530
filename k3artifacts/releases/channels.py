"""Channels: named pointers to release tuples, each with an append-only numbered history.

Keys (same under every store)::

    releases/channels/<channel>.json                        the pointer (compare-and-swap)
    releases/channels/<channel>/history/<seq:010d>.json     one entry per move (create-once)

Order of writes: the pointer first, then the history entry
---------------------------------------------------------
A move is ``Store.replace`` of the pointer against the version token read before the move,
followed by ``Store.create`` of history entry ``seq``. The pointer carries a full copy of the
entry it committed (``ChannelPointer.entry``). The compare-and-swap of the pointer is the commit
point; the history write that follows is a copy of something already decided. Why this order
and not "log entry first, then pointer":

* The race is decided by one atomic operation on the one key that serving reads (``k3a render
  production``, the flows, a node resolving its channel). The loser has written nothing at all,
  so there is nothing to clean up or explain.
* A reader of the pointer alone gets the truth in one read. With the log first, a process that
  dies between the writes leaves an entry for a move the pointer never made: every reader would
  have to probe the log past the pointer, and the move a dead process decided on (perhaps killed
  by an operator who changed their mind) would be carried out later by whoever came next.
* Nothing is lost if a process dies between the two writes: the entry is inside the pointer.
  :func:`history` shows it (readers merge it in, they never need write access), and the next
  move writes it to the log (create-once, the same content) *before* it swaps the pointer.
  So entry ``N+1`` is only ever written by someone who saw pointer ``N+1``, whose mover first
  made sure entry ``N`` was in the log: the log has no gaps and no orphans, at worst it lags the
  pointer by the one entry the pointer itself holds.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from k3artifacts import faultpoints
from k3artifacts.canonical import canonical_json
from k3artifacts.errors import AlreadyExists, ConfigError, Conflict, K3AError, NotFound
from k3artifacts.policy.model import CHANNEL_NAME
from k3artifacts.policy.results import GateResult, Override
from k3artifacts.releases.tuples import TUPLE_ID
from k3artifacts.stores.records import RecordStore

CHANNEL_SCHEMA = 1
CHANNELS_PREFIX = "releases/channels/"
SEQ_WIDTH = 10  # zero-padded so that keys sort in move order
#: Reads of a pointer that moves while its history is read, before a mismatch is believed.
_REREADS = 5


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Approval(_Frozen):
    """A release engineer's decision that authorized the move: an approval record in the
    store (``policy/approvals.py``), answered under the approver's own identity."""

    who: str = Field(min_length=1)
    #: Where ``who`` came from (``sts``, ``os-user``, ``asserted``); None in entries written
    #: before approvals were records (then ``who`` was typed in a form).
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
    #: Where ``who`` came from (``sts``, ``os-user``, ``asserted``; see ``policy/actor.py``);
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


class ChannelPointer(_Frozen):
    schema_version: int = CHANNEL_SCHEMA
    channel: str
    tuple_id: str = Field(pattern=TUPLE_ID.pattern)
    seq: int = Field(ge=1)
    updated_at: datetime
    updated_by: str
    #: The history entry this move committed; the log is written from it (see module doc).
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


class CorruptRecord(K3AError):
    """A channel record that does not parse or contradicts another: the store was edited."""

    exit_code = 4
    hint = "inspect the key named above; channel records are written only by k3a"


class PointerMismatch(CorruptRecord):
    """The pointer is not the move its history's latest entry records (a hand-edited pointer,
    or a history entry deleted): nobody may follow it until someone looks."""

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


def history_prefix(channel: str) -> str:
    return f"{CHANNELS_PREFIX}{check_channel(channel)}/history/"


def history_key(channel: str, seq: int) -> str:
    return f"{history_prefix(channel)}{seq:0{SEQ_WIDTH}d}.json"


def _parse(model: type[BaseModel], key: str, data: bytes):  # type: ignore[no-untyped-def]
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise CorruptRecord(f"{key} is malformed: {exc.errors()[0]['msg']}") from None


@dataclass(frozen=True)
class ChannelState:
    """A channel as read just before a move: the pointer (None: never moved) and its token."""

    channel: str
    pointer: ChannelPointer | None
    token: str | None

    @property
    def tuple_id(self) -> str | None:
        return None if self.pointer is None else self.pointer.tuple_id

    @property
    def next_seq(self) -> int:
        return 1 if self.pointer is None else self.pointer.seq + 1


def read_state(store: RecordStore, channel: str) -> ChannelState:
    """The pointer as every reader and mover sees it: checked against the history's latest
    entry first (:func:`check_against_history`)."""
    key = pointer_key(channel)
    for attempt in range(_REREADS):
        found = store.read(key)
        if found is None:
            return ChannelState(channel, None, None)
        pointer = _parse(ChannelPointer, key, found.data)
        if pointer.channel != channel:
            raise CorruptRecord(f"{key} names channel {pointer.channel!r}")
        try:
            check_against_history(store, pointer)
        except PointerMismatch:
            # The pointer and the history are two reads: a mover that swapped the pointer and
            # logged its entry between them makes the history look ahead. Only a pointer that
            # stays put while its history disagrees was set by hand.
            again = store.read(key)
            if attempt + 1 < _REREADS and (again is None or again.data != found.data):
                continue
            raise
        return ChannelState(channel, pointer, found.token)
    raise AssertionError("unreachable")


def check_against_history(store: RecordStore, pointer: ChannelPointer) -> None:
    """Raise :class:`PointerMismatch` unless ``pointer`` is the move its history records: the
    latest logged entry is the pointer's own (same seq, same content), or, when its mover died
    before logging it, the one before, whose tuple the pointer's entry says it replaced. One
    listing and one read, whatever the history's length."""
    channel = pointer.channel
    seqs = _logged_seqs(store, channel)
    latest = seqs[-1] if seqs else 0
    where = f"{pointer_key(channel)} in {store.url}"
    if latest > pointer.seq:
        raise PointerMismatch(
            f"{where} says #{pointer.seq} ({pointer.tuple_id}), but the history goes on to "
            f"#{latest}: the pointer was set back by hand", channel)
    if latest == pointer.seq:
        if _read_entry(store, channel, latest) != pointer.entry:
            raise PointerMismatch(
                f"{where} points at {pointer.tuple_id} as #{pointer.seq}, but history entry "
                f"#{latest} records another move: the pointer was edited by hand", channel)
        return
    if latest == pointer.seq - 1 and (
            latest == 0 or _read_entry(store, channel, latest).tuple_id
            == pointer.entry.previous_tuple_id):
        return  # the mover died between its two writes; the next move logs the entry
    raise PointerMismatch(
        f"{where} says #{pointer.seq} ({pointer.tuple_id}), but the history's latest entry is "
        f"#{latest}: the pointer does not follow its history", channel)


def channel_names(store: RecordStore) -> list[str]:
    """Channels that have a pointer in ``store``."""
    names = []
    for key in store.list_keys(CHANNELS_PREFIX):
        rest = key[len(CHANNELS_PREFIX) :]
        if "/" not in rest and rest.endswith(".json") and CHANNEL_NAME.match(rest[:-5]):
            names.append(rest[:-5])
    return names


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
    """The channel's pointer; NotFound (with the known channels) if it was never moved."""
    state = read_state(store, channel)
    if state.pointer is None:
        raise unknown_channel(store, channel)
    return state.pointer


def list_channels(store: RecordStore) -> list[ChannelPointer]:
    return [p for p in (read_state(store, n).pointer for n in channel_names(store)) if p]


def _logged_seqs(store: RecordStore, channel: str) -> list[int]:
    prefix = history_prefix(channel)
    seqs = []
    for key in store.list_keys(prefix):
        stem = key[len(prefix) :].removesuffix(".json")
        if stem.isdigit() and len(stem) == SEQ_WIDTH:
            seqs.append(int(stem))
    return sorted(seqs)


def _read_entry(store: RecordStore, channel: str, seq: int) -> HistoryEntry:
    key = history_key(channel, seq)
    found = store.read(key)
    if found is None:
        raise CorruptRecord(f"{key} vanished while reading the history of {channel}")
    entry = _parse(HistoryEntry, key, found.data)
    if (entry.channel, entry.seq) != (channel, seq):
        raise CorruptRecord(f"{key} holds entry {entry.channel}#{entry.seq}")
    return entry


def iter_history_reversed(
    store: RecordStore,
    channel: str,
    pointer: ChannelPointer | None = None,
    policy_channels: Collection[str] | None = None,
) -> Iterator[HistoryEntry]:
    """Newest first, as of ``pointer`` (default: read it now), one entry read at a time."""
    if pointer is None:
        pointer = read_state(store, channel).pointer
    if pointer is None:
        raise unknown_channel(store, channel, policy_channels)
    seqs = _logged_seqs(store, channel)
    if pointer.seq not in seqs:
        # The mover died after swapping the pointer: the entry lives in the pointer.
        yield pointer.entry
    for seq in reversed(seqs):
        if seq <= pointer.seq:
            yield _read_entry(store, channel, seq)


def history(
    store: RecordStore, channel: str, policy_channels: Collection[str] | None = None
) -> list[HistoryEntry]:
    """Every move of ``channel``, oldest first, seq 1..N without gaps. ``policy_channels``
    shapes the advice when the channel is unknown (see :func:`unknown_channel`)."""
    return list(reversed(list(iter_history_reversed(store, channel, None, policy_channels))))


def _ensure_logged(store: RecordStore, pointer: ChannelPointer) -> None:
    """Write the pointer's entry to the log if its mover died before doing so."""
    key = history_key(pointer.channel, pointer.seq)
    found = store.read(key)
    if found is None:
        try:
            store.create(key, canonical_json(pointer.entry))
            return
        except AlreadyExists:
            found = store.read(key)
            if found is None:
                raise CorruptRecord(f"{key} was created by another mover, then deleted") from None
    if _parse(HistoryEntry, key, found.data) != pointer.entry:
        raise CorruptRecord(f"{key} differs from the entry its channel pointer committed")


def commit_move(store: RecordStore, state: ChannelState, entry: HistoryEntry) -> ChannelPointer:
    """Move the pointer from ``state`` to ``entry`` (compare-and-swap), then log the entry.

    Raises :class:`ChannelMoved` naming the winner if the pointer changed since ``state`` was
    read; then nothing was written.
    """
    if entry.channel != state.channel or entry.seq != state.next_seq:
        raise ValueError(f"entry {entry.channel}#{entry.seq} does not follow {state}")
    if entry.previous_tuple_id != state.tuple_id:
        raise ValueError("entry.previous_tuple_id must be the tuple the state points at")
    if state.pointer is not None:
        _ensure_logged(store, state.pointer)
    pointer = ChannelPointer.for_entry(entry)
    faultpoints.pause("channel-move", state.channel)
    try:
        store.replace(pointer_key(state.channel), canonical_json(pointer), state.token)
    except Conflict:
        raise _lost_race(store, state, entry) from None
    # If we die here the entry survives in the pointer; the next move logs it.
    _ensure_logged(store, pointer)
    return pointer


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
