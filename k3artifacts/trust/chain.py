"""A history that cannot be rewritten: a hash-chained log of signed entries, and a pointer to
its head.

Keys (a :class:`ChainLayout` names them)::

    <pointer_key>                      the head: a copy of the newest entry (compare-and-swap)
    <entries_prefix><seq:010d>.json    one entry per move (create-once)
    <checkpoint_key>                   optional: a signed {seq, digest} the walk may stop at

Every entry is a signed record (:mod:`.envelope`) whose body is a :class:`Link`::

    {"seq": 7, "previous": "<digest of entry 6's body>", "entry": {...the caller's model...}}

The pointer holds the head entry's signed record, byte for byte: reading it is reading the
newest move, and a mover that dies between swapping the pointer and logging the entry loses
nothing (the next mover logs those same signed bytes before it moves; the order of writes and
why: :mod:`k3artifacts.releases.channels`). So the pointer needs no signature of its own: it
is trusted exactly as far as the entry it copies.

:func:`verify_chain` walks from the head down to seq 1 (or to the checkpoint's entry), and
refuses by name (:class:`~k3artifacts.errors.UntrustedRecord`):

* a pointer that is not a trusted entry: its own reason (``unsigned``, ``untrusted-key``,
  ``wrong-role``, ``tampered``...): a pointer written by hand, or by a key the policy does not
  trust to move this history;
* ``rewound``: the log goes on past the head, the pointer is gone while the log is not, or the
  head is behind what this reader verified before (``last_seen``);
* ``gap``: an entry missing between the head and the start;
* ``edit``: an entry whose signature or body does not check, or that was signed for another
  place;
* ``fork``: a validly signed entry that is not the one its successor names (or not the one the
  pointer, the checkpoint or the reader's last view holds at that seq).

It returns the verified entries, oldest first, parsed into the caller's model: the only
entries a reader may act on (a rollback's targets, say).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from k3artifacts.canonical import canonical_digest, to_plain
from k3artifacts.errors import AlreadyExists, UntrustedRecord
from k3artifacts.trust.envelope import Verified, parse_record, sign_record, verify_record
from k3artifacts.trust.identities import Keyring
from k3artifacts.trust.keys import RecordSigner
from k3artifacts.trust.storage import RecordReader, RecordStore

T = TypeVar("T", bound=BaseModel)
SEQ_WIDTH = 10
DIGEST = r"^[0-9a-f]{64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Link(_Strict):
    """The body of one entry: its place, the digest of the one before, and the entry."""

    seq: int = Field(ge=1)
    previous: str | None = Field(default=None, pattern=DIGEST)
    entry: dict[str, Any]

    @model_validator(mode="after")
    def _linked(self) -> Link:
        if (self.seq == 1) != (self.previous is None):
            raise ValueError("the first entry names no previous one, and only the first")
        return self


class Checkpoint(_Strict):
    """Entries up to ``seq`` are vouched for by the digest of entry ``seq``: a walk may stop
    there (a long history, or one whose early entries were signed by keys since retired)."""

    seq: int = Field(ge=1)
    digest: str = Field(pattern=DIGEST)


@dataclass(frozen=True)
class ChainLayout:
    #: For messages: what this history is ("channel production").
    name: str
    pointer_key: str
    #: Ends with ``/``.
    entries_prefix: str
    #: The record kind of every entry (and of the pointer, its copy).
    entry_kind: str
    checkpoint_key: str | None = None
    checkpoint_kind: str = "checkpoint"

    def entry_key(self, seq: int) -> str:
        return f"{self.entries_prefix}{seq:0{SEQ_WIDTH}d}.json"


@dataclass(frozen=True)
class Mark:
    """A head a reader verified: keep it, pass it back as ``last_seen``, and a head set back
    behind it, or another history through it, is refused."""

    seq: int
    digest: str


@dataclass(frozen=True)
class ChainEntry(Generic[T]):
    seq: int
    digest: str
    previous: str | None
    entry: T
    #: The identity that made the entry, and every trusted identity that signed it.
    signer: str
    signers: frozenset[str]


@dataclass(frozen=True)
class Chain(Generic[T]):
    """A verified history: entries oldest first (from seq 1, or from the checkpoint's)."""

    layout: ChainLayout
    entries: tuple[ChainEntry[T], ...]
    #: The pointer's version token (None: never moved), for the next move's compare-and-swap.
    token: str | None
    #: The head's signed record as the pointer holds it, and whether the log holds it yet.
    head_record: bytes | None
    head_logged: bool

    @property
    def head(self) -> ChainEntry[T] | None:
        return self.entries[-1] if self.entries else None

    @property
    def mark(self) -> Mark | None:
        head = self.head
        return None if head is None else Mark(head.seq, head.digest)

    @property
    def next_seq(self) -> int:
        head = self.head
        return 1 if head is None else head.seq + 1


def logged_seqs(store: RecordReader, layout: ChainLayout) -> list[int]:
    prefix = layout.entries_prefix
    seqs = []
    for key in store.list_keys(prefix):
        stem = key[len(prefix):].removesuffix(".json")
        if stem.isdigit() and len(stem) == SEQ_WIDTH:
            seqs.append(int(stem))
    return sorted(seqs)


@dataclass(frozen=True)
class _Checked:
    verified: Verified
    link: Link


def _linked(verified: Verified, layout: ChainLayout, seq: int, *, where: str) -> _Checked:
    try:
        link = Link.model_validate(verified.body)
    except ValidationError as exc:
        raise UntrustedRecord(where, "edit", f"entry #{seq} of {layout.name} is not a link: "
                              f"{exc.errors()[0]['msg']}") from None
    if link.seq != seq:
        raise UntrustedRecord(where, "edit",
                              f"entry #{seq} of {layout.name} says it is #{link.seq}")
    return _Checked(verified, link)


def _check_entry(data: bytes, layout: ChainLayout, seq: int, keyring: Keyring,
                 roles: Collection[str] | None, *, where: str) -> _Checked:
    """Entry ``seq``'s record, verified for its place; any failure is an ``edit``."""
    try:
        verified = verify_record(data, key=layout.entry_key(seq), kind=layout.entry_kind,
                                 keyring=keyring, roles=roles)
    except UntrustedRecord as exc:
        raise UntrustedRecord(where, "edit", f"entry #{seq} of {layout.name} does not check "
                              f"({exc.reason}: {exc.detail})") from None
    return _linked(verified, layout, seq, where=where)


def _entry(checked: _Checked, model: type[T], key: str) -> ChainEntry[T]:
    try:
        entry = model.model_validate(checked.link.entry)
    except ValidationError as exc:
        raise UntrustedRecord(key, "malformed", f"a signed entry that is not a {model.__name__}: "
                              f"{exc.errors()[0]['msg']}") from None
    v = checked.verified
    return ChainEntry(checked.link.seq, v.digest, checked.link.previous, entry, v.signer,
                      v.signers)


def _head_seq(data: bytes, key: str) -> int:
    # Only chooses which place the signature must be for; the signature then decides.
    body = parse_record(data, key=key).body
    seq = body.get("seq")
    if not isinstance(seq, int) or seq < 1:
        raise UntrustedRecord(key, "malformed", f"the head names seq {seq!r}")
    return seq


def _checkpoint(store: RecordReader, layout: ChainLayout, keyring: Keyring,
                roles: Collection[str] | None) -> Checkpoint | None:
    if layout.checkpoint_key is None:
        return None
    found = store.read(layout.checkpoint_key)
    if found is None:
        return None
    verified = verify_record(found.data, key=layout.checkpoint_key, kind=layout.checkpoint_kind,
                             keyring=keyring, roles=roles)
    try:
        return Checkpoint.model_validate(verified.body)
    except ValidationError as exc:
        raise UntrustedRecord(layout.checkpoint_key, "malformed",
                              f"not a checkpoint: {exc.errors()[0]['msg']}") from None


def verify_chain(store: RecordReader, layout: ChainLayout, model: type[T], *, keyring: Keyring,
                 roles: Collection[str] | None, last_seen: Mark | None = None) -> Chain[T]:
    """The history as the pointer names it, every entry down to the start (or checkpoint)
    verified and linked; refused by name otherwise (module doc)."""
    where = layout.pointer_key
    found = store.read(where)
    seqs = logged_seqs(store, layout)
    if found is None:
        if seqs:
            raise UntrustedRecord(where, "rewound", f"{layout.name} has no head, but its log "
                                  f"holds entries up to #{seqs[-1]}: the pointer was removed")
        if last_seen is not None:
            raise UntrustedRecord(where, "rewound", f"{layout.name} has no head, but this "
                                  f"reader verified #{last_seen.seq} of it before")
        return Chain(layout, (), None, None, False)
    seq = _head_seq(found.data, where)
    # The pointer's failures keep their own names: it is a forged or a foreign head.
    head = _linked(verify_record(found.data, key=layout.entry_key(seq), kind=layout.entry_kind,
                                 keyring=keyring, roles=roles), layout, seq, where=where)
    if seqs and seqs[-1] > seq:
        raise UntrustedRecord(where, "rewound", f"the head of {layout.name} is #{seq}, but its "
                              f"log goes on to #{seqs[-1]}: the pointer was set back")
    if last_seen is not None and last_seen.seq > seq:
        raise UntrustedRecord(where, "rewound", f"the head of {layout.name} is #{seq}, but this "
                              f"reader verified #{last_seen.seq} before: entries were removed "
                              "and the pointer set back")
    logged = seq in seqs
    if logged:
        key = layout.entry_key(seq)
        copy = store.read(key)
        if copy is None:
            raise UntrustedRecord(key, "gap", f"entry #{seq} of {layout.name} vanished while "
                                  "being read")
        if _check_entry(copy.data, layout, seq, keyring, roles, where=key).verified.digest \
                != head.verified.digest:
            raise UntrustedRecord(key, "fork", f"the log's entry #{seq} of {layout.name} is "
                                  "not the one its pointer holds")
    checkpoint = _checkpoint(store, layout, keyring, roles)
    if checkpoint is not None and checkpoint.seq > seq:
        raise UntrustedRecord(layout.checkpoint_key or where, "rewound",
                              f"a checkpoint at #{checkpoint.seq} of {layout.name} is past its "
                              f"head #{seq}")
    stop = checkpoint.seq if checkpoint is not None else 1
    walked = [head]
    for below in range(seq - 1, stop - 1, -1):
        key = layout.entry_key(below)
        entry = store.read(key)
        if entry is None:
            raise UntrustedRecord(key, "gap", f"entry #{below} of {layout.name} is missing "
                                  f"(the head is #{seq})")
        checked = _check_entry(entry.data, layout, below, keyring, roles, where=key)
        if checked.verified.digest != walked[-1].link.previous:
            raise UntrustedRecord(key, "fork", f"entry #{below} of {layout.name} is not the one "
                                  f"entry #{below + 1} follows")
        walked.append(checked)
    by_seq = {c.link.seq: c.verified.digest for c in walked}
    if checkpoint is not None and by_seq[checkpoint.seq] != checkpoint.digest:
        raise UntrustedRecord(layout.entry_key(checkpoint.seq), "fork",
                              f"entry #{checkpoint.seq} of {layout.name} is not the one its "
                              "checkpoint vouches for")
    if last_seen is not None and by_seq.get(last_seen.seq, last_seen.digest) != last_seen.digest:
        raise UntrustedRecord(layout.entry_key(last_seen.seq), "fork",
                              f"entry #{last_seen.seq} of {layout.name} is not the one this "
                              "reader verified before: the history was rewritten from there")
    entries = tuple(_entry(c, model, layout.entry_key(c.link.seq)) for c in reversed(walked))
    return Chain(layout, entries, found.token, found.data, logged)


def _log(store: RecordStore, layout: ChainLayout, seq: int, data: bytes) -> None:
    """Entry ``seq`` in the log, create-once; the same entry already there is fine."""
    key = layout.entry_key(seq)
    try:
        store.create(key, data)
        return
    except AlreadyExists:
        found = store.read(key)
    ours = canonical_digest(parse_record(data, key=key).body)
    if found is None or canonical_digest(parse_record(found.data, key=key).body) != ours:
        raise UntrustedRecord(key, "fork", f"the log already holds another entry #{seq} of "
                              f"{layout.name}") from None


def append(store: RecordStore, chain: Chain[T], entry: T, *, signer: RecordSigner,
           identity: str) -> Chain[T]:
    """Add ``entry`` after ``chain``'s head: log the head if its mover died before doing so,
    compare-and-swap the pointer to the new entry (the commit point: on
    :class:`~k3artifacts.errors.Conflict` nothing was written), then log it."""
    layout = chain.layout
    head = chain.head
    seq = chain.next_seq
    link = Link(seq=seq, previous=None if head is None else head.digest, entry=to_plain(entry))
    if head is not None and not chain.head_logged and chain.head_record is not None:
        _log(store, layout, head.seq, chain.head_record)
    record = sign_record(key=layout.entry_key(seq), kind=layout.entry_kind, body=link,
                         signer=signer, identity=identity)
    token = store.replace(layout.pointer_key, record, chain.token)
    _log(store, layout, seq, record)
    made = ChainEntry(seq, canonical_digest(link), link.previous, entry, identity,
                      frozenset({identity}))
    return Chain(layout, (*chain.entries, made), token, record, True)


def checkpoint(store: RecordStore, chain: Chain[T], *, signer: RecordSigner,
               identity: str) -> Checkpoint:
    """Vouch for ``chain`` up to its head (replacing any earlier checkpoint): later walks stop
    there. Only for a chain just verified, by an identity trusted to move it."""
    layout = chain.layout
    head = chain.head
    if layout.checkpoint_key is None or head is None:
        raise ValueError(f"{layout.name} has no checkpoint place, or nothing to vouch for")
    point = Checkpoint(seq=head.seq, digest=head.digest)
    found = store.read(layout.checkpoint_key)
    store.replace(layout.checkpoint_key,
                  sign_record(key=layout.checkpoint_key, kind=layout.checkpoint_kind, body=point,
                              signer=signer, identity=identity),
                  None if found is None else found.token)
    return point
