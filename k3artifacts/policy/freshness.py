"""The store's freshness: one signed record naming the head of every history, that expires
(TUF's timestamp role), so a frozen or restored copy of the store is refused once it is older
than the lifetime the store's policy sets (``freshness: {lifetime_hours}``), even by a client
that never read the store before (a client that did also remembers its heads:
:mod:`k3artifacts.trust.heads`).

``releases/trust/freshness.json`` (compare-and-swap)::

    {"issued_at": ..., "expires": ..., "root_version": 2,
     "policy": {"seq": 3, "digest": ...},
     "channels": {"production": {"seq": 120, "digest": ...}, ...},
     "records": {"k3t-...": {"seq": 5, "digest": ...}, ...}}

``records``: the heads of tuples' record logs (:mod:`k3artifacts.releases.record_log`) a move
or a refresh verified, so a fresh reader notices a record deleted with its log entry.

**Who signs it**: a root identity, or an identity holding the role ``freshness`` in the policy
in force (a scheduled refresh's own key, which can do nothing else). Every move re-signs it
when its mover may (a policy's seed, apply and migration by root identities; a channel move by
a mover holding ``freshness``), and ``k3a trust refresh`` does on a schedule (the
``refresh-freshness`` deployment). The heads it names are lower bounds: a reader refuses a
history whose head is behind the one named (or another entry there), never one ahead of it,
so a re-signing that lost a race only names less.

The clock is the system's, or ``K3A_NOW`` (settings) for drills and tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k3artifacts.errors import Conflict, HistoryRewound, StaleStore, UntrustedRecord
from k3artifacts.policy.document import PolicyDocument
from k3artifacts.settings import load
from k3artifacts.trust.chain import Mark
from k3artifacts.trust.envelope import sign_record, verify_record
from k3artifacts.trust.heads import Head
from k3artifacts.trust.identities import Keyring
from k3artifacts.trust.keys import RecordSigner, signer_key_id
from k3artifacts.trust.pins import Roots
from k3artifacts.trust.root import root_key
from k3artifacts.trust.storage import RecordReader, RecordStore

KEY = "releases/trust/freshness.json"
KIND = "freshness"
ROLE = "freshness"
SHOWN = "the store's signed freshness head"
#: Re-signings lost to a concurrent one before giving up (the next move or refresh signs).
_TRIES = 3


class Freshness(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    issued_at: datetime
    expires: datetime
    root_version: int = Field(ge=1)
    policy: Head
    channels: dict[str, Head] = Field(default_factory=dict)
    records: dict[str, Head] = Field(default_factory=dict)


def now() -> datetime:
    return load().now or datetime.now(UTC)


def signers(document: PolicyDocument, roots: Roots) -> Keyring:
    """Who may sign the freshness head: the root identities and those holding ``freshness``."""
    holders = {k: v for k, v in document.identities.keyring().keys.items() if ROLE in v.roles}
    return Keyring({**roots.current.keyring().keys, **holders})


def read_freshness(store: RecordReader, document: PolicyDocument,
                   roots: Roots) -> Freshness | None:
    found = store.read(KEY)
    if found is None:
        return None
    verified = verify_record(found.data, key=KEY, kind=KIND, keyring=signers(document, roots),
                             roles=None, bound=roots.bound)
    try:
        return Freshness.model_validate(verified.body)
    except ValidationError as exc:
        raise UntrustedRecord(KEY, "malformed", f"not a freshness head: "
                              f"{exc.errors()[0]['msg']}") from None


def _shown(head: Head | Mark) -> str:
    return f"#{head.seq} ({head.digest[:12]})"


def not_behind(history: str, key: str, named: Head | None, head: Mark | None,
               digests: Mapping[int, str]) -> None:
    """``history``'s verified ``head`` is not behind the one the freshness head names, nor
    another entry where it names one (``digests``: the entries verified, by seq)."""
    if named is None:
        return
    seen = f"{_shown(named)} in {SHOWN}"
    if head is None or head.seq < named.seq:
        raise HistoryRewound(key, "rewound", history, seen,
                             "no head" if head is None else f"{_shown(head)} as its head")
    if digests.get(named.seq, named.digest) != named.digest:
        raise HistoryRewound(key, "fork", history, seen,
                             f"#{named.seq} ({digests[named.seq][:12]}) there")


def check(store: RecordReader, document: PolicyDocument, roots: Roots, label: str,
          policy_head: Mark, history: str, digests: Mapping[int, str]) -> Freshness | None:
    """The store's freshness head, where its policy (``document``, ``label``) asks for one:
    StaleStore (exit 4) when it is missing or expired; HistoryRewound when the root or the
    policy's history (``policy_head``, ``digests``) is behind what it names."""
    bound = document.gates.freshness
    if bound is None:
        return None
    fresh = read_freshness(store, document, roots)
    if fresh is None:
        raise StaleStore(f"{store.url} has no signed freshness head ({KEY}), and its policy "
                         f"({label}) asks for one every {bound.lifetime_hours:g} h")
    at = now()
    if at >= fresh.expires:
        stamp = "%Y-%m-%d %H:%M"
        raise StaleStore(f"{store.url}'s signed freshness head expired at "
                         f"{fresh.expires:{stamp}} UTC (signed {fresh.issued_at:{stamp}} UTC, "
                         f"it is {at:{stamp}} UTC): a frozen or restored copy of the store, or "
                         "one nobody refreshed")
    if fresh.root_version > roots.current.version:
        raise HistoryRewound(root_key(fresh.root_version), "rewound", "the store's root",
                             f"v{fresh.root_version} in {SHOWN}", f"v{roots.current.version}")
    not_behind(history, KEY, fresh.policy, policy_head, digests)
    return fresh


def _forward(named: Mapping[str, Head], marks: Mapping[str, Mark]) -> dict[str, Head]:
    moved = dict(named)
    for name, mark in marks.items():
        if name not in moved or moved[name].seq < mark.seq:
            moved[name] = Head(seq=mark.seq, digest=mark.digest)
    return moved


def renew(store: RecordStore, document: PolicyDocument, roots: Roots, signer: RecordSigner, *,
          policy_head: Mark, channels: Mapping[str, Mark],
          records: Mapping[str, Mark] | None = None) -> Freshness | None:
    """Re-sign the freshness head as ``signer`` (None, nothing written, where the policy asks
    for none or ``signer`` may not sign it): ``channels``' heads, ``records``' (record logs by
    tuple id) and the policy's moved forward over the ones it named, its lifetime from now."""
    bound = document.gates.freshness
    trusted = signers(document, roots).get(signer_key_id(signer))
    if bound is None or trusted is None:
        return None
    for _ in range(_TRIES):
        found = store.read(KEY)
        try:
            before = read_freshness(store, document, roots)
        except UntrustedRecord:
            before = None  # a forged or foreign record names nothing worth keeping
        at = now()
        fresh = Freshness(issued_at=at, expires=at + timedelta(hours=bound.lifetime_hours),
                          root_version=roots.current.version,
                          policy=Head(seq=policy_head.seq, digest=policy_head.digest),
                          channels=_forward({} if before is None else before.channels,
                                            channels),
                          records=_forward({} if before is None else before.records,
                                           records or {}))
        record = sign_record(key=KEY, kind=KIND, body=fresh, signer=signer,
                             identity=trusted.identity, store_id=roots.current.store_id)
        try:
            store.replace(KEY, record, None if found is None else found.token)
            return fresh
        except Conflict:
            continue
    return None
