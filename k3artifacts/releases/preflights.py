"""Preflight records of a tuple: what ``k3a preflight`` found on a channel's infrastructure,
stored create-once under ``releases/preflight/<tuple-id>/<channel>/<sha256>.json``; the
``infrastructure`` gate reads the newest."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from k3artifacts.canonical import canonical_digest
from k3artifacts.errors import ConfigError
from k3artifacts.releases.channels import check_channel
from k3artifacts.releases.records import create_once, read_records
from k3artifacts.releases.tuples import TupleStore, check_tuple_id
from k3artifacts.stores.records import RecordStore

PREFLIGHT_PREFIX = "releases/preflight/"


class PreflightRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tuple_id: str
    channel: str
    report_sha256: str
    recorded_by: str
    recorded_at: datetime
    #: ``preflight.model.PreflightReport`` as JSON (that model lives above this layer).
    report: dict[str, Any]


def _prefix(tuple_id: str, channel: str) -> str:
    return f"{PREFLIGHT_PREFIX}{check_tuple_id(tuple_id)}/{check_channel(channel)}/"


def record_preflight(store: RecordStore, tuple_id: str, channel: str, report: dict[str, Any], *,
                     by: str, now: datetime | None = None) -> tuple[PreflightRecord, bool]:
    TupleStore(store).get(tuple_id)
    sha = canonical_digest(report)
    key = f"{_prefix(tuple_id, channel)}{sha}.json"
    record = PreflightRecord(tuple_id=tuple_id, channel=channel, report_sha256=sha,
                             recorded_by=by, recorded_at=now or datetime.now(UTC), report=report)
    return create_once(store, key, record)


def list_preflights(store: RecordStore, tuple_id: str, channel: str) -> list[PreflightRecord]:
    """Recorded preflights of ``tuple_id`` for ``channel``, oldest first."""
    records = []
    for key, record in read_records(store, _prefix(tuple_id, channel), PreflightRecord):
        sha = canonical_digest(record.report)
        if (sha != record.report_sha256 or record.tuple_id != tuple_id
                or record.channel != channel or not key.endswith(f"/{sha}.json")):
            raise ConfigError(f"{key} does not match its key; it was edited in the store")
        records.append(record)
    return sorted(records, key=lambda r: r.recorded_at)
