"""A synthetic release shaped like Kimi K3, small enough for tests and big enough for benchmarks.

The shards are valid safetensors files (the layout the ``safetensors`` library writes) holding an
MoE whose routed experts are MXFP4: packed 4-bit blocks as ``U8`` and one ``F8_E8M0`` scale per
32 values, with attention, norms, router and shared experts in ``BF16``. Beside them: the
sharded index, config, generation and tokenizer configs, a Modified-MIT LICENSE, a model card
with license front matter, and (optionally) the remote-code files ``--trust-remote-code`` runs.

Tensor bytes are pseudo-random, not a model: a block drawn once from ``seed`` and XOR-stamped per
chunk with (seed, shard, chunk), so every shard differs, the same arguments give the same bytes,
and writing runs at disk speed with flat memory whatever the shard size.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Routed experts per layer in the synthetic model (the real K3 has 896; see config.json).
ROUTED_EXPERTS = 8
LAYERS_PER_SHARD = 2
_BLOCK = 4 * 1024 * 1024
_ITEMSIZE = {"F32": 4, "BF16": 2, "U8": 1, "F8_E8M0": 1}

MODIFIED_MIT = """Modified MIT License

Copyright (c) 2026 Moonshot AI

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.

Our only modification part is that, if the Software (or any derivative works
thereof) is used for any of your commercial products or services that have
more than 100 million monthly active users, or more than 20 million US dollars
(or equivalent in other currencies) in monthly revenue, you shall prominently
display "Kimi K3" on the user interface of such product or service.
"""

_CONFIGURATION_PY = '''"""Kimi K3 configuration (synthetic release)."""

from transformers.configuration_utils import PretrainedConfig


class KimiK3Config(PretrainedConfig):
    model_type = "kimi_k3"

    def __init__(self, hidden_size=7168, num_hidden_layers=61, n_routed_experts=896,
                 num_experts_per_tok=8, moe_intermediate_size=2048, vocab_size=163840, **kwargs):
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.n_routed_experts = n_routed_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.moe_intermediate_size = moe_intermediate_size
        self.vocab_size = vocab_size
        super().__init__(**kwargs)
'''

_MODELING_PY = '''"""Kimi K3 model (synthetic release): the class names transformers looks up."""

from transformers.modeling_utils import PreTrainedModel

from .configuration_kimi_k3 import KimiK3Config


class KimiK3PreTrainedModel(PreTrainedModel):
    config_class = KimiK3Config
    base_model_prefix = "model"


class KimiK3ForCausalLM(KimiK3PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        raise NotImplementedError("synthetic release: weights are not a trained model")
'''


@dataclass(frozen=True)
class Dims:
    hidden: int
    vocab: int
    layers: int
    experts: int
    moe_intermediate: int
    shared_intermediate: int


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _ITEMSIZE[self.dtype]


def plan_dims(total_bytes: int, shards: int) -> Dims:
    """Model dimensions whose tensors add up to about ``total_bytes`` over ``shards`` shards
    (never below the smallest plausible model, so tiny targets overshoot)."""
    layers = LAYERS_PER_SHARD * shards
    per_layer = total_bytes / layers
    hidden = min(7168, max(32, int(math.sqrt(per_layer / 64)) // 32 * 32))
    vocab = min(163840, max(32, int(total_bytes * 0.05 / (4 * hidden)) // 32 * 32))
    e = ROUTED_EXPERTS
    fixed = (
        4 * vocab * hidden
        + 2 * hidden
        + layers * (8 * hidden * hidden + 4 * hidden + 2 * e * hidden + 4 * e)
    )
    # Per unit of moe_intermediate, per layer: E experts x 3 MXFP4 matrices (17/32 byte per
    # weight with scales) + a BF16 shared expert a quarter as wide.
    per_unit = hidden * (e * 3 * 17 / 32 + 6 / 4)
    inter = max(32, int((total_bytes - fixed) / (layers * per_unit)) // 32 * 32)
    return Dims(hidden, vocab, layers, e, inter, max(32, inter // 4 // 32 * 32))


def shard_tensors(dims: Dims, shard: int, shards: int) -> list[Tensor]:
    h, e, i, s = dims.hidden, dims.experts, dims.moe_intermediate, dims.shared_intermediate
    out: list[Tensor] = []
    if shard == 0:
        out.append(Tensor("model.embed_tokens.weight", "BF16", (dims.vocab, h)))
    for layer in range(shard * LAYERS_PER_SHARD, (shard + 1) * LAYERS_PER_SHARD):
        p = f"model.layers.{layer}"
        out += [
            Tensor(f"{p}.input_layernorm.weight", "BF16", (h,)),
            Tensor(f"{p}.post_attention_layernorm.weight", "BF16", (h,)),
            *(Tensor(f"{p}.self_attn.{m}_proj.weight", "BF16", (h, h)) for m in "qkvo"),
            Tensor(f"{p}.mlp.gate.weight", "BF16", (e, h)),
            Tensor(f"{p}.mlp.gate.e_score_correction_bias", "F32", (e,)),
            Tensor(f"{p}.mlp.shared_experts.gate_proj.weight", "BF16", (s, h)),
            Tensor(f"{p}.mlp.shared_experts.up_proj.weight", "BF16", (s, h)),
            Tensor(f"{p}.mlp.shared_experts.down_proj.weight", "BF16", (h, s)),
        ]
        for x in range(e):
            q = f"{p}.mlp.experts.{x}"
            for w, (rows, cols) in (("w1", (i, h)), ("w3", (i, h)), ("w2", (h, i))):
                out.append(Tensor(f"{q}.{w}.weight", "U8", (rows, cols // 2)))
                out.append(Tensor(f"{q}.{w}.weight_scale", "F8_E8M0", (rows, cols // 32)))
    if shard == shards - 1:
        out.append(Tensor("model.norm.weight", "BF16", (h,)))
        out.append(Tensor("lm_head.weight", "BF16", (dims.vocab, h)))
    return out


def safetensors_header(tensors: list[Tensor]) -> tuple[bytes, int]:
    """The 8-byte length, JSON header and padding the safetensors library writes, and the size
    of the data section. Data is laid out widest dtype first, then by name (as the library does),
    so every tensor is aligned to its item size."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in sorted(tensors, key=lambda t: (-_ITEMSIZE[t.dtype], t.name)):
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offset


