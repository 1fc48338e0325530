"""Small releases written with the real safetensors library, and a one-call stager."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from k3artifacts.net.policy import RetryPolicy
from k3artifacts.staging.engine import StageOptions, StageResult, stage
from k3artifacts.staging.hub import HubSource
from k3artifacts.stores.base import Store

REPO = "moonshotai/Kimi-K3"
LICENSE = b"Modified MIT License\n\nCopyright (c) 2026 Moonshot AI\n"
CARD = b"---\nlicense: other\nlicense_name: modified-mit\nlicense_link: LICENSE\n---\n# Kimi K3\n"
FAST_RETRY = RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05, read_timeout=5)


def small_release(tmp_path: Path, *, shard_bytes: int = 256 << 10, seed: int = 0,
                  shards: int = 2) -> dict[str, bytes | Path]:
    """Shards (two by default) with an index, config, license, card and one remote-code
    file."""
    rng = np.random.default_rng(seed)
    out = tmp_path / f"release-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    files: dict[str, bytes | Path] = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tensors = {
            f"layers.{i}.experts.w1": rng.integers(0, 255, shard_bytes, dtype=np.uint8),
            f"layers.{i}.norm": rng.random(64, dtype=np.float32),
        }
        save_file(tensors, out / name, metadata={"format": "pt"})
        weight_map.update({t: name for t in tensors})
        files[name] = out / name
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}).encode()
    files["config.json"] = b'{"model_type": "kimi_k3", "n_routed_experts": 896}'
    files["LICENSE"] = LICENSE
    files["README.md"] = CARD
    files["modeling_kimi_k3.py"] = b"# remote code\n"
    return files


def raw_safetensors(header: dict, data: bytes, header_len: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data


def run_stage(endpoint: str, store: Store, quarantine: Path, revision: str = "main",
              **options) -> StageResult:
    options.setdefault("retry", FAST_RETRY)
    source = HubSource(endpoint=endpoint, token=False, retry=options["retry"])
    return stage(source, store, REPO, revision, quarantine, StageOptions(**options))
