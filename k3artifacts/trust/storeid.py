"""How a store whose root predates store ids gets one, and how the records it signed before
are read after.

A root made before ids has none, and its records name none: they read as they always did. The
store's next root rotation gives it one (:func:`~.root.next_root`), and the root identity that
publishes that rotation first vouches for every record the store holds that names no store:
the digests of their signed statements, at::

    releases/trust/earlier/<store id>.json    {"statements": [sha256...]}, signed for that
                                             store id (its statement names it), create-once

written just before the rotation is published (:func:`vouch_earlier`). From then on a record
naming no store is read only if its statement is one of those (:func:`earlier`): a record
copied in from another store, which could name no store either, is refused
(``another-store``), and so is one signed without an id in the moment between the two writes
(its maker signs it again). Nothing else changes: every record keeps its bytes and signature.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from k3artifacts.errors import UntrustedRecord
from k3artifacts.trust.envelope import (
    Bound,
    parse_record,
    sign_record,
    statement_digest,
    verify_record,
)
from k3artifacts.trust.keys import RecordSigner
from k3artifacts.trust.root import Root
from k3artifacts.trust.storage import RecordReader, RecordStore

KIND = "earlier-records"
#: Where signed records live: every record under these is one a reader may verify.
RECORD_PREFIXES = ("releases/", "warm/artifacts/")


def earlier_key(store_id: str) -> str:
    return f"releases/trust/earlier/{store_id}.json"


class EarlierRecords(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    #: The digest of each signed statement the store held naming no store, sorted.
    statements: list[str]


def _unbound_statement(data: bytes, key: str) -> str | None:
    """The digest of the statement ``data`` carries, if it is a signed record naming no
    store; None for anything else (bytes that are no signed record are never read as one)."""
    try:
        record = parse_record(data, key=key)
        payload = base64.b64decode(record.envelope.payload, validate=True)
        predicate = json.loads(payload)["predicate"]
        named = predicate.get("store")
    except (UntrustedRecord, binascii.Error, ValueError, KeyError, TypeError, AttributeError):
        return None
    return statement_digest(payload) if named is None else None


def unbound_statements(store: RecordReader) -> list[str]:
    """Every statement of a record the store holds that names no store, sorted."""
    found: set[str] = set()
    for prefix in RECORD_PREFIXES:
        for key in store.list_keys(prefix):
            if not key.endswith(".json"):
                continue
            record = store.read(key)
            digest = None if record is None else _unbound_statement(record.data, key)
            if digest is not None:
                found.add(digest)
    return sorted(found)


def vouch_earlier(store: RecordStore, old: Root, new: Root, signer: RecordSigner,
                  identity: str) -> None:
    """Before ``new`` (the first root with an id, following ``old``) is published: vouch, as
    ``identity`` (of ``old``), for every record the store holds that names no store. Once is
    enough (create-once): a co-signer completing the same rotation again finds it written,
    and it must verify (UntrustedRecord otherwise: someone else wrote that key)."""
    assert new.store_id is not None
    key = earlier_key(new.store_id)
    if store.read(key) is not None:
        _reader(store, new.store_id, old)()
        return
    body = EarlierRecords(statements=unbound_statements(store))
    store.create(key, sign_record(key=key, kind=KIND, body=body, signer=signer,
                                  identity=identity, store_id=new.store_id))


def bound(store: RecordReader, by_version: dict[int, Root], current: Root) -> Bound:
    """What records of ``store`` are bound to under ``current``, its roots ``by_version``: its
    id, and where an earlier root had none, the records vouched for when it got one (read
    when a record naming no store is first met)."""
    store_id = current.store_id
    if store_id is None:
        return Bound(None)
    given = min(v for v, root in by_version.items() if root.store_id is not None)
    if given == 1:
        return Bound(store_id)  # born with its id: every record it holds names it
    vouchers = by_version[given - 1]
    return Bound(store_id, cache(_reader(store, store_id, vouchers)))


def _reader(store: RecordReader, store_id: str, vouchers: Root) -> Callable[[], frozenset[str]]:
    def read() -> frozenset[str]:
        key = earlier_key(store_id)
        found = store.read(key)
        if found is None:
            return frozenset()
        # Vouched for by an identity of the root that gave the store its id, for this id.
        verified = verify_record(found.data, key=key, kind=KIND, keyring=vouchers.keyring(),
                                 roles=None, bound=Bound(store_id))
        try:
            earlier = EarlierRecords.model_validate(verified.body)
        except ValidationError as exc:
            raise UntrustedRecord(key, "malformed", f"not a list of earlier records: "
                                  f"{exc.errors()[0]['msg']}") from None
        return frozenset(earlier.statements)
    return read
