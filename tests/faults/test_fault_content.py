"""Hostile release content served by the local hub, staged by the real client.

Outcome: a refusal naming the file and the rule (exit 3 from the CLI), nothing published and,
for rules decided from the listing, not one byte downloaded. License text or remote code that
changed since the last reviewed revision stage fine but cannot be promoted until reviewed.
"""

from __future__ import annotations

import json
import unicodedata

import pytest

from k3artifacts.errors import GateFailed, ReleaseRefused
from k3artifacts.releases.channels import current, history
from k3artifacts.releases.reviewing import review_code, review_license
from tests.faults.faultkit import SHARD1, assert_nothing_published, stage_args
from tests.fixtures.moves import check_gates, promote, use_policy
from tests.fixtures.people import person
from tests.staging_helpers import LICENSE, REPO, raw_safetensors, run_stage, small_release
from tests.support.cli import run_process
from tests.support.releases import Releases

pytestmark = pytest.mark.faults

U8 = {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}


def refused(local_hub, file_store, tmp_path, extra: dict[str, bytes], drop: tuple[str, ...] = ()):
    files = small_release(tmp_path)
    for path in drop:
        del files[path]
    files.update(extra)
    local_hub.hub.add_commit(REPO, files)
    with pytest.raises(ReleaseRefused) as err:
        run_stage(local_hub.endpoint, file_store, tmp_path / "quarantine")
    assert_nothing_published(file_store)
    assert not list(file_store.root.rglob(".staging-*"))
    found: dict[str, list] = {}
    for r in err.value.refusals:
        found.setdefault(r.path, []).append(r)
    return found


def downloads(local_hub) -> list[str]:
    return [r.target for r in local_hub.hub.requests if "/resolve/" in r.url]


NFC = unicodedata.normalize("NFC", "tokenizer_café.json")
NFD = unicodedata.normalize("NFD", "tokenizer_café.json")


@pytest.mark.parametrize(
    "extra,path,rule,words",
    [
        ({"../escape.json": b"{}"}, "../escape.json", "unsafe-path", "'..'"),
        ({"nested/../../escape.json": b"{}"}, "nested/../../escape.json", "unsafe-path", "'..'"),
        ({"/etc/cron.d/k3a": b"* * * * * root sh"}, "/etc/cron.d/k3a", "unsafe-path", "absolute"),
        ({"C:/Windows/k3a.json": b"{}"}, "C:/Windows/k3a.json", "unsafe-path", "absolute"),
        ({"..\\escape.json": b"{}"}, "..\\escape.json", "unsafe-path", "backslash"),
        ({"bad\nname.json": b"{}"}, "bad\nname.json", "unsafe-path", "control character"),
        ({".k3a/manifest.json": b"{}"}, ".k3a/manifest.json", "unsafe-path", "reserved"),
        ({"CONFIG.json": b"{}"}, "config.json", "duplicate-path", "ignoring case"),
        ({NFC: b"{}", NFD: b"{}"}, None, "duplicate-path", "ignoring case"),
        ({"pytorch_model.bin": b"\x80\x02}q\x00."}, "pytorch_model.bin", "pickle", "--allow-pickle"),
        ({"optimizer.pt": b"PK\x03\x04"}, "optimizer.pt", "pickle", "run code"),
        ({"bad\x85name.json": b"{}"}, "bad\x85name.json", "unsafe-path", "C1"),
        ({"gnp.\u202ejson": b"{}"}, "gnp.\u202ejson", "unsafe-path", "bidirectional"),
        ({"x" * 256 + ".json": b"{}"}, "x" * 256 + ".json", "unsafe-path", "hold 255"),
        ({"/".join(["d" * 200] * 4) + "/f": b"{}"}, "/".join(["d" * 200] * 4) + "/f",
         "unsafe-path", "store key holds"),
        ({"config.json/extra.json": b"{}"}, "config.json", "file-and-directory",
         "config.json/extra.json"),
    ],
    ids=["dotdot", "nested-dotdot", "absolute", "drive-letter", "backslash", "newline",
         "reserved-meta", "case-duplicate", "unicode-duplicate", "pickle-bin", "pickle-pt",
         "c1-control", "bidi-override", "name-too-long", "path-too-long", "file-and-directory"],
)
def test_hostile_listing_is_refused_before_any_download(local_hub, file_store, tmp_path,
                                                        extra, path, rule, words):
    found = refused(local_hub, file_store, tmp_path, extra)
    if path is None:  # which of two colliding names is reported depends on listing order
        (path,) = [p for p in extra if p in found]
    assert [(r.rule, words in r.detail) for r in found[path]] == [(rule, True)]
    assert downloads(local_hub) == []


