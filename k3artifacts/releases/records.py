"""Evidence recorded beside a tuple (evaluation reports, traffic analyses, preflights, image
scans): each record is created once under a key derived from its content, never replaced, and
read back as its model or refused as malformed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import AlreadyExists, ConfigError
from k3artifacts.stores.records import RecordStore

Record = TypeVar("Record", bound=BaseModel)


def create_once(store: RecordStore, key: str, record: Record) -> tuple[Record, bool]:
    """Write ``record`` at ``key`` unless one is there already: returns (the record the store
    holds, whether this call wrote it). A lost race returns the winner's record."""
    try:
        store.create(key, canonical_json(record))
    except AlreadyExists:
        found = store.read(key)
        if found is None:
            raise
        return type(record).model_validate_json(found.data), False
    return record, True


def read_records(store: RecordStore, prefix: str,
                 model: type[Record]) -> Iterator[tuple[str, Record]]:
    """Every record under ``prefix`` with its key; a record that does not parse is refused."""
    for key in store.list_keys(prefix):
        found = store.read(key)
        if found is None:
            continue
        try:
            yield key, model.model_validate_json(found.data)
        except ValidationError as exc:
            raise ConfigError(f"{key} is malformed: {exc.errors()[0]['msg']}") from None
