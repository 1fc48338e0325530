"""Evidence recorded beside a tuple (evaluation reports, traffic analyses, preflights, image
scans): each record is signed by the identity that made it and created once under a key derived
from its content (:func:`k3artifacts.policy.signed.create_signed`), never replaced, and read
back through its signature as its model, or refused by name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from pydantic import BaseModel

from k3artifacts.policy.signed import Family, RecordTrust, read_signed, record_trust
from k3artifacts.stores.records import RecordStore

Record = TypeVar("Record", bound=BaseModel)


def read_records(store: RecordStore, prefix: str, family: Family[Record], *,
                 trust: RecordTrust | None = None) -> Iterator[tuple[str, Record]]:
    """Every record under ``prefix`` with its key, each verified against ``trust`` (default:
    the store's policy in force); one that does not verify is refused (UntrustedRecord)."""
    trust = trust or record_trust(store)
    for key in store.list_keys(prefix):
        record = read_signed(store, key, family, trust=trust)
        if record is not None:
            yield key, record
