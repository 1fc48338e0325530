"""Checks of the safetensors format that need no tensor data, and of the shard index.

A header is trusted by nothing downstream until it passes here: length within bounds, valid
UTF-8 JSON, every dtype known, every tensor's byte span equal to its shape times its dtype
size, spans contiguous from 0 and non-overlapping, and the data section ending exactly at the
end of the file. These are the rules the safetensors library enforces when loading; running
them at staging time means a bad shard is refused before it is published, not when a 1.5 TB
server start reaches it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from k3artifacts.errors import Refusal
from k3artifacts.revisions.manifest import SafetensorsSummary

#: The safetensors library refuses headers above 100 MB; so do we, before allocating anything.
MAX_HEADER = 100_000_000

#: A valid header nests 3 deep (header, tensor, shape); json.loads recurses once per level,
#: so nesting is bounded before it runs (a header of 100k brackets is a RecursionError).
MAX_DEPTH = 8

#: A JSON string, or what is left of an unterminated one: possessive, so no text is scanned
#: twice (a header of ``{"`` and 400 KB of ``\"`` made the plain pattern retry every quote).
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_INNERMOST = re.compile(rb"\[\]|\{\}")

#: A broken index can name every one of 100k tensors; the first few tell the story.
MAX_INDEX_REPORTS = 20

#: Bits per element. Sub-byte types (MXFP4 blocks as F4, F6) must fill whole bytes per tensor.
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


@dataclass(frozen=True)
class HeaderInfo:
    summary: SafetensorsSummary
    tensor_names: frozenset[str]


def _shown_shape(shape: list[int]) -> str:
    text = str(shape)
    return text if len(text) <= 80 else text[:77] + "...]"


def _refuse(path: str, detail: str) -> Refusal:
    return Refusal(path, "safetensors-header", detail)


def _depth_exceeds(raw: bytes, limit: int) -> bool:
    """True when the JSON text ``raw`` nests deeper than ``limit``: strings dropped, then the
    innermost bracket pairs peeled ``limit`` times (each pass a regex, not a Python loop per
    byte); anything left is deeper, or unbalanced."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = _INNERMOST.sub(b"", brackets)
    return bool(brackets)


def check_header(path: str, local: Path, file_size: int) -> HeaderInfo:
    """Parse and validate the header of the safetensors file at ``local``; raise a Refusal."""
    with open(local, "rb") as fh:
        return check_header_at(path, lambda offset, n: os.pread(fh.fileno(), n, offset),
                               file_size)


def check_header_at(path: str, read_at: Callable[[int, int], bytes], file_size: int,
                    expected_len: int | None = None) -> HeaderInfo:
    """:func:`check_header` of a file read by ranges (a store's object, a local file):
    ``read_at(offset, length)`` returns up to ``length`` bytes at ``offset``. Only the header
    is read, in one read where ``expected_len`` (the header length recorded when the file was
    first staged) still holds, else the 8-byte length and then the header: a multi-GB shard
    in a store costs a few KB."""
    if expected_len is not None and 0 <= expected_len <= min(MAX_HEADER, file_size - 8):
        data = read_at(0, 8 + expected_len)
        header_len = _header_length(path, data[:8], file_size)
        if header_len == expected_len:
            return _check_raw(path, data[8:], header_len, file_size)
    else:
        header_len = _header_length(path, read_at(0, 8), file_size)
    return _check_raw(path, read_at(8, header_len), header_len, file_size)


def _header_length(path: str, first: bytes, file_size: int) -> int:
    """The header length the file's first 8 bytes give, within bounds."""
    if file_size < 8:
        raise _refuse(path, f"file is {file_size} bytes, shorter than the 8-byte header length")
    if len(first) < 8:
        raise _refuse(path, "file ended inside the 8-byte header length")
    (header_len,) = struct.unpack("<Q", first)
    if header_len > MAX_HEADER:
        raise _refuse(path, f"header length {header_len} exceeds the {MAX_HEADER} limit")
    if header_len > file_size - 8:
        raise _refuse(
            path, f"header length {header_len} runs past the end of a {file_size}-byte file"
        )
    return int(header_len)


