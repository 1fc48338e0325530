"""One real (tiny, random) Llama model through the whole path a release takes: saved by
``transformers`` as safetensors with its config and a tokenizer, served by the local hub,
``k3a stage``d into a store, ``k3a pull``ed into a node cache, and loaded from there by
``AutoModelForCausalLM.from_pretrained``: its greedy output equals the original's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.staging_helpers import CARD, LICENSE
from tests.support.cli import run_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = "acme/tiny-llama"
WORDS = "the a model weights node cache release pull stage verify serve kimi moon shot".split()
PROMPT = "the model weights pull the release"


def tiny_tokenizer():
    """A word-level tokenizer built here (no hub access): specials, then WORDS."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(["<unk>", "<s>", "</s>", "<pad>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>")


def tiny_model(vocab_size: int):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config).eval()


def greedy(model, tokenizer) -> list[int]:
    inputs = tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False, num_beams=1,
                             eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    return out[0].tolist()


def k3a(k3a_cmd, env, *args: str) -> dict:
    return run_process(*args, "--json", env=env, cmd=k3a_cmd, timeout=300).json


@pytest.mark.slow
def test_a_real_model_staged_and_pulled_loads_and_generates_the_same(
        local_hub, k3a_cmd, k3a_env, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # from_pretrained of a directory, nothing else
    saved = tmp_path / "saved"
    tokenizer = tiny_tokenizer()
    model = tiny_model(len(tokenizer))
    model.save_pretrained(saved, safe_serialization=True)
    tokenizer.save_pretrained(saved)
    expected = greedy(model, tokenizer)
    assert len(expected) > len(tokenizer(PROMPT)["input_ids"])

    files: dict[str, bytes | Path] = {p.name: p for p in saved.iterdir() if p.is_file()}
    assert "model.safetensors" in files and "config.json" in files
    files["LICENSE"] = LICENSE
    files["README.md"] = CARD
    commit = local_hub.hub.add_commit(REPO, files)

    store = f"file://{tmp_path / 'store'}"
    staged = k3a(k3a_cmd, k3a_env, "stage", REPO, "--endpoint", local_hub.endpoint, "--store",
                 store, "--quarantine", str(tmp_path / "quarantine"), "-q")
    assert staged["commit"] == commit
    pulled = k3a(k3a_cmd, k3a_env, "pull", f"{REPO}@{commit}", "--store", store, "--to",
                 str(tmp_path / "cache"), "-q")
    path = Path(pulled["path"])
    assert path == tmp_path / "cache" / "models" / REPO / commit
    assert pulled["files"] == len(files) and pulled["bytes_fetched"] == pulled["bytes"]

    loaded = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    loaded_tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert loaded_tokenizer(PROMPT)["input_ids"] == tokenizer(PROMPT)["input_ids"]
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert greedy(loaded, loaded_tokenizer) == expected
