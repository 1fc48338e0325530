"""Canonical JSON: the one byte form of anything we hash or compare.

Sorted keys, no insignificant whitespace, UTF-8, no NaN. Two equal values always give the same
bytes, so a digest over these bytes identifies the value and not the way it was written.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel


def to_plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def canonical_json(value: Any) -> bytes:
    return json.dumps(
        to_plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def canonical_digest(value: Any) -> str:
    """sha256 hex of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
