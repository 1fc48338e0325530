"""The record store: small records written once or moved by compare-and-swap.

What ``policy/``, ``releases/`` and the record-only gates need of a store, and all they may
use: tuples, reviews, approvals, history entries and every other create-once record
(:meth:`RecordStore.create`), the pointers that move (:meth:`RecordStore.replace` on a version
token), reads, listings, a record's age, and removal of the few records that live only while
an operation runs. Revisions (manifests, files, ranges) are the :mod:`.revisions` interface;
:class:`~k3artifacts.stores.base.Store`, what ``open_store`` returns, is both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime

from k3artifacts.errors import UntrustedRecord

#: The largest record a store hands back: a manifest of a hundred thousand files fits; a
#: planted record of hundreds of MB is refused before its bytes are read.
MAX_RECORD_BYTES = 64 << 20


def oversized(key: str, size: int) -> UntrustedRecord:
    return UntrustedRecord(key, "oversized", f"{size:,} bytes, over the {MAX_RECORD_BYTES:,} "
                           "of the largest record k3a reads; not read")


@dataclass(frozen=True)
class Versioned:
    data: bytes
    #: Opaque version of ``data``: pass it back to :meth:`RecordStore.replace` to
    #: compare-and-swap.
    token: str


class RecordStore(ABC):
    url: str

    @abstractmethod
    def exists(self) -> bool:
        """Whether the store is there at all (a directory, a bucket holding the prefix).

        Read commands refuse a store that is not: a mistyped path would otherwise look like
        an empty store. Raises :class:`~k3artifacts.errors.Unavailable` when it cannot tell
        (an S3 endpoint that does not answer)."""

    def refuse_unmakeable(self) -> None:
        """Raise a named refusal (:class:`~k3artifacts.errors.ConfigError`) when the store is
        not there and could not be made where its URL says, before a command that makes stores
        (stage, demo) fetches or makes anything. A store that cannot tell ahead checks nothing
        here."""
        # A bucket cannot: whether a prefix may be written is its policy's answer to the first
        # write, and a probe object would be a write.
        return None

    @abstractmethod
    def read(self, key: str) -> Versioned | None:
        """``key``'s bytes and version, None when absent; one over :data:`MAX_RECORD_BYTES`
        is :func:`oversized` (exit 4) before its bytes are read."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> None:
        """Write ``key`` only if absent; raise :class:`AlreadyExists` otherwise."""

    @abstractmethod
    def replace(self, key: str, data: bytes, expected: str | None) -> str:
        """Compare-and-swap: write ``key`` only if its token is ``expected`` (None: absent).

        Returns the new token; raises :class:`Conflict` when another writer got there first.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the small record ``key``; absent is not an error. Only for records that live
        while an operation runs (retention's pins and tombstones), never tuples or history."""

    @abstractmethod
    def modified_at(self, key: str) -> datetime | None:
        """When ``key`` was last written, or None when absent (one metadata request)."""

    @abstractmethod
    def list_keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix`` (a folder-like prefix ending in ``/``), sorted."""
