"""Upstream files built to hurt the parser: a model card of nested YAML aliases (a "billion
laughs") and a safetensors header nested 100k deep. ``k3a stage`` refuses each, named, with
exit 3, in bounded time and memory, and the same way on every re-run."""

from __future__ import annotations

import json
import struct
import subprocess

import pytest

from tests.staging_helpers import REPO, small_release

#: Each line nests nine of the previous: 9**8 (43 million) strings once expanded. Through
#: yaml.safe_load and str() the audit's 334-byte card of this shape became a 312 MB license field.
ALIAS_BOMB = (
    b"---\n"
    b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + b"".join(f"{n}: &{n} [{','.join(['*' + p] * 9)}]\n".encode()
               for p, n in zip("abcdefg", "bcdefgh", strict=True))
    + b"license: *h\n---\n# Kimi K3\n"
)


def stage(k3a_cmd, k3a_env, endpoint: str, store: str, quarantine) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*k3a_cmd, "stage", REPO, "--endpoint", endpoint, "--store", store, "--quarantine",
         str(quarantine), "-q"],
        env=k3a_env, capture_output=True, text=True, timeout=300)


def deep_header_shard(depth: int) -> bytes:
    header = b'{"__metadata__":{"format":"pt"},"t":{"dtype":"U8","shape":[4],' \
             b'"data_offsets":[0,4]},"x":' + b"[" * depth + b"]" * depth + b"}"
    return struct.pack("<Q", len(header)) + header + b"\0" * 4


def test_the_card_is_small_and_its_expansion_is_not():
    assert len(ALIAS_BOMB) < 400
    assert ALIAS_BOMB.count(b"*") == 7 * 9 + 1


@pytest.mark.timeout(120)
def test_an_alias_bomb_card_is_refused_named_exit_3(k3a_cmd, k3a_env, local_hub, tmp_path):
    files = small_release(tmp_path)
    files["README.md"] = ALIAS_BOMB
    local_hub.hub.add_commit(REPO, files)
    store = tmp_path / "store"
    proc = stage(k3a_cmd, k3a_env, local_hub.endpoint, f"file://{store}", tmp_path / "q")
    assert proc.returncode == 3, proc.stderr
    assert "README.md: [model-card] YAML anchor &a in the front matter" in proc.stderr
    assert "next:" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(store.rglob("manifest.json"))


@pytest.mark.timeout(120)
def test_a_deep_safetensors_header_is_refused_and_so_is_every_re_run(
        k3a_cmd, k3a_env, local_hub, tmp_path):
    files = small_release(tmp_path)
    files["extra.safetensors"] = deep_header_shard(100_000)
    local_hub.hub.add_commit(REPO, files)
    store, quarantine = tmp_path / "store", tmp_path / "q"
    for _ in range(2):
        proc = stage(k3a_cmd, k3a_env, local_hub.endpoint, f"file://{store}", quarantine)
        assert proc.returncode == 3, proc.stderr
        assert ("extra.safetensors: [safetensors-header] header nests deeper than 8 levels"
                in proc.stderr)
        assert "Traceback" not in proc.stderr
        # The refused bytes are not kept for a resume that would fail the same way.
        assert not list(quarantine.rglob("*.part"))
    assert not list(store.rglob("manifest.json"))
    # Downloaded whole each time, not resumed (a ranged request) from a kept part.
    fetched = [r for r in local_hub.hub.requests
               if r.target == "extra.safetensors" and r.is_file]
    assert len(fetched) == 2 and all(r.range in (None, "bytes=0-") for r in fetched)


def test_a_header_nested_as_deep_as_the_format_passes_the_bound(tmp_path):
    from k3artifacts.staging.safetensors_header import check_header

    header = json.dumps({"__metadata__": {"note": "[[[[[[[[[[[[[[[[[[[["},
                         "t": {"dtype": "U8", "shape": [2, 2], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "ok.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    assert check_header(path.name, path, path.stat().st_size).summary.tensor_count == 1


def test_a_header_of_escaped_quotes_is_checked_in_linear_time(tmp_path):
    """``{"`` then 200,000 ``\\"``: 400 KB that a backtracking string pattern rescanned from
    every quote (60 KB took 27 s of CPU; 400 KB did not end in 600 s)."""
    import time

    from k3artifacts.errors import Refusal
    from k3artifacts.staging.safetensors_header import check_header

    header = b'{"' + b'\\"' * 200_000
    path = tmp_path / "quotes.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    started = time.process_time()
    with pytest.raises(Refusal, match="brackets do not balance"):
        check_header(path.name, path, path.stat().st_size)
    assert time.process_time() - started < 0.5


def test_a_shape_beyond_any_float_is_refused_in_integers(tmp_path):
    from k3artifacts.errors import Refusal
    from k3artifacts.staging.safetensors_header import check_header

    header = json.dumps({"t": {"dtype": "F32", "shape": [10**200, 10**200],
                               "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(Refusal, match=r"needs 4000000000000\d* bytes, data_offsets span 4"):
        check_header(path.name, path, path.stat().st_size)


def test_a_large_license_stays_a_file_of_the_revision(local_hub, file_store, tmp_path):
    """A LICENSE of 8 MB (the audit's was 100 MB, copied into a 105 MB manifest)."""
    import hashlib

    from tests.staging_helpers import run_stage

    files = small_release(tmp_path)
    files["LICENSE"] = b"Terms.\n" * ((8 << 20) // 7)
    commit = local_hub.hub.add_commit(REPO, files)
    run_stage(local_hub.endpoint, file_store, tmp_path / "q")
    manifest_file = next(file_store.root.rglob(f"{commit}/.k3a/manifest.json"))
    assert manifest_file.stat().st_size < 16 << 10
    manifest = file_store.read_manifest(REPO, commit)
    assert manifest.license.text is None
    assert manifest.license.sha256 == hashlib.sha256(files["LICENSE"]).hexdigest()
    assert manifest.file("LICENSE").size == len(files["LICENSE"])
