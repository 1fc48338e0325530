"""A safetensors file's layout, read from the bytes the loader streamed (and hashed), never
from a second read: a header parsed from another read could place tensors by bytes nobody
hashed."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from k3artifacts.errors import VerifyMismatch

#: safetensors dtype names -> torch dtype attribute names.
DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16",
    "BF16": "bfloat16", "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}  # fmt: skip
#: Headers larger than this are refused before they are parsed (safetensors' own limit).
MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class TensorSpan:
    name: str
    dtype: str
    shape: tuple[int, ...]
    #: Byte range in the file (not in the data section).
    start: int
    end: int


def header_length(head: bytes, rel: str, size: int) -> int:
    """The 8-byte little-endian header length at the start of ``head``, checked against the
    file's size."""
    if len(head) < 8:
        raise _not_safetensors(rel, "shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", head[:8])
    if n > MAX_HEADER or 8 + n > size:
        raise _not_safetensors(rel, f"header length {n} does not fit its {size} bytes")
    return n


def parse_header(head: bytes, rel: str, size: int) -> list[TensorSpan]:
    """Tensors of the file whose first ``8 + header length`` bytes are ``head``, in file
    order, each inside the file."""
    n = header_length(head, rel, size)
    try:
        table = json.loads(head[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _not_safetensors(rel, f"header is not JSON ({exc})") from None
    if not isinstance(table, dict):
        raise _not_safetensors(rel, "header is not a JSON object")
    base = 8 + n
    spans = []
    for name, entry in table.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in entry["data_offsets"])
            span = TensorSpan(name, DTYPES[entry["dtype"]],
                              tuple(int(d) for d in entry["shape"]), base + begin, base + end)
        except (KeyError, TypeError, ValueError):
            raise _not_safetensors(rel, f"tensor {name!r} has no dtype, shape and "
                                   "offsets k3a can read") from None
        if not base <= span.start <= span.end <= size:
            raise _not_safetensors(rel, f"tensor {name!r} lies outside the file")
        spans.append(span)
    return sorted(spans, key=lambda s: s.start)


def _not_safetensors(rel: str, why: str) -> VerifyMismatch:
    return VerifyMismatch(f"{rel}: not a safetensors file k3a can load: {why}",
                          hint="restore the revision from a trusted store; nothing was served")
