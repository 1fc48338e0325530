"""A tuple's record log: which records of a tuple exist, so one deleted afterwards is reported
missing by name instead of reading as never recorded.

A team file store's record directories are group-writable by design, and on S3 anyone who may
write the bucket may delete: a member could remove another's review or evaluation and a gate
would then say the evidence is absent. So every record made for a tuple (reviews, evaluations,
image scans, preflights, traffic analyses) is also appended, by the identity that made it, to
the tuple's log, a signed hash chain (:mod:`k3artifacts.trust.chain`, as a channel's history)::

    releases/records/<tuple-id>.json                the head: the newest entry (compare-and-swap)
    releases/records/<tuple-id>/log/<seq>.json      one signed entry per record (create-once)

Each entry holds every record logged so far (:class:`LogEntry`): the record added last, and
the list it extends. A reader checks that each entry it walks is the one before plus one
record, so the head alone says what must be there, and a member who appends a list that drops
another's record is refused (``edit``). A reader walks only what is new since the head it
verified before (kept beside its pin: :mod:`k3artifacts.trust.heads`), so a log set back
behind it (the entry and the record both deleted) is refused as a rewind
(:class:`~k3artifacts.errors.HistoryRewound`); a fresh reader walks the log from its start (a
tuple gathers tens of records, not thousands) and is held to the head the store's signed
freshness head names for it (:mod:`k3artifacts.policy.freshness`: a promotion names the moved
tuple's, ``k3a trust refresh`` every tuple's).

An entry is signed by an identity holding the role of the kind of record it adds
(:data:`~k3artifacts.policy.signed.KIND_ROLES`) in the policy in force, as the record is.
Writing the record comes first; logging it second (a writer that dies between leaves a record
the next write of the same record logs). **Old stores**: a tuple without a log reads as
before, and its log starts with the first record made for it after this version; records made
before it are read as they always were, never named missing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from k3artifacts.errors import Conflict, RecordMissing, UntrustedRecord
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.freshness import not_behind
from k3artifacts.policy.signed import KIND_ROLES, RecordTrust, record_trust
from k3artifacts.releases.tuples import TUPLE_ID, check_tuple_id
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust import heads
from k3artifacts.trust.chain import (
    Chain,
    ChainLayout,
    Mark,
    append,
    histories_under,
    verify_chain,
)
from k3artifacts.trust.identities import Keyring

LOG_PREFIX = "releases/records/"
ENTRY_KIND = "record-log-entry"
#: Appends lost to concurrent ones (each re-reads the log) before giving up.
_TRIES = 5


class LoggedRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(min_length=1)
    kind: str
    #: The identity whose key signed the record.
    signed_by: str
    recorded_at: datetime

    def shown(self) -> str:
        return (f"{self.key} ({self.kind} signed by {self.signed_by}, recorded "
                f"{self.recorded_at:%Y-%m-%d %H:%M} UTC)")


class LogEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tuple_id: str = Field(pattern=TUPLE_ID.pattern)
    #: Every record logged for the tuple, the one this entry adds last.
    records: list[LoggedRecord] = Field(min_length=1)


def layout(tuple_id: str) -> ChainLayout:
    tuple_id = check_tuple_id(tuple_id)
    return ChainLayout(name=f"the record log of {tuple_id}",
                       pointer_key=f"{LOG_PREFIX}{tuple_id}.json",
                       entries_prefix=f"{LOG_PREFIX}{tuple_id}/log/", entry_kind=ENTRY_KIND)


def _signers(trust: RecordTrust) -> Callable[[dict[str, Any]], Keyring]:
    """Who may sign an entry: identities holding the role of the kind of record it adds (the
    entry's own claim only chooses the keyring; the signature then decides)."""
    def keyring(entry: dict[str, Any]) -> Keyring:
        records = entry.get("records")
        added = records[-1] if isinstance(records, list) and records else {}
        roles = KIND_ROLES.get(added.get("kind") if isinstance(added, dict) else None, ())
        return Keyring({k: v for k, v in trust.keyring.keys.items() if set(roles) & v.roles})
    return keyring


def _verified(store: RecordStore, tuple_id: str, trust: RecordTrust) -> Chain[LogEntry]:
    where = layout(tuple_id)
    chain = verify_chain(store, where, LogEntry, keyring=_signers(trust), roles=None,
                         bound=trust.bound,
                         checkpoint_keyring=Keyring({}),
                         last_seen=heads.seen(store.url, where.name))
    not_behind(where.name, where.pointer_key, trust.record_logs.get(tuple_id), chain.mark,
               {e.seq: e.digest for e in chain.entries})
    before: list[LoggedRecord] | None = None
    for e in chain.entries:
        records = e.entry.records
        key = where.entry_key(e.seq)
        if e.entry.tuple_id != tuple_id:
            raise UntrustedRecord(key, "wrong-key", f"entry #{e.seq} of {where.name} is about "
                                  f"{e.entry.tuple_id}")
        if len(records) != e.seq or (before is not None and records[:-1] != before):
            raise UntrustedRecord(key, "edit", f"entry #{e.seq} of {where.name} does not keep "
                                  "every record the entry before it names, plus one")
        before = records
    heads.remember(store.url, where.name, chain.mark)
    return chain


def logged_tuples(store: RecordStore) -> list[str]:
    """The tuples that have a record log's pointer or entries (:func:`histories_under`)."""
    return histories_under(store, LOG_PREFIX, lambda name: bool(TUPLE_ID.match(name)))


def head_mark(store: RecordStore, tuple_id: str, *,
              trust: RecordTrust | None = None) -> Mark | None:
    """The head of the tuple's record log, verified (None: no log): what the store's
    freshness head names for it."""
    return _verified(store, tuple_id, trust or record_trust(store)).mark


def logged(store: RecordStore, tuple_id: str, *,
           trust: RecordTrust | None = None) -> list[LoggedRecord]:
    """Every record the tuple's verified log names, oldest first (none: no log yet)."""
    head = _verified(store, tuple_id, trust or record_trust(store)).head
    return [] if head is None else list(head.entry.records)


def log_record(store: RecordStore, tuple_id: str, *, key: str, kind: str, signed_by: str,
               by: Acting) -> None:
    """Append the record at ``key`` (made for ``tuple_id``, signed by ``signed_by``) to the
    tuple's log, signed by ``by``; nothing when the log names it already, or when the policy
    in force does not trust ``by`` for ``kind`` (no reader would trust the record either: a
    store whose policy is not in force yet). Compare-and-swap: a concurrent append is read
    back and this one made after it."""
    trust = record_trust(store)
    if _signers(trust)({"records": [{"kind": kind}]}).get(by.key_id) is None:
        return
    for _ in range(_TRIES):
        chain = _verified(store, tuple_id, trust)
        names = [] if chain.head is None else list(chain.head.entry.records)
        if any(r.key == key for r in names):
            return
        added = LoggedRecord(key=key, kind=kind, signed_by=signed_by,
                             recorded_at=datetime.now(UTC))
        try:
            moved = append(store, chain, LogEntry(tuple_id=tuple_id, records=[*names, added]),
                           signer=by.signer, identity=by.name)
        except Conflict:
            continue
        heads.remember(store.url, chain.layout.name, moved.mark)
        return
    raise Conflict(f"{layout(tuple_id).name} kept moving under this append",
                   hint="record it again: the record is there, only its logging lost the race")


def check_present(store: RecordStore, tuple_id: str, prefix: str, present: Collection[str], *,
                  trust: RecordTrust | None = None) -> None:
    """RecordMissing (exit 4) unless every record the tuple's log names under ``prefix`` is
    among ``present`` (the keys a listing found)."""
    gone = [r for r in logged(store, tuple_id, trust=trust)
            if r.key.startswith(prefix) and r.key not in present]
    _refuse(tuple_id, gone)


def check_all(store: RecordStore, tuple_id: str, *,
              trust: RecordTrust | None = None) -> list[LoggedRecord]:
    """Every record the tuple's log names, each still in the store (one metadata request
    each); RecordMissing (exit 4) naming those that are not."""
    records = logged(store, tuple_id, trust=trust)
    _refuse(tuple_id, [r for r in records if store.modified_at(r.key) is None])
    return records


def _refuse(tuple_id: str, gone: Iterable[LoggedRecord]) -> None:
    missing = [r.shown() for r in gone]
    if missing:
        raise RecordMissing(layout(tuple_id).name, missing)