def _check_raw(path: str, raw: bytes, header_len: int, file_size: int) -> HeaderInfo:
    """Validate the header bytes ``raw`` (``header_len`` of them after the length)."""
    if len(raw) != header_len:
        raise _refuse(path, "file ended inside the header")
    if _depth_exceeds(raw, MAX_DEPTH):
        raise _refuse(path, f"header nests deeper than {MAX_DEPTH} levels (or its brackets do "
                      "not balance); a safetensors header nests 3")
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _refuse(path, f"header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise _refuse(path, f"header is not JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(header, dict):
        raise _refuse(path, "header is not a JSON object")

    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise _refuse(path, "__metadata__ must map strings to strings")

    data_len = file_size - 8 - header_len
    spans: list[tuple[int, int, str]] = []
    dtypes: set[str] = set()
    for name, info in header.items():
        if not isinstance(info, dict):
            raise _refuse(path, f"tensor {name!r}: entry is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_BITS:
            raise _refuse(path, f"tensor {name!r}: unknown dtype {dtype!r}")
        if not (
            isinstance(shape, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise _refuse(path, f"tensor {name!r}: shape {shape!r} is not a list of sizes")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise _refuse(path, f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end]")
        begin, end = offsets
        if not 0 <= begin <= end <= data_len:
            raise _refuse(
                path,
                f"tensor {name!r}: data_offsets [{begin}, {end}] out of bounds of the "
                f"{data_len}-byte data section",
            )
        bits = math.prod(shape) * DTYPE_BITS[dtype]
        if bits % 8 or bits // 8 != end - begin:
            # Integer arithmetic only: a shape's product can be far beyond any float.
            needs = f"{bits // 8}" + (f" and {bits % 8}/8" if bits % 8 else "")
            raise _refuse(
                path,
                f"tensor {name!r}: {dtype}{_shown_shape(shape)} needs {needs[:60]} bytes, "
                f"data_offsets span {end - begin}",
            )
        spans.append((begin, end, name))
        dtypes.add(dtype)

    position = 0
    for begin, end, name in sorted(spans):
        if begin < position:
            raise _refuse(path, f"tensor {name!r}: data_offsets overlap the previous tensor")
        if begin > position:
            raise _refuse(path, f"tensor {name!r}: gap of {begin - position} bytes before it")
        position = end
    if position != data_len:
        raise _refuse(
            path,
            f"tensors cover {position} bytes but the data section is {data_len} bytes "
            "(file truncated or padded)",
        )
    summary = SafetensorsSummary(
        header_len=header_len,
        tensor_count=len(spans),
        dtypes=sorted(dtypes),
        header_sha256=hashlib.sha256(raw).hexdigest(),
        data_bytes=data_len,
    )
    return HeaderInfo(summary, frozenset(name for _, _, name in spans))


def check_index(
    index_path: str, local: Path, present: set[str], tensors_by_file: dict[str, frozenset[str]]
) -> list[Refusal]:
    """Check ``*.safetensors.index.json``: every mapped shard present and holding the tensor."""
    base = index_path.rsplit("/", 1)[0] + "/" if "/" in index_path else ""
    try:
        index = json.loads(local.read_bytes().decode("utf-8"))
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        return [Refusal(index_path, "index", f"not a valid index: {exc}")]
    refusals = []
    missing_shards: set[str] = set()
    for tensor, shard in sorted(weight_map.items()):
        shard_path = base + shard if isinstance(shard, str) else None
        if shard_path is None or shard_path not in present:
            if shard not in missing_shards:
                missing_shards.add(shard)
                refusals.append(
                    Refusal(index_path, "index", f"maps {tensor!r} to missing shard {shard!r}")
                )
            continue
        held = tensors_by_file.get(shard_path)
        if held is not None and tensor not in held and len(refusals) < MAX_INDEX_REPORTS:
            refusals.append(
                Refusal(index_path, "index", f"maps {tensor!r} to {shard!r}, which lacks it")
            )
    return refusals