@pytest.mark.parametrize(
    "content,words",
    [
        (raw_safetensors({"a": U8}, b"\0" * 8, header_len=100 << 30), "exceeds the 100000000"),
        (raw_safetensors({"a": U8}, b"\0" * 8, header_len=10_000_000), "runs past the end"),
        (raw_safetensors({"a": U8, "b": {**U8, "data_offsets": [4, 12]}}, b"\0" * 12), "overlap"),
        (raw_safetensors({"a": {**U8, "data_offsets": [0, 4096]}}, b"\0" * 8), "out of bounds"),
        (raw_safetensors({"a": {**U8, "data_offsets": [-8, 0]}}, b"\0" * 8), "out of bounds"),
        (raw_safetensors({"a": {**U8, "shape": [1 << 40]}}, b"\0" * 8), "needs 1099511627776 bytes"),
        (raw_safetensors({"a": {**U8, "dtype": "PICKLE"}}, b"\0" * 8), "unknown dtype"),
        (raw_safetensors({"a": U8}, b"\0" * 8 + b"\0" * 100), "truncated or padded"),
        (b"\x10\0\0\0\0\0\0\0" + b"\xff\xfe{\"a\": 1}\xc3\x28\0\0\0\0" + b"\0" * 8, "not UTF-8"),
        (b"\x10\0\0\0\0\0\0\0" + b"{'a': [0, 8]}   " + b"\0" * 8, "not JSON"),
        (b"\x08\0\0\0\0\0\0\0" + b"[1,2,3] " + b"\0" * 8, "not a JSON object"),
        (b"\x00\x01\x02", "shorter than the 8-byte header length"),
    ],
    ids=["header-100GB", "header-past-eof", "overlap", "out-of-bounds", "negative-offset",
         "shape-too-big", "unknown-dtype", "padded-data", "non-utf8", "non-json",
         "not-an-object", "tiny-file"],
)
def test_hostile_safetensors_header_is_refused(local_hub, file_store, tmp_path, content, words):
    found = refused(local_hub, file_store, tmp_path, {"extra.safetensors": content})
    assert [(r.rule, words in r.detail) for r in found["extra.safetensors"]] == [
        ("safetensors-header", True)]


def test_index_pointing_at_missing_shard_or_tensor(local_hub, file_store, tmp_path):
    index = json.loads(small_release(tmp_path)["model.safetensors.index.json"])
    index["weight_map"]["layers.9.experts.w1"] = "model-00009-of-00009.safetensors"
    index["weight_map"]["layers.1.not_there"] = SHARD1
    found = refused(local_hub, file_store, tmp_path,
                    {"model.safetensors.index.json": json.dumps(index).encode()})
    details = sorted(r.detail for r in found["model.safetensors.index.json"])
    assert details == [
        f"maps 'layers.1.not_there' to '{SHARD1}', which lacks it",
        "maps 'layers.9.experts.w1' to missing shard 'model-00009-of-00009.safetensors'",
    ]


def test_several_refusals_reach_the_shell_named(local_hub, file_store, tmp_path, k3a_cmd, k3a_env):
    files = small_release(tmp_path)
    files["pytorch_model.bin"] = b"\x80\x02}q\x00."
    files["../../etc/cron.d/k3a"] = b"* * * * * root sh\n"
    local_hub.hub.add_commit(REPO, files)
    proc = run_process(*stage_args(local_hub.endpoint, file_store, tmp_path / "q"),
                       env=k3a_env, cmd=k3a_cmd, expect=None)
    assert proc.returncode == 3, proc.stderr
    assert "2 file(s) refused" in proc.stderr
    assert "../../etc/cron.d/k3a: [unsafe-path]" in proc.stderr
    assert "pytorch_model.bin: [pickle]" in proc.stderr
    assert "nothing was published" in proc.stderr
    assert_nothing_published(file_store)


def test_pickle_is_staged_only_when_explicitly_allowed(local_hub, file_store, tmp_path):
    files = small_release(tmp_path)
    files["pytorch_model.bin"] = b"\x80\x02}q\x00."
    commit = local_hub.hub.add_commit(REPO, files)
    result = run_stage(local_hub.endpoint, file_store, tmp_path / "q", allow_pickle=True)
    assert result.commit == commit
    assert file_store.read_manifest(REPO, commit).file("pytorch_model.bin") is not None


def test_changed_license_and_new_remote_code_stage_but_block_promotion(
        local_hub, file_store, tmp_path, policies):
    """Upstream changes its license and adds a *.py after a reviewed release: the revision
    stages (the bytes are what upstream published) but its tuple cannot reach a channel until
    both are reviewed; the channel and its history do not move."""
    reviewed = Releases(file_store, tmp_path / "scratch")
    files = small_release(tmp_path)
    local_hub.hub.add_commit(REPO, files)
    first = run_stage(local_hub.endpoint, file_store, tmp_path / "q")
    old = reviewed.tuple_for(file_store.read_manifest(REPO, first.commit))
    # The store's policy (and its root, which every signed record names) before the reviews.
    use_policy(file_store, policies)
    review_license(file_store, old.id, by=person("alice"))
    review_code(file_store, old.id, by=person("alice"))
    promote(file_store, old.id, "staging", actor="alice", policies_dir=policies)

    files["LICENSE"] = LICENSE + b"\nYou must display 'Kimi K3' prominently.\n"
    files["tokenization_kimi.py"] = b"import subprocess\n"
    local_hub.hub.add_commit(REPO, files)
    second = run_stage(local_hub.endpoint, file_store, tmp_path / "q")
    assert second.remote_code == ["modeling_kimi_k3.py", "tokenization_kimi.py"]
    new = reviewed.tuple_for(file_store.read_manifest(REPO, second.commit))

    failed = {r.name: r.reason for r in
              check_gates(file_store, new.id, "staging", policies_dir=policies).failed}
    assert set(failed) == {"license", "remote_code"}
    assert "has not been reviewed" in failed["license"]
    assert "tokenization_kimi.py" in failed["remote_code"]
    assert "modeling_kimi_k3.py" not in failed["remote_code"]  # unchanged, reviewed before
    with pytest.raises(GateFailed):
        promote(file_store, new.id, "staging", actor="alice", policies_dir=policies)
    assert current(file_store, "staging").tuple_id == old.id
    assert len(history(file_store, "staging")) == 1

    review_license(file_store, new.id, by=person("bob"))
    review_code(file_store, new.id, by=person("bob"))
    assert promote(file_store, new.id, "staging", actor="bob", policies_dir=policies).changed
