"""Warm-start artifacts: capture, pull and use on the file store and SeaweedFS with cache-like
trees; every reason not to use one is a named miss; retention follows the tuple's weights;
the rendered pods and capture Job are valid Kubernetes objects."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.errors import UnsafeCacheEntry
from k3artifacts.policy.model import load_gate_policy
from k3artifacts.policy.record import packaged_document
from k3artifacts.policy.signed import record_trust
from k3artifacts.releases.retention import plan, retire
from k3artifacts.signing.keys import ReleaseSigner
from k3artifacts.stores.file import FileStore
from k3artifacts.trust.keys import FileSigner
from k3artifacts.warm import prewarm
from k3artifacts.warm.capture import capture, parse_roots
from k3artifacts.warm.claim import AlreadyCaptured
from k3artifacts.warm.model import (
    BLOB_PREFIX,
    WarmManifest,
    artifact_key,
    blob_key,
    signature_key,
)
from k3artifacts.warm.node import drop_warm, list_warm
from k3artifacts.warm.retention import retire_warm, sweep_blobs
from k3artifacts.warm.trust import WarmTrust
from tests.fixtures.moves import seed_people
from tests.fixtures.people import person
from tests.fixtures.releases import REPO_ROOT
from tests.support.releases import Releases

GPU = "NVIDIA H200"


def OPEN(store) -> WarmTrust:  # noqa: N802 - reads as the constant it was
    """A channel rule that asks for no release signature: the capturer's record alone, read
    through the store's policy (which names the test's people, "test" among them)."""
    return WarmTrust(records=record_trust(store))


def manifest_of(store, key: str) -> WarmManifest:
    """The manifest a stored record carries (its body; the envelope signs it)."""
    return WarmManifest.model_validate(json.loads(store.read(key).data)["body"])


def cache_tree(base: Path, small: int, large: int = 0, seed: int = 1) -> dict[str, Path]:
    """Triton- and inductor-like trees: many small files in hashed directories, a few large
    ones, and some duplicated content (the same kernel under two keys)."""
    rng = random.Random(seed)
    triton, inductor = base / "triton", base / "inductor"
    for i in range(small):
        root = triton if i % 2 else inductor
        d = root / f"{rng.getrandbits(32):08x}"[:2] / f"k{i:05d}"
        d.mkdir(parents=True, exist_ok=True)
        body = rng.randbytes(rng.randint(1024, 4096))
        (d / ("kernel.cubin" if i % 2 else "output_code.py")).write_bytes(body)
        if i % 100 == 0:
            (d / "copy.cubin").write_bytes(body)
    for i in range(large):
        (triton / f"big{i}.cubin").write_bytes(rng.randbytes(4 << 20))
    return {"triton": triton, "inductor": inductor}


def _capture(store, release, dirs, *, gpu=GPU, signer=None):
    return capture(store, release, gpu=gpu, tensor_parallel=8, pipeline_parallel=1,
                   roots=parse_roots([f"{n}={p}" for n, p in dirs.items()]),
                   by=person("test"), signer=signer)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(params=["file", pytest.param("seaweed", marks=pytest.mark.s3)])
def any_store(request, tmp_path):
    store = request.getfixturevalue("seaweed_store") if request.param == "seaweed" \
        else FileStore(tmp_path / "store")
    seed_people(store, packaged_document())
    return store


@pytest.mark.slow
def test_capture_pull_use_on_every_store(any_store, tmp_path):
    store = any_store
    release = Releases(store, tmp_path / "scratch").release()
    dirs = cache_tree(tmp_path / "caches", small=2000, large=2)
    result = _capture(store, release, dirs)
    manifest = manifest_of(store, result.key)
    on_disk = {f"{n}/{k}": v for n, p in dirs.items() for k, v in _files(p).items()}
    assert result.files == len(on_disk) == len(manifest.files)
    # Each distinct content stored once, under its sha256.
    assert len(store.list_keys(BLOB_PREFIX)) == len({f.sha256 for f in manifest.files}) \
        < len(manifest.files)
    assert manifest.tuple_id == release.id and manifest.gpu == GPU and manifest.layout == "tp8"
    with pytest.raises(AlreadyCaptured):  # created once, never overwritten
        _capture(store, release, dirs)

    root = tmp_path / "node"
    pulled = prewarm.fetch(store, release, root, gpu=GPU, trust=OPEN(store))
    assert pulled.ok, pulled.line()
    again = prewarm.fetch(store, release, root, gpu=GPU, trust=OPEN(store))
    assert again.ok and again.already_present
    into = tmp_path / "work"
    used = prewarm.prepare(store, release, root, into, gpu=GPU, trust=OPEN(store), pull=False)
    assert used.ok, used.line()
    for name, path in dirs.items():
        assert _files(into / name) == _files(path)
    assert used.env["TRITON_CACHE_DIR"] == str(into / "triton")
    assert used.env["TORCHINDUCTOR_CACHE_DIR"] == str(into / "inductor")
    # The server may add to its copies; the node cache's own files stay read-only.
    assert os.access(into / "triton", os.W_OK)
    (cached,) = list_warm(root)
    assert cached.tuple_id == release.id and cached.files == result.files


def a_release_and_its_caches(tmp_path: Path, *, small: int):
    """(store, releases, a tuple, the server's cache directories holding ``small`` small
    files) on a file store seeded with the packaged policy."""
    store = FileStore(tmp_path / "store")
    seed_people(store, packaged_document())
    releases = Releases(store, tmp_path / "scratch")
    release = releases.release()
    return store, releases, release, cache_tree(tmp_path / "caches", small=small)


@pytest.fixture
def captured(tmp_path):
    return a_release_and_its_caches(tmp_path, small=40)


def test_foreign_gpu_other_layout_and_absent_are_named_misses(captured, tmp_path):
    store, releases, release, dirs = captured
    assert prewarm.fetch(store, release, tmp_path / "n", gpu=GPU, trust=OPEN(store)).reason == "absent"
    _capture(store, release, dirs)
    miss = prewarm.fetch(store, release, tmp_path / "n", gpu="NVIDIA B200", trust=OPEN(store))
    assert (miss.ok, miss.reason) == (False, "foreign-gpu")
    miss = prewarm.fetch(store, release, tmp_path / "n", gpu=GPU, trust=OPEN(store), tp=4)
    assert miss.reason == "other-layout"
    assert prewarm.fetch(store, release, tmp_path / "n", gpu=None, trust=OPEN(store)).reason == "no-gpu"
    assert list_warm(tmp_path / "n") == []


def test_an_artifact_of_another_tuple_or_by_nobody_the_policy_trusts_is_a_miss(captured,
                                                                               tmp_path):
    store, releases, release, dirs = captured
    other = releases.release()
    result = _capture(store, release, dirs)
    key = artifact_key(other.id, GPU, "tp8")

    def planted(data: bytes):
        store.delete(key)  # a colleague with write access to the store
        store.create(key, data)
        return prewarm.fetch(store, other, tmp_path / "n", gpu=GPU, trust=OPEN(store))

    # Tuple A's artifact copied under tuple B's key: signed for A's key.
    miss = planted(store.read(result.key).data)
    assert miss.reason == "untrusted" and "refused (wrong-key)" in miss.detail
    # Its manifest edited in place (a file dropped from it): not the body its capturer signed.
    raw = json.loads(store.read(result.key).data)
    edited = dict(raw, body=dict(raw["body"], files=raw["body"]["files"][1:]))
    store.delete(result.key)
    store.create(result.key, json.dumps(edited).encode())
    miss = prewarm.fetch(store, release, tmp_path / "n", gpu=GPU, trust=OPEN(store))
    assert miss.reason == "untrusted" and "refused (tampered)" in miss.detail
    raw["body"]["tuple_id"] = other.id
    # Written by hand, as manifests were before they were signed records.
    miss = planted(json.dumps(raw["body"]).encode())
    assert miss.reason == "untrusted" and "refused (unsigned)" in miss.detail
    # Signed by someone the policy does not let capture warm starts.
    from k3artifacts.policy.signed import store_id
    from k3artifacts.trust.envelope import sign_record
    from tests.fixtures.people import signer_of

    forged = sign_record(key=key, kind="warm-manifest", body=raw["body"],
                         signer=signer_of("mallory"), identity="mallory",
                         store_id=store_id(store))
    miss = planted(forged)
    assert miss.reason == "untrusted" and "refused (untrusted-key)" in miss.detail
    # A capturer's record whose body names another tuple's image: another tuple's capture.
    signed = person("test").sign(key=key, kind="warm-manifest", body=raw["body"] | {
        "image_digest": "sha256:" + "0" * 64}, store_id=store_id(store))
    assert planted(signed).reason == "other-tuple"
    # Bytes that are no record at all.
    assert planted(b"\xff not json").reason == "malformed"
    assert list_warm(tmp_path / "n") == []


def test_unsigned_and_untrusted_signatures_are_misses_where_signatures_are_required(
        captured, tmp_path):
    store, releases, release, dirs = captured
    trusted_key = ec.generate_private_key(ec.SECP256R1())
    other_key = ec.generate_private_key(ec.SECP256R1())
    strict = WarmTrust(records=record_trust(store), require_signature=True,
                       trusted={"release": trusted_key.public_key()}, channel="production")
    result = _capture(store, release, dirs)
    assert prewarm.fetch(store, release, tmp_path / "a", gpu=GPU, trust=strict).reason == \
        "unsigned"
    # Signed afterwards by a key the channel does not trust.
    signed = releases.release()
    _capture(store, signed, dirs, signer=ReleaseSigner(FileSigner(other_key, "other")))
    assert prewarm.fetch(store, signed, tmp_path / "b", gpu=GPU, trust=strict).reason == \
        "bad-signature"
    good = releases.release()
    ok = _capture(store, good, dirs, signer=ReleaseSigner(FileSigner(trusted_key, "release")))
    outcome = prewarm.fetch(store, good, tmp_path / "c", gpu=GPU, trust=strict)
    assert outcome.ok, outcome.line()
    assert store.read(signature_key(ok.key)) is not None
    assert result.key != ok.key


def test_a_corrupted_blob_is_a_miss_at_pull_and_nothing_is_kept(captured, tmp_path):
    store, releases, release, dirs = captured
    result = _capture(store, release, dirs)
    manifest = manifest_of(store, result.key)
    blob = store.local_path(blob_key(manifest.files[3].sha256))
    blob.chmod(0o644)
    blob.write_bytes(b"#!/bin/sh\necho owned\n")
    miss = prewarm.fetch(store, release, tmp_path / "n", gpu=GPU, trust=OPEN(store))
    assert miss.reason == "corrupt"
    assert list_warm(tmp_path / "n") == []
    into = tmp_path / "work"
    used = prewarm.prepare(store, release, tmp_path / "n", into, gpu=GPU, trust=OPEN(store))
    assert used.reason == "corrupt"
    assert [p for p in into.rglob("*") if p.is_file()] == []  # cold, nothing of it used


def test_a_file_changed_on_the_node_after_the_pull_is_a_miss_at_use(captured, tmp_path):
    store, releases, release, dirs = captured
    _capture(store, release, dirs)
    root, into = tmp_path / "n", tmp_path / "work"
    assert prewarm.fetch(store, release, root, gpu=GPU, trust=OPEN(store)).ok
    (cached,) = list_warm(root)
    victim = next(p for p in Path(cached.path).rglob("*.py"))
    victim.parent.chmod(0o755)
    victim.chmod(0o644)
    victim.write_bytes(b"import os; os.system('id')\n")
    (into / "triton").mkdir(parents=True)
    (into / "triton" / "left-over").write_bytes(b"from an earlier server")
    used = prewarm.prepare(store, release, root, into, gpu=GPU, trust=OPEN(store), pull=False)
    assert (used.ok, used.reason) == (False, "corrupt")
    assert [p for p in into.rglob("*") if p.is_file()] == []
    assert sorted(p.name for p in into.iterdir()) == sorted(
        ["vllm", "triton", "inductor", "flashinfer", "deepgemm"])


@pytest.mark.parametrize("plant", ["symlink", "fifo", "escape"])
def test_capture_refuses_links_and_special_files(captured, tmp_path, plant):
    store, releases, release, dirs = captured
    where = next(dirs["triton"].iterdir())
    if plant == "symlink":
        (where / "evil.cubin").symlink_to("/etc/passwd")
    elif plant == "fifo":
        os.mkfifo(where / "evil.cubin")
    else:
        (where / "up").symlink_to("../../..", target_is_directory=True)
    with pytest.raises(UnsafeCacheEntry):
        _capture(store, release, dirs)
    assert store.list_keys("warm/artifacts/") == []


def test_retention_keeps_a_warm_artifact_exactly_as_long_as_its_tuple(captured, tmp_path):
    store, releases, release, dirs = captured
    kept = releases.release()
    shared = _capture(store, release, dirs)
    own = cache_tree(tmp_path / "own", small=10, seed=7)
    _capture(store, kept, {**dirs, **{"vllm": own["triton"]}})
    policy = load_gate_policy(REPO_ROOT / "policies")
    verdicts = plan(store, policy, keep=1, keep_days=0,
                    now=datetime.now(UTC) + timedelta(days=1))
    doomed = next(v for v in verdicts if v.commit == release.binding.weights.commit)
    survivor = next(v for v in verdicts if v.commit == kept.binding.weights.commit)
    assert (doomed.action, survivor.action) == ("retire", "keep")
    assert retire(store, doomed, policy, who="test", also=retire_warm).action == "retired"
    assert store.read(shared.key) is None
    assert store.list_keys(f"warm/artifacts/{kept.id}/")
    # Blobs only the retired artifact named go once the capture grace has passed; blobs the
    # kept artifact names stay.
    kept_manifest = manifest_of(store, artifact_key(kept.id, GPU, "tp8"))
    assert sweep_blobs(store, now=datetime.now(UTC) + timedelta(days=2)) == 0
    assert {blob_key(f.sha256) for f in kept_manifest.files} == set(
        store.list_keys(BLOB_PREFIX))
    # On a node: a warm artifact goes with its weights.
    root = tmp_path / "node"
    assert prewarm.fetch(store, kept, root, gpu=GPU, trust=OPEN(store)).ok
    w = kept.binding.weights
    assert drop_warm(root, {f"{w.repo_id}@{w.commit}"}) == []
    assert len(drop_warm(root, set())) == 1 and list_warm(root) == []


def test_policy_turns_warm_start_off_for_a_channel(captured, tmp_path, policies):
    from k3artifacts.warm.trust import warm_trust
    from tests.fixtures.moves import use_policy

    store, releases, release, dirs = captured
    _capture(store, release, dirs)
    gates = policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace(
        "  staging:\n", "  staging:\n    warm_start: {enabled: false}\n", 1))
    trust = warm_trust(use_policy(store, policies), "staging")
    assert prewarm.fetch(store, release, tmp_path / "n", gpu=GPU, trust=trust).reason == \
        "disabled"


def test_cli_capture_pull_and_cache_ls(captured, tmp_path, policies):
    from tests.fixtures.moves import use_policy

    store, releases, release, dirs = captured
    env = {**os.environ, "K3A_STORE": store.url}
    k3a = [sys.executable, "-m", "k3artifacts"]
    out = subprocess.run([*k3a, "warm", "capture", release.id, "--gpu", GPU, "--json",
                          *(f"{n}={p}" for n, p in dirs.items())],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    again = subprocess.run([*k3a, "warm", "capture", release.id, "--gpu", GPU,
                            f"triton={dirs['triton']}"], env=env, capture_output=True, text=True)
    assert again.returncode == 6 and "already" in again.stderr.lower() + again.stdout.lower()
    # The packaged policy requires signatures on production: a bare tuple's artifact without a
    # release signature is then a named miss, and the weights pull still succeeds.
    strict = subprocess.run([*k3a, "pull", release.id, "--to", str(tmp_path / "n2"), "--gpu",
                             GPU, "--json"], env=env, capture_output=True, text=True)
    assert strict.returncode == 0, strict.stderr
    assert json.loads(strict.stdout)["warm"]["reason"] == "unsigned"
    # Said once: the log line where the miss was found, not again as a summary.
    assert strict.stderr.count("warm start miss") == 1 and ": unsigned: " in strict.stderr
    # No channel named: the miss says whose rule it is and how to capture one that passes.
    assert "channel None" not in strict.stderr and "--signing-key" in strict.stderr
    use_policy(store, policies)  # one that requires no signature
    root = tmp_path / "node"
    pulled = subprocess.run([*k3a, "pull", release.id, "--to", str(root), "--gpu", GPU,
                             "--json"], env=env, capture_output=True, text=True)
    assert pulled.returncode == 0, pulled.stderr
    assert json.loads(pulled.stdout)["warm"]["ok"] is True
    miss = subprocess.run([*k3a, "warm", "pull", release.id, "--to", str(root), "--gpu",
                           "NVIDIA B200", "--json"], env=env, capture_output=True, text=True)
    assert miss.returncode == 0 and json.loads(miss.stdout)["reason"] == "foreign-gpu"
    ls = subprocess.run([*k3a, "cache", "ls", "--to", str(root), "--json"], env=env,
                        capture_output=True, text=True)
    kinds = sorted(entry["kind"] for entry in json.loads(ls.stdout))
    assert kinds == ["warm", "weights"]


@pytest.mark.parametrize("where", ["host", "s3"])
def test_rendered_pods_use_the_warm_artifact_and_the_capture_job_validates(
        published_revision, where):
    from k3artifacts.serving.render import render
    from tests.test_render import make, s3_release, validate_k8s

    release = make(published_revision)
    release = s3_release(release) if where == "s3" else release
    docs = render(release, "eks-node-cache").documents
    validate_k8s(docs)
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    warm = pod["initContainers"][-1]
    assert warm["name"] == "warm-start"
    assert warm["command"][3:9] == ["k3a", "warm", "use", release.id, "--store",
                                    warm["command"][8]]
    (vllm,) = pod["containers"]
    assert warm["resources"] == vllm["resources"]  # sees the server's GPUs for nvidia-smi
    env = {e["name"]: e["value"] for e in vllm["env"]}
    assert env["VLLM_CACHE_ROOT"] == "/k3a-warm/vllm"
    assert env["TRITON_CACHE_DIR"] == "/k3a-warm/triton"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/k3a-warm/inductor"
    assert env["FLASHINFER_WORKSPACE_BASE"] == "/k3a-warm/flashinfer"
    work = next(m for m in vllm["volumeMounts"] if m["mountPath"] == "/k3a-warm")
    assert work == {"name": "node-cache", "mountPath": "/k3a-warm",
                    "subPath": f"warm-work/{release.id}"}
    job = next(d for d in docs if d["kind"] == "Job")
    spec = job["spec"]["template"]["spec"]
    (capture_c,) = spec["containers"]
    assert capture_c["command"][:4] == ["k3a", "warm", "capture", release.id]
    assert "--if-absent" in capture_c["command"]
    assert capture_c["command"][capture_c["command"].index("--gpu") + 1] == "NVIDIA B300 SXM6 AC"
    assert spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "topologyKey"] == "kubernetes.io/hostname"
    work_mount = next(m for m in capture_c["volumeMounts"] if m["mountPath"] == "/k3a-warm")
    assert work_mount["readOnly"] is True  # the caches are read, never written, by the capture
    if where == "host":  # the file store itself is written
        store_mount = next(m for m in capture_c["volumeMounts"] if m["mountPath"] == "/k3a-store")
        assert "readOnly" not in store_mount
    prewarm_docs = render(release, "eks-prewarm").documents
    validate_k8s(prewarm_docs)
    ds = next(d for d in prewarm_docs if d["kind"] == "DaemonSet")
    pull_warm = ds["spec"]["template"]["spec"]["initContainers"][-1]
    assert pull_warm["command"][:4] == ["k3a", "warm", "pull", release.id]


def test_a_link_planted_in_the_node_cache_or_the_work_dir_is_never_followed(captured, tmp_path):
    store, releases, release, dirs = captured
    _capture(store, release, dirs)
    root, into = tmp_path / "n", tmp_path / "work"
    assert prewarm.fetch(store, release, root, gpu=GPU, trust=OPEN(store)).ok
    (cached,) = list_warm(root)
    victim = next(p for p in Path(cached.path).rglob("*.cubin"))
    victim.parent.chmod(0o755)
    victim.unlink()
    secret = tmp_path / "secret"
    secret.write_bytes(b"not for the server")
    victim.symlink_to(secret)
    into.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"x")
    (into / "triton").symlink_to(outside, target_is_directory=True)
    used = prewarm.prepare(store, release, root, into, gpu=GPU, trust=OPEN(store), pull=False)
    assert (used.ok, used.reason) == (False, "unsafe")
    assert (outside / "keep").read_bytes() == b"x"  # the planted link went, not its target
    assert not (into / "triton").is_symlink()
    assert [p for p in into.rglob("*") if p.is_file()] == []


def test_no_store_is_a_cold_start_never_a_failure(captured, tmp_path):
    store, releases, release, dirs = captured
    k3a = [sys.executable, "-m", "k3artifacts"]
    env = {**os.environ, "K3A_STORE": store.url}
    into = tmp_path / "work"
    gone = subprocess.run([*k3a, "warm", "use", release.id, "--store",
                           f"file://{tmp_path / 'nowhere'}", "--gpu", GPU, "--into", str(into),
                           "--to", str(tmp_path / "n"), "--json"],
                          env=env, capture_output=True, text=True)
    assert gone.returncode == 0, gone.stderr
    assert json.loads(gone.stdout)["reason"] == "unavailable"
    assert sorted(p.name for p in into.iterdir()) == sorted(
        ["vllm", "triton", "inductor", "flashinfer", "deepgemm"])
