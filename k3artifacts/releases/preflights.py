"""Preflight records of a tuple: what ``k3a preflight`` found on a channel's infrastructure,
stored create-once under ``releases/preflight/<tuple-id>/<channel>/<sha256>.json`` as a signed
record of the identity that ran it (role ``preflight``, ``policy/signed.py``); the
``infrastructure`` gate reads the newest, only through its signature: one written by hand is
refused by name (UntrustedRecord, exit 4)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from k3artifacts.canonical import canonical_digest
from k3artifacts.errors import UntrustedRecord
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.signed import Family, RecordTrust
from k3artifacts.releases.channels import check_channel
from k3artifacts.releases.records import create_record, read_records
from k3artifacts.releases.tuples import TupleStore, check_tuple_id
from k3artifacts.stores.records import RecordStore

PREFLIGHT_PREFIX = "releases/preflight/"


class PreflightRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tuple_id: str
    channel: str
    report_sha256: str
    #: The identity whose key signed the record (the reader checks they agree).
    recorded_by: str
    recorded_at: datetime
    #: ``preflight.model.PreflightReport`` as JSON (that model lives above this layer).
    report: dict[str, Any]


PREFLIGHTS = Family(PREFLIGHT_PREFIX, "preflight", PreflightRecord, "recorded_by")


def _prefix(tuple_id: str, channel: str) -> str:
    return f"{PREFLIGHT_PREFIX}{check_tuple_id(tuple_id)}/{check_channel(channel)}/"


def record_preflight(store: RecordStore, tuple_id: str, channel: str, report: dict[str, Any], *,
                     by: Acting, now: datetime | None = None) -> tuple[PreflightRecord, bool]:
    """Store ``report`` beside its tuple, signed by ``by``; returns (record, written)."""
    TupleStore(store).get(tuple_id)
    sha = canonical_digest(report)
    key = f"{_prefix(tuple_id, channel)}{sha}.json"
    record = PreflightRecord(tuple_id=tuple_id, channel=channel, report_sha256=sha,
                             recorded_by=by.name, recorded_at=now or datetime.now(UTC),
                             report=report)
    return create_record(store, key, PREFLIGHTS, record, tuple_id=tuple_id, by=by)


def list_preflights(store: RecordStore, tuple_id: str, channel: str, *,
                    trust: RecordTrust | None = None) -> list[PreflightRecord]:
    """Recorded preflights of ``tuple_id`` for ``channel``, oldest first, each verified
    (``trust``: the store's policy in force unless given)."""
    records = []
    for key, record in read_records(store, _prefix(tuple_id, channel), PREFLIGHTS,
                                    tuple_id=tuple_id, trust=trust):
        sha = canonical_digest(record.report)
        if (sha != record.report_sha256 or record.tuple_id != tuple_id
                or record.channel != channel or not key.endswith(f"/{sha}.json")):
            raise UntrustedRecord(key, "wrong-key", f"a preflight of {record.tuple_id} on "
                                  f"{record.channel} with sha256 {sha[:12]}, not the one its "
                                  "key names")
        records.append(record)
    return sorted(records, key=lambda r: r.recorded_at)
