"""Evaluation reports attached to a tuple, for the evaluation gate.

A report is JSON with at least ``suite`` (name of the evaluation), ``passed`` and ``total``
(counts of cases); any other fields are kept as they are. It is stored create-once under
``releases/evaluations/<tuple-id>/<sha256 of the canonical report>.json``, so attaching the same
report twice is a no-op and an attached report can never be edited, only superseded by a newer
one. The gate judges the most recently attached report of the suite the policy names.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from k3artifacts.canonical import canonical_digest, canonical_json
from k3artifacts.errors import AlreadyExists, ConfigError, plain_validation_errors
from k3artifacts.releases.tuples import TupleStore, check_tuple_id
from k3artifacts.stores.base import Store

EVALUATIONS_PREFIX = "releases/evaluations/"


class EvaluationReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    suite: str = Field(min_length=1)
    passed: int = Field(ge=0)
    total: int = Field(gt=0)

    @model_validator(mode="after")
    def _counts(self) -> EvaluationReport:
        if self.passed > self.total:
            raise ValueError(f"passed ({self.passed}) is more than total ({self.total})")
        return self

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total


class EvaluationRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tuple_id: str
    report_sha256: str
    attached_by: str
    attached_at: datetime
    report: dict[str, Any]

    def parsed(self) -> EvaluationReport:
        return EvaluationReport.model_validate(self.report)


def evaluations_prefix(tuple_id: str) -> str:
    return f"{EVALUATIONS_PREFIX}{check_tuple_id(tuple_id)}/"


def parse_report(data: bytes, source: str) -> dict[str, Any]:
    hint = ('a report is a JSON object with "suite" (text), "passed" and "total" (whole '
            'numbers, passed <= total), plus any other fields')
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ConfigError(f"evaluation report {source} is not JSON: {exc}", hint=hint) from None
    try:
        EvaluationReport.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(
            f"evaluation report {source} is not valid: {plain_validation_errors(exc)}", hint=hint
        ) from None
    return raw


def attach_evaluation(
    store: Store,
    tuple_id: str,
    report: dict[str, Any],
    *,
    by: str,
    now: datetime | None = None,
) -> tuple[EvaluationRecord, bool]:
    """Attach ``report`` to a tuple; returns (record, written). Same report again: not written."""
    TupleStore(store).get(tuple_id)  # the tuple must exist and be intact
    EvaluationReport.model_validate(report)
    sha = canonical_digest(report)
    key = f"{evaluations_prefix(tuple_id)}{sha}.json"
    record = EvaluationRecord(
        tuple_id=tuple_id,
        report_sha256=sha,
        attached_by=by,
        attached_at=now or datetime.now(UTC),
        report=report,
    )
    try:
        store.create(key, canonical_json(record))
    except AlreadyExists:
        found = store.read(key)
        if found is None:
            raise
        return EvaluationRecord.model_validate_json(found.data), False
    return record, True


def list_evaluations(store: Store, tuple_id: str) -> list[EvaluationRecord]:
    """Reports attached to ``tuple_id``, oldest first."""
    records = []
    for key in store.list_keys(evaluations_prefix(tuple_id)):
        found = store.read(key)
        if found is None:
            continue
        try:
            record = EvaluationRecord.model_validate_json(found.data)
        except ValidationError as exc:
            raise ConfigError(f"{key} is malformed: {exc.errors()[0]['msg']}") from None
        sha = canonical_digest(record.report)
        if (
            record.tuple_id != tuple_id
            or sha != record.report_sha256
            or not key.endswith(f"/{sha}.json")
        ):
            raise ConfigError(f"{key} does not match its key; it was edited in the store")
        records.append(record)
    return sorted(records, key=lambda r: r.attached_at)
