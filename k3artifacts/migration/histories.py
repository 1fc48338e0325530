"""A history written before records were signed, made a signed one, once: its entries, as
found, each inside a link naming the one before, signed together by the migrating root
identity into the history's base (:class:`k3artifacts.trust.chain.Base`, create-once), then the
pointer swapped to hold it. From then on :mod:`k3artifacts.trust.chain` reads it as it reads
any history, signed throughout: the base in place of the log's unsigned entries, which stay
where they are (no record written once is replaced: a bucket that refuses it is fine).

The pointer is swapped last, so a migration that dies part way leaves it unsigned: every reader
refuses the history as unsigned (naming ``k3a trust migrate``), and the next run finds the same
entries as found and finishes (the base it wrote, if any, is the one it writes again).
"""

from __future__ import annotations

from typing import Any

from k3artifacts import faultpoints
from k3artifacts.canonical import canonical_digest
from k3artifacts.errors import AlreadyExists, UntrustedRecord
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.chain import Base, ChainLayout, Link
from k3artifacts.trust.envelope import parse_record, sign_record
from k3artifacts.trust.keys import RecordSigner


def based(store: RecordStore, layout: ChainLayout, entries: list[dict[str, Any]],
          pointer_token: str | None, *, signer: RecordSigner, identity: str,
          store_id: str | None) -> None:
    """Entries 1..N of ``layout``'s history (each as found, with the migration's mark) signed
    into its base for the store ``store_id``, then the pointer (still at ``pointer_token``:
    Conflict if it moved) swapped to hold it."""
    assert layout.base_key is not None, f"{layout.name} has no place for a base"
    links: list[Link] = []
    for seq, plain in enumerate(entries, start=1):
        links.append(Link(seq=seq, previous=canonical_digest(links[-1]) if links else None,
                          entry=plain))
    base = Base(links=links)
    record = sign_record(key=layout.base_key, kind=layout.base_kind, body=base, signer=signer,
                         identity=identity, store_id=store_id)
    try:
        store.create(layout.base_key, record)
    except AlreadyExists:
        found = store.read(layout.base_key)
        if found is None or canonical_digest(
                parse_record(found.data, key=layout.base_key).body) != canonical_digest(base):
            raise UntrustedRecord(layout.base_key, "fork", f"{layout.name} already has another "
                                  "base than the entries found") from None
        record = found.data  # a run that died before swapping the pointer wrote it
    faultpoints.pause("migrate-resigned", layout.name)
    store.replace(layout.pointer_key, record, pointer_token)