def _write_data(f, nbytes: int, base: np.ndarray, seed: int, shard: int) -> None:
    buf = np.empty_like(base)
    chunk = 0
    while nbytes > 0:
        key = np.uint64(
            (
                seed * 0x9E3779B97F4A7C15
                + shard * 0xBF58476D1CE4E5B9
                + chunk * 0x94D049BB133111EB
                + 1
            )
            % 2**64
        )
        np.bitwise_xor(base, key, out=buf)
        n = min(nbytes, _BLOCK)
        f.write(memoryview(buf).cast("B")[:n])
        nbytes -= n
        chunk += 1


def shard_name(index: int, shards: int) -> str:
    return f"model-{index + 1:05d}-of-{shards:05d}.safetensors"


def write_release(
    out_dir: Path,
    *,
    total_bytes: int,
    shards: int,
    seed: int = 0,
    remote_code: bool = True,
    license_text: str | None = None,
) -> dict[str, Path]:
    """Write a Kimi-K3-shaped release under ``out_dir``; return repo path -> file on disk.

    ``total_bytes`` is the target for the tensor bytes of all shards together (the index's
    ``metadata.total_size``); the result is within a few percent above a few MB and never
    below the smallest plausible model. Same arguments, same bytes.

    >>> files = write_release(tmp, total_bytes=1 << 20, shards=2)   # doctest: +SKIP
    >>> sorted(files)[:2]
    ['LICENSE', 'README.md']
    """
    if shards < 1 or total_bytes < 1:
        raise ValueError("write_release needs shards >= 1 and total_bytes >= 1")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dims = plan_dims(total_bytes, shards)
    base = np.random.Generator(np.random.PCG64(seed)).integers(
        0, 2**64, _BLOCK // 8, dtype=np.uint64
    )
    files: dict[str, Path] = {}
    weight_map: dict[str, str] = {}
    total_size = 0
    for s in range(shards):
        name = shard_name(s, shards)
        tensors = shard_tensors(dims, s, shards)
        head, data_len = safetensors_header(tensors)
        path = out_dir / name
        with open(path, "wb", buffering=0) as f:
            f.write(head)
            _write_data(f, data_len, base, seed, s)
        files[name] = path
        weight_map.update({t.name: name for t in tensors})
        total_size += data_len

    def put(rel: str, text: str) -> None:
        p = out_dir / rel
        p.write_text(text, encoding="utf-8")
        files[rel] = p

    put(
        "model.safetensors.index.json",
        _json(
            {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
        ),
    )
    put("config.json", _json(_config(dims, seed, remote_code)))
    put(
        "generation_config.json",
        _json(
            {
                "bos_token_id": 163584,
                "eos_token_id": 163586,
                "do_sample": True,
                "temperature": 0.6,
                "top_p": 0.95,
                "max_length": 262144,
                "transformers_version": "4.57.1",
            }
        ),
    )
    put(
        "tokenizer_config.json",
        _json(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "[BOS]",
                "eos_token": "[EOS]",
                "pad_token": "[PAD]",
                "model_max_length": 262144,
                "clean_up_tokenization_spaces": False,
            }
        ),
    )
    put("LICENSE", MODIFIED_MIT if license_text is None else license_text)
    put("README.md", _readme(dims, shards, total_size, seed))
    if remote_code:
        put("configuration_kimi_k3.py", _CONFIGURATION_PY)
        put("modeling_kimi_k3.py", _MODELING_PY)
    return dict(sorted(files.items()))


