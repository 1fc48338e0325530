"""Canonical JSON: the one byte form of anything we hash or compare.

Sorted keys, no insignificant whitespace, UTF-8, no NaN. Two equal values always give the same
bytes, so a digest over these bytes identifies the value and not the way it was written.
"""

from __future__ import annotations

import hashlib
import json
import math
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


#: How deep a stored record's JSON may nest: every model k3a writes stays under a dozen.
MAX_DEPTH = 64


class NotCanonical(ValueError):
    """JSON that no canonical form holds (NaN, an infinity, a number that overflows to one,
    nesting past :data:`MAX_DEPTH`), named."""


def _no_constant(name: str) -> Any:
    raise NotCanonical(f"a non-finite number ({name})")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotCanonical(f"a number that is no finite float ({text[:40]})")
    return value


def _depth(value: Any) -> int:
    deepest, level = 0, [(value, 1)]
    while level:
        node, depth = level.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                break
            level.extend((child, depth + 1)
                         for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def parse_json(data: bytes | str, **hooks: Any) -> Any:
    """JSON as a stored record may hold it: finite numbers only, nesting at most
    :data:`MAX_DEPTH` deep; anything else a :class:`NotCanonical` naming it (a ValueError, as
    :func:`json.loads`'s own errors are)."""
    try:
        value = json.loads(data, parse_constant=_no_constant, parse_float=_finite, **hooks)
    except RecursionError:
        raise NotCanonical(f"nesting deeper than {MAX_DEPTH}") from None
    if _depth(value) > MAX_DEPTH:
        raise NotCanonical(f"nesting deeper than {MAX_DEPTH}")
    return value
