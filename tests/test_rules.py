from __future__ import annotations

import pytest

from k3artifacts.staging.rules import file_kind, listing_refusals


@pytest.mark.parametrize(
    "path",
    ["../x", "a/../../b", "/etc/passwd", "a//b", "./a", "a\\..\\b", "C:/x", ".k3a/manifest.json",
     "a/\x00b", ""],
)
def test_unsafe_paths_are_refused(path):
    (refusal,) = listing_refusals([(path, "file")])
    assert refusal.rule == "unsafe-path"
    assert refusal.path == path


def test_case_duplicates_pickles_and_non_files():
    refusals = listing_refusals(
        [("Model.safetensors", "file"), ("model.safetensors", "file"),
         ("pytorch_model.bin", "file"), ("link", "symlink")]
    )
    rules = {(r.path, r.rule) for r in refusals}
    assert rules == {("model.safetensors", "duplicate-path"), ("pytorch_model.bin", "pickle"),
                     ("link", "not-a-file")}


def test_pickle_allowed_explicitly():
    assert listing_refusals([("pytorch_model.bin", "file")], allow_pickle=True) == []


def test_kinds():
    assert file_kind("model-00001-of-00002.safetensors") == "weights"
    assert file_kind("model.safetensors.index.json") == "index"
    assert file_kind("LICENSE") == "license"
    assert file_kind("modeling_kimi_k3.py") == "code"
    assert file_kind("README.md") == "card"
    assert file_kind("config.json") == "config"