def derive_revision(
    files: Mapping[str, Path],
    out_dir: Path,
    *,
    change: str = "generation_config.json",
    note: str = "revision 2",
) -> dict[str, Path]:
    """The file map of a next upstream revision that differs from ``files`` in ``change`` only
    (every other entry points at the same file, so a dedup-aware stager copies nothing else).
    JSON files get a ``k3a_synthetic_revision`` key set to ``note``; other files a line."""
    src = files[change]
    out = Path(out_dir) / change
    out.parent.mkdir(parents=True, exist_ok=True)
    if change.endswith(".json"):
        data = json.loads(src.read_text(encoding="utf-8"))
        data["k3a_synthetic_revision"] = note
        out.write_text(_json(data), encoding="utf-8")
    else:
        out.write_bytes(src.read_bytes() + f"\n{note}\n".encode())
    return {**files, change: out}


def _json(value: object) -> str:
    return json.dumps(value, indent=2) + "\n"


def _config(dims: Dims, seed: int, remote_code: bool) -> dict[str, object]:
    cfg: dict[str, object] = {
        "architectures": ["KimiK3ForCausalLM"],
        "model_type": "kimi_k3",
        "hidden_size": dims.hidden,
        "num_hidden_layers": dims.layers,
        "num_attention_heads": max(1, dims.hidden // 128),
        "num_key_value_heads": max(1, dims.hidden // 128),
        "vocab_size": dims.vocab,
        "n_routed_experts": dims.experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": dims.moe_intermediate,
        "intermediate_size": dims.shared_intermediate,
        "first_k_dense_replace": 0,
        "max_position_embeddings": 262144,
        "rope_theta": 50000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.embed_tokens",
                "lm_head",
                "self_attn",
                "mlp.gate",
                "shared_experts",
            ],
        },
        # Honest about what this is: the real release has 896 routed experts and 2.8T parameters.
        "k3a_synthetic": {"seed": seed, "upstream_n_routed_experts": 896},
    }
    if remote_code:
        cfg["auto_map"] = {
            "AutoConfig": "configuration_kimi_k3.KimiK3Config",
            "AutoModelForCausalLM": "modeling_kimi_k3.KimiK3ForCausalLM",
        }
    return cfg


def _readme(dims: Dims, shards: int, total_size: int, seed: int) -> str:
    return f"""---
license: other
license_name: modified-mit
license_link: LICENSE
library_name: transformers
pipeline_tag: text-generation
tags:
- synthetic
---
# Kimi-K3 (synthetic test release)

A synthetic checkpoint with the shape of Moonshot AI's Kimi K3 (MoE, MXFP4 routed experts):
{dims.layers} layers, {dims.experts} routed experts, hidden size {dims.hidden}, {shards} shards,
{total_size} tensor bytes, seed {seed}. The weights are pseudo-random bytes, not a model.
"""
