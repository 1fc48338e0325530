"""A history that cannot be rewritten: a hash-chained log of signed entries, and a pointer to
its head.

Keys (a :class:`ChainLayout` names them)::

    <pointer_key>                      the head: a copy of the newest entry (compare-and-swap)
    <entries_prefix><seq:010d>.json    one entry per move (create-once)
    <checkpoint_key>                   optional: a signed {seq, digest} the walk may stop at
    <base_key>                         optional: entries 1..N of a history older than signing,
                                       re-signed as one record (its migration's)

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
  trust to move this history; ``unsigned`` names ``k3a trust migrate`` as the next step (a
  history older than signing is migrated into signed entries before anyone reads it:
  :mod:`k3artifacts.migration`);
* ``rewound``: the log goes on past the head, the pointer is gone while the log is not, or the
  head is behind what this reader verified before (``last_seen``);
* ``gap``: an entry missing between the head and the start;
* ``edit``: an entry whose signature or body does not check, or that was signed for another
  place;
* ``fork``: a validly signed entry that is not the one its successor names (or not the one the
  pointer, the checkpoint or the reader's last view holds at that seq).

It returns the verified entries, oldest first, parsed into the caller's model: the only
entries a reader may act on (a rollback's targets, say).

Who may sign an entry can depend on the entry itself (``keyring`` as a function of the
entry's body: a policy change is checked against the root it names, a channel move against
the policy version that judged it); the caller then checks that what entries name only moves
forward. A checkpoint is signed by keys of its own (``checkpoint_keyring``: the root's).

**A history older than signing** is migrated once (:mod:`k3artifacts.migration.histories`):
its entries, as found, re-signed as links in one record, the **base** (:class:`Base`), which
the pointer holds until the next move. Where the log's entry is unsigned (or absent: its mover
died before logging it) and the base holds one in that place, the base's is read instead; the
log's own copy is never read as an entry. Entries read from it are marked ``in_base``. Every
entry, pointer, checkpoint and base read here is signed: nothing is read as found.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from k3artifacts.canonical import canonical_digest, to_plain
from k3artifacts.errors import AlreadyExists, Conflict, HistoryRewound, UntrustedRecord
from k3artifacts.trust.envelope import (
    Bound,
    Verified,
    is_unsigned,
    parse_record,
    sign_record,
    verify_record,
)
from k3artifacts.trust.identities import Keyring
from k3artifacts.trust.keys import RecordSigner
from k3artifacts.trust.storage import Found, RecordReader, RecordStore

T = TypeVar("T", bound=BaseModel)
SEQ_WIDTH = 10
DIGEST = r"^[0-9a-f]{64}$"
#: The next step for an unsigned entry or pointer.
UNSIGNED_HINT = ("a store older than signed records: one of its root identities runs `k3a trust "
                 "migrate`; anywhere else, restore the record from a backup and find who can "
                 "write to the store")


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


class Base(_Strict):
    """Entries 1..N of a history written before records were signed, each as found inside a
    link naming the one before, signed together by one record (``k3a trust migrate``)."""

    links: list[Link] = Field(min_length=1)

    @model_validator(mode="after")
    def _in_order(self) -> Base:
        previous = None
        for seq, link in enumerate(self.links, start=1):
            if link.seq != seq or link.previous != previous:
                raise ValueError("the base's links are not entries 1..N each naming the one "
                                 "before")
            previous = canonical_digest(link)
        return self


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
    #: Where a history migrated from before signing keeps its :class:`Base`.
    base_key: str | None = None
    base_kind: str = "history-base"

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
    #: The identity that made the entry, and every trusted identity that signed it (for an
    #: entry ``in_base``: that signed the base, vouching for it).
    signer: str
    signers: frozenset[str]
    in_base: bool = False


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
    #: The store its entries were verified for: what the next entry is signed for.
    bound: Bound
    #: The history's base as this walk read it, for :func:`entry_below` (read once).
    base: _BaseReader | None = field(default=None, compare=False, repr=False)

    @property
    def whole(self) -> bool:
        """Whether :attr:`entries` go back to the start (not only what was new, or only down
        to a checkpoint)."""
        return not self.entries or self.entries[0].seq == 1

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


#: Who may sign an entry: one keyring for all, or one chosen by the entry's body (the
#: ``entry`` of its link, as stored: only a choice, the signature then decides).
KeyringFor = Keyring | Callable[[dict[str, Any]], Keyring]


def histories_under(store: RecordReader, prefix: str, named: Callable[[str], bool]) -> list[str]:
    """The names of the histories laid out under ``prefix`` (a pointer ``<name>.json`` beside
    its entries under ``<name>/``) that ``named`` accepts: one whose pointer is gone while its
    entries are there is listed, for its reader to refuse, never left out."""
    names = set()
    for key in store.list_keys(prefix):
        rest = key[len(prefix):]
        name, slash, _ = rest.partition("/")
        name = name if slash else name.removesuffix(".json")
        if (slash or rest.endswith(".json")) and named(name):
            names.add(name)
    return sorted(names)


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
    in_base: bool = False


def _unsigned(exc: UntrustedRecord) -> UntrustedRecord:
    """``exc``, with the next step where the record is unsigned."""
    if exc.reason == "unsigned":
        return UntrustedRecord(exc.key, exc.reason, exc.detail, hint=UNSIGNED_HINT)
    return exc


def _keyring(keyring: KeyringFor, data: bytes, key: str) -> Keyring:
    if isinstance(keyring, Keyring):
        return keyring
    entry = parse_record(data, key=key).body.get("entry")
    return keyring(entry if isinstance(entry, dict) else {})


def _verify(data: bytes, layout: ChainLayout, seq: int, keyring: KeyringFor,
            roles: Collection[str] | None, bound: Bound, *, where: str) -> Verified:
    try:
        return verify_record(data, key=layout.entry_key(seq), kind=layout.entry_kind,
                             keyring=_keyring(keyring, data, where), roles=roles, bound=bound)
    except UntrustedRecord as exc:
        raise _unsigned(exc) from None


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


def _check_entry(data: bytes, layout: ChainLayout, seq: int, keyring: KeyringFor,
                 roles: Collection[str] | None, bound: Bound, *, where: str) -> _Checked:
    """Entry ``seq``'s record, verified for its place; any failure is an ``edit``, but for
    one signed for another store, which keeps its name."""
    try:
        verified = _verify(data, layout, seq, keyring, roles, bound, where=where)
    except UntrustedRecord as exc:
        if exc.reason == "another-store":
            raise
        raise UntrustedRecord(where, "edit", f"entry #{seq} of {layout.name} does not check "
                              f"({exc.reason}: {exc.detail})", hint=exc.hint) from None
    return _linked(verified, layout, seq, where=where)


def _entry(checked: _Checked, model: type[T], key: str) -> ChainEntry[T]:
    v = checked.verified
    return ChainEntry(checked.link.seq, v.digest, checked.link.previous,
                      _parsed(checked.link.entry, model, key), v.signer, v.signers,
                      checked.in_base)


def _base_links(data: bytes, layout: ChainLayout, keyring: KeyringFor,
                roles: Collection[str] | None, bound: Bound) -> list[_Checked]:
    """The base's entries, verified: who may sign it is chosen by its last entry, as for an
    entry (only a choice: the signature then decides, before the body is parsed)."""
    where = layout.base_key
    assert where is not None
    if isinstance(keyring, Keyring):
        ring = keyring
    else:
        links = parse_record(data, key=where).body.get("links")
        last = links[-1] if isinstance(links, list) and links else None
        entry = last.get("entry") if isinstance(last, dict) else None
        ring = keyring(entry if isinstance(entry, dict) else {})
    verified = verify_record(data, key=where, kind=layout.base_kind, keyring=ring, roles=roles,
                             bound=bound)
    try:
        links = Base.model_validate(verified.body).links
    except ValidationError as exc:
        raise UntrustedRecord(where, "malformed", f"not a base of {layout.name}: "
                              f"{exc.errors()[0]['msg']}") from None
    return [_Checked(Verified(where, layout.entry_kind, to_plain(link), canonical_digest(link),
                              verified.signer, verified.signers), link, in_base=True)
            for link in links]


class _BaseReader:
    """The base, read once and only when an entry in its place is wanted. A plain class, not a
    dataclass: a :class:`Chain` holding one sits in pydantic plans, which would otherwise build
    a validator for each field (a store is a protocol, nothing to check an instance against)."""

    def __init__(self, store: RecordReader, layout: ChainLayout, keyring: KeyringFor,
                 roles: Collection[str] | None, bound: Bound):
        self.store, self.layout, self.keyring, self.roles = store, layout, keyring, roles
        self.bound = bound
        self._links: list[_Checked] | None = None

    def at(self, seq: int) -> _Checked | None:
        if self.layout.base_key is None:
            return None
        if self._links is None:
            found = self.store.read(self.layout.base_key)
            if found is None:
                return None
            self._links = _base_links(found.data, self.layout, self.keyring, self.roles,
                                      self.bound)
        return self._links[seq - 1] if seq <= len(self._links) else None


def _parsed(plain: dict[str, Any], model: type[T], key: str) -> T:
    try:
        return model.model_validate(plain)
    except ValidationError as exc:
        raise UntrustedRecord(key, "malformed", f"an entry that is not a {model.__name__}: "
                              f"{exc.errors()[0]['msg']}") from None


def _head_seq(data: bytes, key: str) -> int:
    # Only chooses which place the signature must be for; the signature then decides.
    body = parse_record(data, key=key).body
    seq = body.get("seq")
    if not isinstance(seq, int) or seq < 1:
        raise UntrustedRecord(key, "malformed", f"the head names seq {seq!r}")
    return seq


def _checkpoint(store: RecordReader, layout: ChainLayout, keyring: Keyring,
                bound: Bound) -> Checkpoint | None:
    if layout.checkpoint_key is None:
        return None
    found = store.read(layout.checkpoint_key)
    if found is None:
        return None
    verified = verify_record(found.data, key=layout.checkpoint_key, kind=layout.checkpoint_kind,
                             keyring=keyring, roles=None, bound=bound)
    try:
        point = Checkpoint.model_validate(verified.body)
    except ValidationError as exc:
        raise UntrustedRecord(layout.checkpoint_key, "malformed",
                              f"not a checkpoint: {exc.errors()[0]['msg']}") from None
    return point


def _logged(store: RecordReader, layout: ChainLayout, seq: int) -> bool:
    # One read, not a listing: a listing costs the whole history's length.
    return store.read(layout.entry_key(seq)) is not None


def _shown(mark: Mark) -> str:
    return f"#{mark.seq} ({mark.digest[:12]})"


def verify_chain(store: RecordReader, layout: ChainLayout, model: type[T], *,
                 keyring: KeyringFor, roles: Collection[str] | None, bound: Bound,
                 checkpoint_keyring: Keyring | None = None,
                 last_seen: Mark | None = None, full: bool = False) -> Chain[T]:
    """The history as the pointer names it, verified and linked from its head down to
    ``last_seen`` (the head this reader verified before: only what is new), else to the
    checkpoint, else to the start (``full``: to the checkpoint or the start whatever the
    reader saw); refused by name otherwise (module doc). ``bound``: the store every entry,
    base and checkpoint must be signed for (its root's id). ``checkpoint_keyring``: who may
    sign its checkpoint (default: ``keyring``, when that is one keyring)."""
    where = layout.pointer_key
    found = store.read(where)
    if found is None:
        if _logged(store, layout, 1):
            raise UntrustedRecord(where, "rewound", f"{layout.name} has no head, but its log "
                                  "holds entries: the pointer was removed")
        if last_seen is not None:
            raise HistoryRewound(where, "rewound", layout.name, _shown(last_seen), "no head")
        return Chain(layout, (), None, None, False, bound)
    if checkpoint_keyring is None:
        assert isinstance(keyring, Keyring), "a per-entry keyring needs a checkpoint_keyring"
        checkpoint_keyring = keyring
    checkpoint = _checkpoint(store, layout, checkpoint_keyring, bound)
    base = _BaseReader(store, layout, keyring, roles, bound)
    if layout.base_key is not None and _kind(found.data, where) == layout.base_kind:
        return _base_only(store, layout, model, found, base, checkpoint, last_seen)
    try:
        seq = _head_seq(found.data, where)
    except UntrustedRecord as exc:
        raise _unsigned(exc) from None
    # The pointer's failures keep their own names: it is a forged or a foreign head.
    try:
        head = _linked(_verify(found.data, layout, seq, keyring, roles, bound, where=where),
                       layout, seq, where=where)
    except UntrustedRecord as exc:
        raise UntrustedRecord(where, exc.reason, f"the head of {layout.name} (#{seq}): "
                              f"{exc.detail}", hint=exc.hint) from None
    if last_seen is not None and last_seen.seq > seq:
        raise HistoryRewound(where, "rewound", layout.name, _shown(last_seen),
                             f"#{seq} ({head.verified.digest[:12]}) as its head")
    if _logged(store, layout, seq + 1):
        raise UntrustedRecord(where, "rewound", f"the head of {layout.name} is #{seq}, but its "
                              f"log goes on to #{seq + 1}: the pointer was set back")
    key = layout.entry_key(seq)
    copy = store.read(key)
    logged = copy is not None
    if copy is not None and _check_entry(copy.data, layout, seq, keyring, roles, bound,
                                         where=key).verified.digest != head.verified.digest:
        raise UntrustedRecord(key, "fork", f"the log's entry #{seq} of {layout.name} is not "
                              "the one its pointer holds")
    if checkpoint is not None and checkpoint.seq > seq:
        raise UntrustedRecord(layout.checkpoint_key or where, "rewound",
                              f"a checkpoint at #{checkpoint.seq} of {layout.name} is past its "
                              f"head #{seq}")
    stop = 1 if checkpoint is None else checkpoint.seq
    if last_seen is not None and not full and last_seen.seq >= stop:
        stop = last_seen.seq  # what this reader verified before needs no second walk
    walked = [head]
    for _ in range(seq - 1, stop - 1, -1):
        walked.append(_below(store, layout, walked[-1].link.seq, walked[-1].link.previous,
                             keyring, roles, bound, head_seq=seq, base=base))
    entries = [_entry(c, model, layout.entry_key(c.link.seq)) for c in reversed(walked)]
    if checkpoint is not None and entries[0].seq == checkpoint.seq \
            and entries[0].digest != checkpoint.digest:
        raise UntrustedRecord(layout.entry_key(checkpoint.seq), "fork",
                              f"entry #{checkpoint.seq} of {layout.name} is not the one its "
                              "checkpoint vouches for")
    # Below a checkpoint the entries are still signed: read back on demand.
    chain = Chain(layout, tuple(entries), found.token, found.data, logged, bound, base)
    _check_last_seen(chain, last_seen)
    return chain


def _below(store: RecordReader, layout: ChainLayout, above: int, previous: str | None,
           keyring: KeyringFor, roles: Collection[str] | None, bound: Bound, *,
           head_seq: int, base: _BaseReader) -> _Checked:
    """The entry #``above`` follows, verified for its place and as the one it names
    (``previous``): the log's, or the base's where the log's is older than signing."""
    below = above - 1
    key = layout.entry_key(below)
    entry = store.read(key)
    based = None if entry is not None and not is_unsigned(entry.data, key=key) \
        else base.at(below)
    if based is not None:
        checked = based
    elif entry is None:
        raise UntrustedRecord(key, "gap", f"entry #{below} of {layout.name} is missing "
                              f"(the head is #{head_seq})")
    else:
        checked = _check_entry(entry.data, layout, below, keyring, roles, bound, where=key)
    if checked.verified.digest != previous:
        raise UntrustedRecord(key, "fork", f"entry #{below} of {layout.name} is not the one "
                              f"entry #{below + 1} follows")
    return checked


def entry_below(store: RecordReader, chain: Chain[T], entry: ChainEntry[T], model: type[T], *,
                keyring: KeyringFor, roles: Collection[str] | None) -> ChainEntry[T] | None:
    """The entry ``entry`` follows, verified as :func:`verify_chain` would (for a reader that
    verified only what was new, or down to a checkpoint, and now reads further back); None
    below the first."""
    if entry.seq <= 1:
        return None
    head = chain.head
    checked = _below(store, chain.layout, entry.seq, entry.previous, keyring, roles,
                     chain.bound, head_seq=entry.seq if head is None else head.seq,
                     base=chain.base or _BaseReader(store, chain.layout, keyring, roles,
                                                    chain.bound))
    return _entry(checked, model, chain.layout.entry_key(checked.link.seq))


def _kind(data: bytes, key: str) -> str | None:
    try:
        return parse_record(data, key=key).kind
    except UntrustedRecord:
        return None  # the head's own reading names what it is


def _base_only(store: RecordReader, layout: ChainLayout, model: type[T], found: Found,
               base: _BaseReader, checkpoint: Checkpoint | None,
               last_seen: Mark | None) -> Chain[T]:
    """A history whose pointer holds its base, byte for byte: migrated, not moved since."""
    assert layout.base_key is not None
    where = layout.pointer_key
    stored = store.read(layout.base_key)
    if stored is None or stored.data != found.data:
        raise UntrustedRecord(where, "fork", f"the head of {layout.name} is a base that "
                              f"{layout.base_key} does not hold")
    links = _base_links(found.data, layout, base.keyring, base.roles, base.bound)
    seq = len(links)
    if _logged(store, layout, seq + 1):
        raise UntrustedRecord(where, "rewound", f"the head of {layout.name} is #{seq}, but its "
                              f"log goes on to #{seq + 1}: the pointer was set back")
    if checkpoint is not None and checkpoint.seq > seq:
        raise UntrustedRecord(layout.checkpoint_key or where, "rewound",
                              f"a checkpoint at #{checkpoint.seq} of {layout.name} is past its "
                              f"head #{seq}")
    entries = [_entry(c, model, layout.entry_key(c.link.seq)) for c in links]
    chain = Chain(layout, tuple(entries), found.token, found.data, True, base.bound, base)
    _check_last_seen(chain, last_seen)
    return chain


def _check_last_seen(chain: Chain[T], last_seen: Mark | None) -> None:
    if last_seen is None:
        return
    layout = chain.layout
    head = chain.head
    assert head is not None
    if last_seen.seq > head.seq:
        raise HistoryRewound(layout.pointer_key, "rewound", layout.name, _shown(last_seen),
                             f"#{head.seq} ({head.digest[:12]}) as its head")
    by_seq = {e.seq: e.digest for e in chain.entries}
    if by_seq.get(last_seen.seq, last_seen.digest) != last_seen.digest:
        raise HistoryRewound(layout.entry_key(last_seen.seq), "fork", layout.name,
                             _shown(last_seen), f"#{last_seen.seq} ({by_seq[last_seen.seq][:12]})"
                             " there: the history was rewritten from there")


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


def next_link(chain: Chain[T], entry: T) -> Link:
    """The body of the entry that would follow ``chain``'s head."""
    head = chain.head
    return Link(seq=chain.next_seq, previous=None if head is None else head.digest,
                entry=to_plain(entry))


def append_record(store: RecordStore, chain: Chain[T], record: bytes) -> str:
    """Add ``record`` (a signed entry whose link follows ``chain``'s head: :func:`next_link`,
    signed there and perhaps by more identities since) after the head: log the head if its
    mover died before doing so, compare-and-swap the pointer to the new entry (the commit
    point: on :class:`~k3artifacts.errors.Conflict` nothing was written), then log it.
    Returns the pointer's new token."""
    layout = chain.layout
    head = chain.head
    key = layout.entry_key(chain.next_seq)
    link = Link.model_validate(parse_record(record, key=key).body)
    if link.seq != chain.next_seq or link.previous != (None if head is None else head.digest):
        raise Conflict(f"the entry to add to {layout.name} follows #{link.seq - 1}, not its "
                       f"head #{chain.next_seq - 1}; nothing was written")
    if head is not None and not chain.head_logged and chain.head_record is not None:
        _log(store, layout, head.seq, chain.head_record)
    token = store.replace(layout.pointer_key, record, chain.token)
    _log(store, layout, link.seq, record)
    return token


def append(store: RecordStore, chain: Chain[T], entry: T, *, signer: RecordSigner,
           identity: str) -> Chain[T]:
    """Add ``entry`` after ``chain``'s head, signed by ``signer`` as ``identity``
    (:func:`append_record`)."""
    layout = chain.layout
    link = next_link(chain, entry)
    record = sign_record(key=layout.entry_key(link.seq), kind=layout.entry_kind, body=link,
                         signer=signer, identity=identity, store_id=chain.bound.store_id)
    token = append_record(store, chain, record)
    made = ChainEntry(link.seq, canonical_digest(link), link.previous, entry, identity,
                      frozenset({identity}))
    return Chain(layout, (*chain.entries, made), token, record, True, chain.bound, chain.base)


def checkpoint(store: RecordStore, chain: Chain[T], *, signer: RecordSigner,
               identity: str) -> Checkpoint:
    """Vouch for ``chain`` up to its head (replacing any earlier checkpoint): later walks stop
    there. Only for a chain just verified, by an identity trusted to vouch for it."""
    layout = chain.layout
    head = chain.head
    if layout.checkpoint_key is None or head is None:
        raise ValueError(f"{layout.name} has no checkpoint place, or nothing to vouch for")
    return _vouch(store, layout, Checkpoint(seq=head.seq, digest=head.digest), signer, identity,
                  chain.bound.store_id)


def _vouch(store: RecordStore, layout: ChainLayout, point: Checkpoint, signer: RecordSigner,
           identity: str, store_id: str | None) -> Checkpoint:
    assert layout.checkpoint_key is not None
    found = store.read(layout.checkpoint_key)
    store.replace(layout.checkpoint_key,
                  sign_record(key=layout.checkpoint_key, kind=layout.checkpoint_kind, body=point,
                              signer=signer, identity=identity, store_id=store_id),
                  None if found is None else found.token)
    return point
