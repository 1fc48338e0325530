"""Header and index checks on real files written by the safetensors library and by hand."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from k3artifacts.errors import Refusal
from k3artifacts.staging.safetensors_header import check_header, check_header_at, check_index


def write_raw(path: Path, header: dict, data: bytes, header_len: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data)
    return path


def check(path: Path):
    return check_header(path.name, path, path.stat().st_size)


def test_real_file_passes_and_is_summarised(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": np.zeros((4, 8), np.float32), "b": np.ones(3, np.uint8)}, path)
    info = check(path)
    assert info.tensor_names == {"a", "b"}
    assert info.summary.tensor_count == 2
    assert info.summary.dtypes == ["F32", "U8"]
    assert info.summary.data_bytes == 4 * 8 * 4 + 3


@pytest.mark.parametrize("expected", ["recorded", "stale", "unknown", "past the end"])
def test_a_header_read_by_ranges_reads_only_the_header(tmp_path, expected):
    """A store's object is read by ranges: one read of the length and the header where the
    recorded length still holds, else the length and then the header; never a byte of data,
    and a stale record changes nothing of the verdict."""
    path = tmp_path / "model.safetensors"
    save_file({"a": np.zeros((256, 256), np.float32)}, path)
    blob, size = path.read_bytes(), path.stat().st_size
    (length,) = struct.unpack("<Q", blob[:8])
    reads = []

    def read_at(offset: int, n: int) -> bytes:
        reads.append((offset, n))
        return blob[offset:offset + n]

    hint = {"recorded": length, "stale": length + 16, "unknown": None,
            "past the end": size}[expected]
    info = check_header_at(path.name, read_at, size, hint)
    assert info == check(path)
    assert reads == ([(0, 8 + length)] if expected == "recorded" else
                     [(0, 8 + length + 16), (8, length)] if expected == "stale" else
                     [(0, 8), (8, length)])
    assert sum(n for _, n in reads) < 3 * (8 + length) < size // 100


@pytest.mark.parametrize(
    "header,data,header_len,reason",
    [
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, 100 << 30,
         "exceeds"),
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, 4096,
         "runs past the end"),
        ({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
          "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}}, b"\0" * 12, None,
         "overlap"),
        ({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}, b"\0" * 4, None,
         "out of bounds"),
        ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 8, None,
         "truncated or padded"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None,
         "needs 12 bytes"),
        ({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}, b"\0", None,
         "unknown dtype"),
        ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}, b"\0" * 4, None,
         "gap"),
    ],
)
def test_malformed_headers_are_refused_with_reason(tmp_path, header, data, header_len, reason):
    path = write_raw(tmp_path / "bad.safetensors", header, data, header_len)
    with pytest.raises(Refusal) as err:
        check(path)
    assert err.value.path == "bad.safetensors"
    assert err.value.rule == "safetensors-header"
    assert reason in err.value.detail


def test_non_utf8_and_non_json_headers(tmp_path):
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{}")
    with pytest.raises(Refusal, match="not UTF-8"):
        check(bad)
    bad.write_bytes(struct.pack("<Q", 4) + b"nope")
    with pytest.raises(Refusal, match="not JSON"):
        check(bad)


def test_mxfp4_subbyte_dtype_sizes(tmp_path):
    header = {"w": {"dtype": "F4", "shape": [4, 32], "data_offsets": [0, 64]}}
    assert check(write_raw(tmp_path / "ok.safetensors", header, b"\0" * 64)).summary.dtypes == ["F4"]


def test_index_names_missing_shard_and_missing_tensor(tmp_path):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {
        "a": "model-1.safetensors", "b": "model-2.safetensors", "c": "model-1.safetensors"}}))
    refusals = check_index(
        "model.safetensors.index.json", index, {"model-1.safetensors"},
        {"model-1.safetensors": frozenset({"a"})},
    )
    details = [r.detail for r in refusals]
    assert any("missing shard 'model-2.safetensors'" in d for d in details)
    assert any("'c'" in d and "lacks it" in d for d in details)
    assert all(r.path == "model.safetensors.index.json" for r in refusals)


def test_a_header_nested_100k_deep_is_refused_before_json_parses_it(tmp_path):
    depth = 100_000
    header = (b'{"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"x":'
              + b"[" * depth + b"]" * depth + b"}")
    path = tmp_path / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(Refusal) as err:
        check(path)
    assert err.value.rule == "safetensors-header"
    assert "nests deeper than 8 levels" in err.value.detail


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path):
    path = write_raw(tmp_path / "m.safetensors",
                     {"__metadata__": {"note": "[[[[[[[[[[{{{{{{{{{{ \" ]]"},
                      "t": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4)
    assert check(path).summary.tensor_count == 1
