"""Evidence recorded beside a tuple (evaluation reports, traffic analyses, preflights, image
scans, reviews): each record is signed by the identity that made it and created once under a
key derived from its content (:func:`k3artifacts.policy.signed.create_signed`), never replaced,
logged in its tuple's record log (:mod:`.record_log`), and read back through its signature as
its model, or refused by name; one the log names that is gone is named missing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from pydantic import BaseModel

from k3artifacts.policy.actor import Acting
from k3artifacts.policy.signed import (
    Family,
    RecordTrust,
    create_signed,
    made_by,
    read_signed,
    record_trust,
)
from k3artifacts.releases.record_log import check_present, log_record
from k3artifacts.stores.records import RecordStore

Record = TypeVar("Record", bound=BaseModel)


def create_record(store: RecordStore, key: str, family: Family[Record], record: Record, *,
                  tuple_id: str, by: Acting) -> tuple[Record, bool]:
    """``record`` created at ``key`` (:func:`~k3artifacts.policy.signed.create_signed`), then
    logged in ``tuple_id``'s record log, also when it was there already (its maker may have
    died before logging it): (the record the store holds, whether this call wrote it)."""
    standing, written = create_signed(store, key, family, record, by=by)
    log_record(store, tuple_id, key=key, kind=family.kind, signed_by=made_by(standing, family),
               by=by)
    return standing, written


def read_records(store: RecordStore, prefix: str, family: Family[Record], *, tuple_id: str,
                 trust: RecordTrust | None = None) -> Iterator[tuple[str, Record]]:
    """Every record of ``tuple_id`` under ``prefix`` with its key, each verified against
    ``trust`` (default: the store's policy in force); one that does not verify is refused
    (UntrustedRecord), and one the tuple's log names that is gone is named (RecordMissing),
    before any is yielded."""
    trust = trust or record_trust(store)
    keys = store.list_keys(prefix)
    check_present(store, tuple_id, prefix, set(keys), trust=trust)
    for key in keys:
        record = read_signed(store, key, family, trust=trust)
        if record is not None:
            yield key, record
