"""The synthetic Kimi-K3-shaped release: valid safetensors, a true index, deterministic bytes."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors import safe_open
from safetensors.numpy import save

from k3artifacts.localhub.synthetic import (
    MODIFIED_MIT,
    Tensor,
    derive_revision,
    safetensors_header,
    write_release,
)


def _digests(files: dict[str, Path]) -> dict[str, str]:
    return {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in files.items()}


@pytest.fixture
def release(tmp_path: Path) -> dict[str, Path]:
    return write_release(tmp_path / "rel", total_bytes=2 << 20, shards=3, seed=7)


def test_layout_of_the_release(release):
    assert sorted(release) == [
        "LICENSE",
        "README.md",
        "config.json",
        "configuration_kimi_k3.py",
        "generation_config.json",
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
        "modeling_kimi_k3.py",
        "tokenizer_config.json",
    ]
    assert release["LICENSE"].read_text() == MODIFIED_MIT
    card = release["README.md"].read_text()
    front = yaml.safe_load(card.split("---")[1])
    assert front["license"] == "other"
    assert front["license_name"] == "modified-mit"
    assert front["license_link"] == "LICENSE"
    config = json.loads(release["config.json"].read_text())
    assert config["model_type"] == "kimi_k3"
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_kimi_k3.KimiK3ForCausalLM"
    assert config["quantization_config"]["quant_method"] == "mxfp4"


def test_shards_load_and_match_the_index(release):
    index = json.loads(release["model.safetensors.index.json"].read_text())
    seen: dict[str, str] = {}
    data_bytes = 0
    dtypes = set()
    for name, path in release.items():
        if not name.endswith(".safetensors"):
            continue
        raw = path.read_bytes()
        (hlen,) = struct.unpack("<Q", raw[:8])
        assert hlen % 8 == 0
        header = json.loads(raw[8 : 8 + hlen])
        assert header.pop("__metadata__") == {"format": "pt"}
        spans = sorted(tuple(v["data_offsets"]) for v in header.values())
        assert spans[0][0] == 0 and all(
            a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)
        )
        assert spans[-1][1] == len(raw) - 8 - hlen
        data_bytes += spans[-1][1]
        with safe_open(str(path), framework="numpy") as f:
            for key in f.keys():
                seen[key] = name
                sl = f.get_slice(key)
                assert sl.get_shape() == header[key]["shape"]
                dtypes.add(sl.get_dtype())
                if sl.get_dtype() == "U8":
                    arr = f.get_tensor(key)
                    assert arr.dtype == np.uint8 and list(arr.shape) == header[key]["shape"]
    assert seen == index["weight_map"]
    assert index["metadata"]["total_size"] == data_bytes
    assert dtypes == {"U8", "F8_E8M0", "BF16", "F32"}
    assert any(k.endswith(".mlp.experts.7.w2.weight_scale") for k in seen)


def test_total_bytes_is_roughly_honoured(tmp_path):
    files = write_release(tmp_path, total_bytes=24 << 20, shards=2, remote_code=False)
    total = json.loads(files["model.safetensors.index.json"].read_text())["metadata"]["total_size"]
    assert 0.9 * (24 << 20) <= total <= 1.02 * (24 << 20)
    assert "modeling_kimi_k3.py" not in files
    assert "auto_map" not in json.loads(files["config.json"].read_text())


def test_deterministic_per_seed_and_shards_differ(tmp_path, release):
    again = write_release(tmp_path / "again", total_bytes=2 << 20, shards=3, seed=7)
    other = write_release(tmp_path / "other", total_bytes=2 << 20, shards=3, seed=8)
    assert _digests(again) == _digests(release)
    d_other = _digests(other)
    assert (
        d_other["model-00001-of-00003.safetensors"]
        != _digests(release)["model-00001-of-00003.safetensors"]
    )
    shard_digests = {v for k, v in _digests(release).items() if k.endswith(".safetensors")}
    assert len(shard_digests) == 3


def test_custom_license_text(tmp_path):
    files = write_release(tmp_path, total_bytes=1 << 16, shards=1, license_text="Changed terms\n")
    assert files["LICENSE"].read_text() == "Changed terms\n"


def test_header_layout_is_the_safetensors_librarys(tmp_path):
    arrays = {
        "b.w": np.zeros((3, 5), np.uint8),
        "a.w": np.zeros((2,), np.float32),
        "z.bias": np.zeros((3,), np.float32),
    }
    lib = save(arrays, metadata={"format": "pt"})
    dtype = {"uint8": "U8", "float32": "F32"}
    mine, data_len = safetensors_header(
        [Tensor(k, dtype[str(v.dtype)], v.shape) for k, v in arrays.items()]
    )
    assert lib[: len(mine)] == mine
    assert len(lib) - len(mine) == data_len


def test_derive_revision_changes_one_small_file(tmp_path, release):
    rev2 = derive_revision(release, tmp_path / "rev2")
    changed = {k for k in release if rev2[k] != release[k]}
    assert changed == {"generation_config.json"}
    assert (
        json.loads(rev2["generation_config.json"].read_text())["k3a_synthetic_revision"]
        == "revision 2"
    )
    rev3 = derive_revision(rev2, tmp_path / "rev3", change="README.md", note="revision 3")
    assert rev3["README.md"].read_text().endswith("revision 3\n")
    assert rev3["generation_config.json"] == rev2["generation_config.json"]


def test_release_served_by_the_local_hub(local_hub, release, tmp_path):
    from huggingface_hub import snapshot_download

    commit = local_hub.hub.add_commit("moonshotai/Kimi-K3", release)
    info = local_hub.api().model_info("moonshotai/Kimi-K3", files_metadata=True)
    assert info.sha == commit
    lfs = {s.rfilename for s in info.siblings if s.lfs is not None}
    assert lfs == {k for k in release if k.endswith(".safetensors")}
    out = Path(
        snapshot_download(
            "moonshotai/Kimi-K3", endpoint=local_hub.endpoint, cache_dir=local_hub.cache_dir
        )
    )
    assert _digests({k: out / k for k in release}) == _digests(release)
