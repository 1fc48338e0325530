"""Warm-start artifacts against hostile state: a manifest or a cache with a path no node can
hold, partial pulls nested deeper than the node cache walks (listed by `k3a cache ls`,
removed by `k3a cache gc`, never blocking a pull), and an artifact taken first that would
squat the key of a capture the channel would use: one without the release signature the
channel requires, or a manifest nobody the policy trusts made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.errors import ConfigError
from k3artifacts.nodecache import locks
from k3artifacts.nodecache.layout import CacheLayout
from k3artifacts.policy.signed import record_trust, store_id
from k3artifacts.signing.keys import ReleaseSigner
from k3artifacts.trust.keys import FileSigner
from k3artifacts.warm import prewarm
from k3artifacts.warm.claim import AlreadyCaptured
from k3artifacts.warm.model import artifact_key, gpu_slug
from k3artifacts.warm.node import _lock_rev, list_warm
from k3artifacts.warm.trust import WarmTrust
from tests.fixtures.moves import trust_release_keys, use_policy
from tests.fixtures.people import person
from tests.support.cli import invoke
from tests.test_warm import GPU, OPEN, _capture, a_release_and_its_caches

DEEP = 120


@pytest.fixture
def captured(tmp_path):
    return a_release_and_its_caches(tmp_path, small=6)


def _deep_tree(top: Path, depth: int = DEEP) -> Path:
    """A directory chain ``depth`` deep with a file at the bottom, made one level at a time
    (the paths grow past what one mkdir call takes)."""
    top.mkdir(parents=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open("kernel.cubin", os.O_WRONLY | os.O_CREAT, 0o444, dir_fd=fd)
        os.write(leaf, b"x" * 100)
        os.close(leaf)
        os.fchmod(fd, 0o555)
    finally:
        os.close(fd)
    return top


def test_a_manifest_with_a_deep_path_is_refused_by_name_before_anything_is_made(
        captured, tmp_path):
    store, _, release, dirs = captured
    result = _capture(store, release, dirs)
    raw = json.loads(store.read(result.key).data)["body"]
    raw["files"][0]["path"] = "/".join(["d"] * DEEP) + "/kernel.cubin"
    store.delete(result.key)  # a capturer's broken (or hostile) key: its record verifies
    store.create(result.key, person("test").sign(key=result.key, kind="warm-manifest",
                                                 body=raw, store_id=store_id(store)))
    root = tmp_path / "node"
    miss = prewarm.fetch(store, release, root, gpu=GPU, trust=OPEN(store))
    assert miss.reason == "malformed", miss.line()
    assert "files.0.path" in miss.detail and f"nests {DEEP + 1} deep, more than 32" in miss.detail
    assert not (root / "warm").exists()


def test_a_cache_nested_deeper_than_a_node_holds_is_not_captured(captured, tmp_path):
    store, _, release, dirs = captured
    deep = dirs["triton"] / "/".join(["d"] * 40)
    deep.mkdir(parents=True)
    (deep / "kernel.cubin").write_bytes(b"x")
    with pytest.raises(ConfigError, match="nests 41 deep, more than 32; not captured"):
        _capture(store, release, dirs)
    assert store.list_keys("warm/") == []


def test_partial_pulls_are_listed_collected_and_never_block_a_pull(captured, tmp_path):
    store, _, release, dirs = captured
    _capture(store, release, dirs)
    root = tmp_path / "node"
    layer = root / "warm" / release.id / gpu_slug(GPU)
    # An older k3a died on a deep path: its partial nests deeper than the node cache walks.
    _deep_tree(layer / ".tp8.k3a-partial")
    (partial,) = list_warm(root)
    assert partial.partial and partial.layout == "tp8" and partial.revision == ""
    assert partial.path == str(layer / ".tp8.k3a-partial")
    ls = invoke("cache", "ls", "--to", str(root))
    assert "tp8" in ls.stdout and "partial" in ls.stdout, ls.stdout
    # The pull clears it and lands the artifact.
    pulled = prewarm.fetch(store, release, root, gpu=GPU, trust=OPEN(store))
    assert pulled.ok, pulled.line()
    assert [c.partial for c in list_warm(root)] == [False]
    # Two more partials: one nobody is pulling, one a running pull holds.
    other = root / "warm" / release.id / "nvidia-b200"
    _deep_tree(other / ".tp8.k3a-partial")
    _deep_tree(layer / ".tp4.k3a-partial", depth=3)
    layout = CacheLayout(root)
    with locks.exclusive(layout, _lock_rev(release.id, GPU, "tp4")):
        gc = invoke("cache", "gc", "--keep", "1", "--to", str(root), "--json")
        assert gc.json["warm_partials_removed"] == [
            str(other / ".tp8.k3a-partial")]
        assert not (other / ".tp8.k3a-partial").exists()
        assert (layer / ".tp4.k3a-partial").is_dir()
    gc = invoke("cache", "gc", "--keep", "1", "--to", str(root))
    assert f"removed unfinished warm pull {layer / '.tp4.k3a-partial'}" in gc.stdout + gc.stderr
    assert not any(c.partial for c in list_warm(root))


def test_an_unsigned_artifact_never_blocks_a_signed_capture(captured, tmp_path):
    store, releases, release, dirs = captured
    trusted_key, other_key = ec.generate_private_key(ec.SECP256R1()), \
        ec.generate_private_key(ec.SECP256R1())
    strict = WarmTrust(records=record_trust(store), require_signature=True,
                       trusted={"release": trusted_key.public_key()}, channel="production")

    def capture_as(signer, trust=strict):
        return _capture_with(store, release, dirs, signer=signer, trust=trust)

    capture_as(None, trust=None)  # no release signature, taken first
    assert prewarm.fetch(store, release, tmp_path / "a", gpu=GPU, trust=strict).reason == \
        "unsigned"
    with pytest.raises(AlreadyCaptured) as refused:  # neither can an unsigned capture...
        capture_as(None)
    assert not refused.value.usable and "(unsigned: " in str(refused.value)
    with pytest.raises(AlreadyCaptured):  # ...nor one signed by a key the channel distrusts
        capture_as(ReleaseSigner(FileSigner(other_key, "other")))
    done = capture_as(ReleaseSigner(FileSigner(trusted_key, "release")))
    assert done.replaced and done.replaced.startswith("unsigned: ")
    used = prewarm.fetch(store, release, tmp_path / "b", gpu=GPU, trust=strict)
    assert used.ok, used.line()
    with pytest.raises(AlreadyCaptured) as stands:  # now the first one stands
        capture_as(ReleaseSigner(FileSigner(trusted_key, "release")))
    assert stands.value.usable


def test_a_manifest_nobody_the_policy_trusts_made_never_squats_the_key(captured, tmp_path):
    store, _, release, dirs = captured
    key = artifact_key(release.id, GPU, "tp8")
    squat = {"schema_version": 1, "tuple_id": release.id, "gpu": GPU, "tensor_parallel": 8}
    store.create(key, json.dumps(squat).encode())  # written by hand, before any capture
    miss = prewarm.fetch(store, release, tmp_path / "a", gpu=GPU, trust=OPEN(store))
    assert miss.reason == "untrusted" and "refused (unsigned)" in miss.detail
    done = _capture_with(store, release, dirs, signer=None, trust=OPEN(store))
    assert done.replaced and done.replaced.startswith("untrusted: ")
    assert done.captured_by == "test"
    assert prewarm.fetch(store, release, tmp_path / "b", gpu=GPU, trust=OPEN(store)).ok


def _capture_with(store, release, dirs, *, signer, trust):
    from k3artifacts.warm.capture import capture, parse_roots

    return capture(store, release, gpu=GPU, tensor_parallel=8, pipeline_parallel=1,
                   roots=parse_roots([f"{n}={p}" for n, p in dirs.items()]),
                   by=person("test"), signer=signer, trust=trust)


def test_if_absent_accepts_only_what_the_channel_would_use(captured, tmp_path, policies):
    store, _, release, dirs = captured
    key = ec.generate_private_key(ec.SECP256R1())
    key_file = tmp_path / "release.pem"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_file.chmod(0o600)
    public = tmp_path / "release.pub.pem"
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    trust_release_keys(policies, {"release": public},
                       {"production": {"required": True, "identities": ["release"]}})
    use_policy(store, policies)
    env = {**os.environ, "K3A_STORE": store.url}
    env.pop("K3A_SIGNING_KEY", None)

    def capture(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "k3artifacts", "warm", "capture", release.id, "--gpu", GPU,
             "--channel", "production", *(f"{n}={p}" for n, p in dirs.items()), *extra],
            env=env, capture_output=True, text=True)

    assert capture().returncode == 0  # unsigned, first
    squat = capture("--if-absent")
    assert squat.returncode == 6, squat.stderr
    assert "the channel would not use it (unsigned: " in squat.stderr
    assert "--signing-key" in squat.stderr
    signed = capture("--if-absent", "--signing-key", str(key_file))
    assert signed.returncode == 0, signed.stderr
    assert "replaced the artifact that held the key, which the channel would not use" in \
        signed.stdout
    again = capture("--if-absent", "--signing-key", str(key_file))
    assert again.returncode == 0 and "already captured" in again.stdout, again.stderr
    pulled = subprocess.run(
        [sys.executable, "-m", "k3artifacts", "warm", "pull", release.id, "--channel",
         "production", "--gpu", GPU, "--to", str(tmp_path / "node"), "--json"],
        env=env, capture_output=True, text=True)
    assert json.loads(pulled.stdout)["ok"] is True, pulled.stdout + pulled.stderr
