"""Signed provenance: revision and tuple signatures, checked by k3a, the gate and the upstream
OpenSSF ``model_signing`` CLI (run for real in a subprocess, offline, with generated keys)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import xxhash
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from k3artifacts.errors import AlreadyExists, ConfigError, NotFound
from k3artifacts.policy.document import IDENTITIES_FILE, PolicyDocument
from k3artifacts.promotion.gates.signature import signature_gate
from k3artifacts.releases.signatures import (
    TupleSignatureRefused,
    check_tuple_signature,
    sign_tuple,
    signature_key,
)
from k3artifacts.releases.tuples import tuple_key
from k3artifacts.revisions.manifest import FileRecord, LicenseRecord, ShardManifest
from k3artifacts.signing.revision import SIGNATURE_REL, sign_revision
from k3artifacts.signing.verify import verify_signed_revision
from k3artifacts.stores.file import FileStore
from k3artifacts.trust.identities import ROLES, Identity, KeyEntry, identities_yaml
from k3artifacts.trust.keys import release_signer
from tests.conftest import REPO_ROOT
from tests.fixtures.moves import trust_release_keys, use_policy, with_people
from tests.fixtures.softhsm import SOFTHSM
from tests.support.cli import run_process
from tests.support.releases import Releases

MODEL_SIGNING = str(Path(sys.executable).parent / "model_signing")


def keys_in(policies):
    """The signing policy of a policies directory, as the signature gate is handed it."""
    return lambda: PolicyDocument.from_dir(policies).release_keys()


def _write_key(path: Path, curve: ec.EllipticCurve) -> Path:
    key = ec.generate_private_key(curve)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)  # a key others can read is refused, as ssh refuses one
    path.with_suffix(".pub.pem").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "keys"
    d.mkdir()
    return {
        "release": _write_key(d / "release.pem", ec.SECP256R1()),
        "release384": _write_key(d / "release384.pem", ec.SECP384R1()),
        "intruder": _write_key(d / "intruder.pem", ec.SECP256R1()),
    }


@pytest.fixture
def policies(tmp_path: Path, keys: dict[str, Path]) -> Path:
    """The checkout's gates, with `release` and `release384` identities holding the release
    role; `intruder` is a valid key nobody listed."""
    root = tmp_path / "policies"
    root.mkdir()
    shutil.copy(REPO_ROOT / "policies" / "promotion-gates.yaml", root)
    shutil.copytree(REPO_ROOT / "policies" / "eval-suites", root / "eval-suites")
    trust_release_keys(root, {name: keys[name].with_suffix(".pub.pem")
                              for name in ("release", "release384")},
                       {"production": {"required": True,
                                       "identities": ["release", "release384"]},
                        "staging": {"required": False}})
    return root


@pytest.fixture
def releases(file_store: FileStore, tmp_path: Path, policies: Path) -> Releases:
    """A store whose policy in force is :func:`policies`: `k3a verify --signature` trusts the
    keys the store's policy trusts, and no others."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    use_policy(file_store, policies)
    return Releases(file_store, scratch)


def _revision_dir(store: FileStore, manifest: ShardManifest) -> Path:
    return store.local_path(f"models/{manifest.repo_id}/{manifest.commit}")


def _writable(tree: Path) -> None:
    """Published trees are read-only; an attacker with write access to the store is what we
    simulate, so give write bits back before tampering."""
    for dirpath, _, filenames in os.walk(tree):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)


def _upstream_verify(directory: Path, public_key: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MODEL_SIGNING, "verify", "key", str(directory), "--signature",
         str(directory / SIGNATURE_REL), "--public_key", str(public_key)],
        capture_output=True, text=True, timeout=120,
    )


def _signed_release(releases: Releases, keys: dict[str, Path], key: str = "release"):
    manifest = releases.publish(code={"modeling_k3.py": b"class K3: pass\n"})
    signer = release_signer(str(keys[key]))
    sign_revision(releases.store, manifest.repo_id, manifest.commit, signer)
    release = releases.tuple_for(manifest)
    sign_tuple(releases.store, release.id, signer)
    return manifest, release


def test_k3a_sign_then_upstream_and_k3a_verify_accept(releases, keys, policies, k3a_cmd, k3a_env):
    manifest = releases.publish(code={"sub/a.py": b"a", "sub.x/b.py": b"b"})
    ref = f"{manifest.repo_id}@{manifest.commit}"
    store = releases.store.url
    signed = run_process("sign", ref, "--signing-key", str(keys["release"]), "--store", store,
                         "--json", env=k3a_env, cmd=k3a_cmd, expect=None)
    assert signed.returncode == 0, signed.stderr
    out = json.loads(signed.stdout)
    assert out["new"] and out["signature"].endswith("/.k3a/model.sig")
    # Signed is covered: every file of the manifest, plus the manifest itself.
    assert out["files"] == len(manifest.files) + 1
    directory = _revision_dir(releases.store, manifest)
    # Nothing else of the published tree changed, and it stays read-only.
    assert oct(os.stat(directory / ".k3a").st_mode & 0o777) == "0o555"
    assert oct(os.stat(directory / SIGNATURE_REL).st_mode & 0o777) == "0o444"

    upstream = _upstream_verify(directory, keys["release"].with_suffix(".pub.pem"))
    assert upstream.returncode == 0, upstream.stdout + upstream.stderr
    assert "Verification succeeded" in upstream.stdout

    checked = run_process("verify", "--signature", ref, "--store", store, "--channel", "production",
                          "--json", env=k3a_env, cmd=k3a_cmd, expect=None)
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    assert report["ok"] and report["signed_by"] == "release"
    assert report["algorithm"] == "xxh3-128" and report["manifest_digest"] == manifest.digest()
    # Its last progress line counts the files it hashed (it said `files 0/12` at 100%).
    final = [line for line in checked.stderr.splitlines()
             if "verifying:" in line and "done in" in line]
    files = len(manifest.files)
    assert final and f"files {files}/{files}" in final[-1], checked.stderr
    # A node verifies a directory (an FSx mount) the same way.
    by_path = run_process("verify", "--signature", str(directory), "--store", store, "-q",
                          env=k3a_env, cmd=k3a_cmd, expect=None)
    assert by_path.returncode == 0, by_path.stderr

    again = run_process("sign", ref, "--signing-key", str(keys["release"]), "--store", store,
                        "--json", env=k3a_env, cmd=k3a_cmd, expect=None)
    assert again.returncode == 0 and not json.loads(again.stdout)["new"]
    other = run_process("sign", ref, "--signing-key", str(keys["release384"]), "--store", store,
                        env=k3a_env, cmd=k3a_cmd, expect=None)
    assert other.returncode == 6 and "already exists" in other.stderr


def _flip_shard_byte(directory: Path, manifest: ShardManifest) -> str:
    shard = next(r.path for r in manifest.files if r.path.endswith(".safetensors"))
    path = directory / shard
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    return shard


def _edit_manifest(directory: Path, manifest: ShardManifest) -> str:
    """The attack hashes alone cannot stop: change a shard and its manifest record together."""
    shard = _flip_shard_byte(directory, manifest)
    body = (directory / shard).read_bytes()
    files = [
        r.model_copy(update={"sha256": hashlib.sha256(body).hexdigest(),
                             "xxh3_128": xxhash.xxh3_128_hexdigest(body)})
        if r.path == shard else r
        for r in manifest.files
    ]
    (directory / ".k3a/manifest.json").write_bytes(
        manifest.model_copy(update={"files": files}).canonical())
    return ".k3a/manifest.json"


def _add_file(directory: Path, manifest: ShardManifest) -> str:
    (directory / "sitecustomize.py").write_text("import os\n")
    return "sitecustomize.py"


def _remove_file(directory: Path, manifest: ShardManifest) -> str:
    (directory / "config.json").unlink()
    return "config.json"


def _garble_manifest(directory: Path, manifest: ShardManifest) -> str:
    (directory / ".k3a/manifest.json").write_text("{not json")
    return ".k3a/manifest.json"


def _add_meta_file(directory: Path, manifest: ShardManifest) -> str:
    (directory / ".k3a/extra.json").write_text("{}")
    return ".k3a/extra.json"


@pytest.mark.parametrize("tamper", [_flip_shard_byte, _edit_manifest, _add_file, _remove_file,
                                    _garble_manifest, _add_meta_file])
def test_altered_revision_is_refused_by_k3a_gate_and_upstream(
    tamper, releases, keys, policies, k3a_cmd, k3a_env
):
    manifest, release = _signed_release(releases, keys)
    directory = _revision_dir(releases.store, manifest)
    assert signature_gate(releases.store, release, "production", keys_in(policies)).passed
    _writable(directory)
    named = tamper(directory, manifest)

    checked = run_process("verify", "--signature", f"{manifest.repo_id}@{manifest.commit}",
                          "--store", releases.store.url, "--json", env=k3a_env, cmd=k3a_cmd,
                          expect=None)
    assert checked.returncode == 4, checked.stdout + checked.stderr
    problems = json.loads(checked.stdout)["problems"]
    assert named in {p["path"] for p in problems}, problems
    assert named in checked.stderr

    gate = signature_gate(releases.store, release, "production", keys_in(policies))
    assert not gate.passed and named in gate.reason

    upstream = _upstream_verify(directory, keys["release"].with_suffix(".pub.pem"))
    assert upstream.returncode != 0, upstream.stdout
    assert "Verification failed" in upstream.stderr


def test_edited_tuple_body_with_its_signature_kept_is_refused(
    releases, keys, policies, k3a_cmd, k3a_env
):
    manifest, release = _signed_release(releases, keys)
    trusted = keys_in(policies)().for_channel("production")
    assert check_tuple_signature(releases.store, release.id, trusted) == "release"
    ok = run_process("verify", "--signature", release.id, "--store", releases.store.url, "--json",
                     env=k3a_env, cmd=k3a_cmd, expect=None)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["tuple_signed_by"] == "release"

    # Who/when are outside the tuple id, so the id still derives; the signature catches it.
    path = releases.store.local_path(tuple_key(release.id))
    os.chmod(path, 0o644)
    body = json.loads(path.read_bytes())
    body["created_by"] = "someone-else"
    path.write_bytes(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())

    with pytest.raises(TupleSignatureRefused, match=rf"{release.id}\.sig: the signature is over"):
        check_tuple_signature(releases.store, release.id, trusted)
    refused = run_process("verify", "--signature", release.id, "--store", releases.store.url,
                          env=k3a_env, cmd=k3a_cmd, expect=None)
    assert refused.returncode == 4 and f"{release.id}.sig" in refused.stderr
    gate = signature_gate(releases.store, release, "production", keys_in(policies))
    assert not gate.passed and f"{release.id}.sig" in gate.reason

    # A changed binding no longer derives its id: refused before the signature is read.
    body["binding"]["image"]["digest"] = "sha256:" + "9" * 64
    path.write_bytes(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    gate = signature_gate(releases.store, release, "production", keys_in(policies))
    assert not gate.passed and "tuple-tampered" in gate.reason


def test_key_not_listed_in_policies_is_refused(releases, keys, policies, k3a_cmd, k3a_env):
    manifest, release = _signed_release(releases, keys, key="intruder")
    # The signature itself is sound: upstream, given the intruder's own key, accepts it.
    directory = _revision_dir(releases.store, manifest)
    assert _upstream_verify(directory, keys["intruder"].with_suffix(".pub.pem")).returncode == 0
    refused = run_process("verify", "--signature", f"{manifest.repo_id}@{manifest.commit}",
                          "--store", releases.store.url, env=k3a_env, cmd=k3a_cmd, expect=None)
    assert refused.returncode == 4
    assert ".k3a/model.sig: signed by an untrusted key" in refused.stderr
    gate = signature_gate(releases.store, release, "production", keys_in(policies))
    assert not gate.passed and "untrusted key" in gate.reason
    with pytest.raises(TupleSignatureRefused, match="untrusted key"):
        check_tuple_signature(releases.store, release.id,
                              keys_in(policies)().for_channel("production"))


def test_missing_signatures_are_refused_and_only_where_required(releases, keys, policies):
    manifest = releases.publish()
    release = releases.tuple_for(manifest)
    gate = signature_gate(releases.store, release, "production", keys_in(policies))
    assert not gate.passed and ".k3a/model.sig: missing" in gate.reason
    assert signature_gate(releases.store, release, "staging", keys_in(policies)).passed
    sign_revision(releases.store, manifest.repo_id, manifest.commit,
                  release_signer(str(keys["release384"])))
    gate = signature_gate(releases.store, release, "production", keys_in(policies))
    assert not gate.passed and f"{signature_key(release.id)}: missing" in gate.reason
    sign_tuple(releases.store, release.id, release_signer(str(keys["release384"])))
    gate = signature_gate(releases.store, release, "production", keys_in(policies))
    assert gate.passed, gate.reason


def test_checkout_policy_fails_closed_until_a_key_is_listed(releases, keys):
    manifest, release = _signed_release(releases, keys)
    checkout = Path(__file__).resolve().parents[1] / "policies"
    gate = signature_gate(releases.store, release, "production", keys_in(checkout))
    assert not gate.passed and "names no identity holding the release role" in gate.reason


def test_tuple_create_signs_with_signing_key(releases, keys, policies, k3a_cmd, k3a_env):
    manifest = releases.publish()
    created = run_process("tuple", "create", f"{manifest.repo_id}@{manifest.commit}", "--image",
                          "registry.example.com/vllm@sha256:" + "1" * 64, "--offline", "--profile",
                          "p6-b300-tp8", "--store", releases.store.url, "--signing-key",
                          str(keys["release"]), "--json", env=k3a_env, cmd=k3a_cmd, expect=None)
    assert created.returncode == 0, created.stderr
    out = json.loads(created.stdout)
    tuple_id = out["tuple"]["id"]
    assert out["signature"] == signature_key(tuple_id)
    trusted = keys_in(policies)().for_channel("production")
    assert check_tuple_signature(releases.store, tuple_id, trusted) == "release"


def test_bad_signing_keys_are_refused_clearly(tmp_path):
    rsa_key = tmp_path / "rsa.pem"
    rsa_key.write_bytes(rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    rsa_key.chmod(0o600)
    with pytest.raises(ConfigError, match="not ed25519, ECDSA P-256 or ECDSA P-384"):
        release_signer(str(rsa_key))
    with pytest.raises(NotFound, match="no identity key at"):
        release_signer(str(tmp_path / "absent.pem"))
    ed = tmp_path / "ed25519.pem"
    ed.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    ed.chmod(0o600)
    with pytest.raises(ConfigError, match="is ed25519: a release is signed by an ECDSA"):
        release_signer(str(ed))
    readable = tmp_path / "readable.pem"
    readable.write_bytes(ed.read_bytes())
    readable.chmod(0o644)
    with pytest.raises(ConfigError, match="can be read or written by other accounts"):
        release_signer(str(readable))
    with pytest.raises(ConfigError, match="PKCS#11"):
        release_signer("pkcs11:token=release;object=k3a")


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.parametrize("shard_size", [16 << 20, 4 << 30])
def test_signing_reads_no_weight_byte(shard_size, file_store, keys, tmp_path):
    """Signing uses the digests staging recorded: the bytes read do not grow with the release.

    The shards are sparse files (nothing to write, nothing cached), published through the file
    store's real writer with the digests a stager would have recorded; any read of them would
    show in rchar by GiBs.
    """
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    records = []
    writer = file_store.begin_revision("moonshotai/Kimi-K3", "c" * 40)
    for i in range(4):
        local = scratch / f"model-{i}.safetensors"
        with open(local, "wb") as fh:
            fh.truncate(shard_size)
        record = FileRecord(path=local.name, size=shard_size, kind="weights",
                            sha256=hashlib.sha256(local.name.encode()).hexdigest(),
                            xxh3_128="0" * 32)
        writer.put_file(record, local)
        records.append(record)
    manifest = ShardManifest(repo_id="moonshotai/Kimi-K3", commit="c" * 40, files=records,
                             license=LicenseRecord(path=None, sha256=None, text=None),
                             remote_code=[], total_bytes=4 * shard_size)
    writer.commit(manifest)
    signer = release_signer(str(keys["release"]))
    before = _rchar()
    signed = sign_revision(file_store, "moonshotai/Kimi-K3", "c" * 40, signer)
    read = _rchar() - before
    assert signed.files == 5
    assert read < 64 * 1024, f"signing read {read} bytes of a {4 * shard_size} byte release"


def test_sign_and_verify_on_every_store(store, keys, policies, tmp_path):
    scratch = tmp_path / "scratch-any"
    scratch.mkdir()
    releases = Releases(store, scratch)
    manifest, release = _signed_release(releases, keys)
    trusted = keys_in(policies)().for_channel("production")
    checked = verify_signed_revision(trusted, store=store, repo_id=manifest.repo_id,
                                     commit=manifest.commit)
    assert checked.report.ok and checked.key_name == "release"
    assert signature_gate(store, release, "production", keys_in(policies)).passed
    with pytest.raises(AlreadyExists):
        sign_revision(store, manifest.repo_id, manifest.commit,
                      release_signer(str(keys["release384"])))


def test_signed_verification_hashes_with_verify_s_per_core_default(releases, keys, policies):
    """`k3a verify --signature`, the signature gate and the rendered verifier hash as many
    files at once as a plain verify: one per usable core (here, one core), not a fixed
    number."""
    from k3artifacts.stores.verify import verify_revision

    files = {f"part-{i:02d}.bin": bytes([i]) * (4 << 20) for i in range(16)}
    manifest = releases.publish(extra=files)
    sign_revision(releases.store, manifest.repo_id, manifest.commit,
                  release_signer(str(keys["release"])))
    directory = _revision_dir(releases.store, manifest)
    trusted = keys_in(policies)().for_channel("production")

    def hashing_threads(check) -> set[str]:
        seen: set[str] = set()
        check(lambda nbytes: seen.add(threading.current_thread().name))
        return seen

    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # this thread, and the hashing threads it starts
    try:
        signed = hashing_threads(lambda on_bytes: verify_signed_revision(
            trusted, directory=directory, on_bytes=on_bytes).raise_for_problems())
        plain = hashing_threads(lambda on_bytes: verify_revision(
            directory=directory, on_bytes=on_bytes).raise_for_problems())
    finally:
        os.sched_setaffinity(0, cores)
    assert plain == {"k3a-hash-0"}
    assert signed == plain


def test_k3a_stage_signs_at_publication(local_hub, tmp_path, keys, policies, k3a_cmd, k3a_env):
    from tests.staging_helpers import REPO, small_release

    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    store = FileStore(tmp_path / "staged")
    # The deprecated variable still signs, until its removal, and says so once.
    env = dict(k3a_env, K3A_SIGNING_KEY=str(keys["release"]))
    staged = subprocess.run(
        [*k3a_cmd, "stage", REPO, "--store", store.url, "--endpoint", local_hub.endpoint,
         "--quarantine", str(tmp_path / "q"), "--json", "-q"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert staged.returncode == 0, staged.stderr
    notice = ("K3A_SIGNING_KEY is deprecated and read until k3artifacts 0.3.0 (2027-06-30): "
              "set K3A_IDENTITY_KEY")
    assert staged.stderr.count(notice) == 1, staged.stderr
    result = json.loads(staged.stdout)
    assert result["signature"] == f"models/{REPO}/{commit}/{SIGNATURE_REL}"
    directory = store.local_path(f"models/{REPO}/{commit}")
    upstream = _upstream_verify(directory, keys["release"].with_suffix(".pub.pem"))
    assert upstream.returncode == 0, upstream.stdout + upstream.stderr
    trusted = keys_in(policies)().for_channel("production")
    assert verify_signed_revision(trusted, directory=directory).report.ok


def test_stage_refuses_a_bad_signing_key_before_downloading(local_hub, tmp_path):
    from tests.staging_helpers import REPO, run_stage, small_release

    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    with pytest.raises(NotFound, match="no identity key at .*missing.pem"):
        run_stage(local_hub.endpoint, FileStore(tmp_path / "s"), tmp_path / "q",
                  signing_key=str(tmp_path / "missing.pem"))
    assert not [r for r in local_hub.hub.requests if "/resolve/" in r.url]


def test_eks_init_container_checks_signatures_before_vllm(
    published_revision, keys, policies, tmp_path, k3a_cmd, k3a_env
):
    """The pod's verifier checks with the keys of the store's policy, verified under the root
    this client pins: the ConfigMap carries that pin (for the store as the pod mounts it) and
    the signing policy as rendered."""
    from k3artifacts.policy.signing_keys import verifier_trust
    from k3artifacts.serving.render import render
    from k3artifacts.serving.render.eks import VERIFIER_CONFIG
    from k3artifacts.trust.heads import Heads, heads_name, load_heads
    from k3artifacts.trust.pins import Pin, load_pin, pin_name
    from tests.test_render import make, validate_k8s

    p = published_revision
    use_policy(p.store, policies)
    signer = release_signer(str(keys["release"]))
    sign_revision(p.store, p.repo_id, p.commit, signer)
    release = make(p)
    sign_tuple(p.store, release.id, signer)
    docs = render(release, "eks", verifier=verifier_trust(p.store)).documents
    validate_k8s(docs)
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    pod_pin = pin_name("file:///k3a-store")
    pod_heads = heads_name("file:///k3a-store")
    assert set(config_map["data"]) == {"release-identities.yaml", pod_pin, pod_heads}
    rendered = yaml.safe_load(config_map["data"]["release-identities.yaml"])
    assert sorted(rendered["identities"]) == ["release", "release384"]
    # The pod pins the heads its render saw: the policy's, as this client verified it.
    seen = Heads.model_validate_json(config_map["data"][pod_heads])
    assert seen.store == "file:///k3a-store"
    assert seen.heads == load_heads(p.store.url).heads and "the store's policy" in seen.heads
    pinned = Pin.model_validate_json(config_map["data"][pod_pin])
    assert pinned.store == "file:///k3a-store"
    assert pinned.root == load_pin(p.store.url).root  # the root this client pins
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if "configMap" in v)
    assert volume["configMap"] == {"name": config_map["metadata"]["name"], "items": [
        {"key": pod_pin, "path": f"k3artifacts/trust/{pod_pin}"},
        {"key": pod_heads, "path": f"k3artifacts/trust/{pod_heads}"}]}
    (init,) = pod["initContainers"]
    command = init["command"]
    assert command[3:7] == ["k3a", "verify", release.id, "--signature"]
    assert "--policies" not in command and "--expect-digest" in command
    assert init["env"] == [{"name": "XDG_CONFIG_HOME", "value": VERIFIER_CONFIG}]

    # Run the rendered command as the pod would: the pin mounted where XDG_CONFIG_HOME says,
    # and the store where the volume would be (so the pin names the store by this path).
    mounted = tmp_path / "pod-config"
    (mounted / "k3artifacts" / "trust").mkdir(parents=True)
    (mounted / "k3artifacts" / "trust").chmod(0o755)
    here = pinned.model_copy(update={"store": p.store.url})
    (mounted / "k3artifacts" / "trust" / pin_name(p.store.url)).write_text(
        here.model_dump_json())
    argv = [a.replace("file:///k3a-store", p.store.url) for a in command]
    k3a_at = argv.index("k3a")
    argv = [*argv[:k3a_at], *k3a_cmd, *argv[k3a_at + 1:]]
    pod_env = dict(k3a_env, XDG_CONFIG_HOME=str(mounted))
    ok = subprocess.run(argv, env=pod_env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "signature: ok, signed by release" in ok.stdout
    directory = p.store.local_path(f"models/{p.repo_id}/{p.commit}")
    _writable(directory)
    (directory / "config.json").write_text('{"model_type": "evil"}')
    refused = subprocess.run(argv, env=pod_env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 4 and "config.json" in refused.stderr


def test_hyperpod_render_refuses_to_promise_a_signature_check(published_revision, policies):
    from k3artifacts.policy.signing_keys import verifier_trust
    from k3artifacts.serving.profiles import StorageTarget
    from k3artifacts.serving.render import render
    from tests.test_render import FSX, make

    use_policy(published_revision.store, policies)
    release = make(published_revision, storage=StorageTarget(fsx=FSX))
    with pytest.raises(ConfigError, match="cannot check signatures in the pod"):
        render(release, "hyperpod", verifier=verifier_trust(published_revision.store))


def test_pkcs11_release_identity_signs_and_verifies_in_k3a_and_upstream(
        softhsm_uri, releases, keys, policies, tmp_path, k3a_cmd, k3a_env):
    """One key reference for both: an HSM key (pkcs11:) is an identity holding the release
    role; `k3a sign --signing-key pkcs11:...` signs, `k3a verify --signature` checks against
    the store's policy, and upstream model_signing verifies against its public key."""
    uri, pem = softhsm_uri
    public = tmp_path / "hsm.pub.pem"
    public.write_bytes(pem)
    trust_release_keys(policies, {"release": keys["release"].with_suffix(".pub.pem"),
                                 "hsm": public},
                       {"production": {"required": True, "identities": ["hsm"]}})
    use_policy(releases.store, policies)
    manifest = releases.publish()
    ref = f"{manifest.repo_id}@{manifest.commit}"
    release = releases.tuple_for(manifest)
    for target in (ref, release.id):
        signed = run_process("sign", target, "--signing-key", uri, "--store", releases.store.url,
                             env=k3a_env, cmd=k3a_cmd, expect=None)
        assert signed.returncode == 0, signed.stderr
        assert "1234" not in signed.stdout + signed.stderr
    verified = run_process("verify", "--signature", release.id, "--channel", "production",
                           "--store", releases.store.url, env=k3a_env, cmd=k3a_cmd, expect=None)
    assert verified.returncode == 0, verified.stderr
    assert "signed by hsm" in verified.stdout
    gate = signature_gate(releases.store, release, "production", keys_in(policies))
    assert gate.passed and "key hsm" in gate.reason, gate.reason
    upstream = _upstream_verify(_revision_dir(releases.store, manifest), public)
    assert upstream.returncode == 0, upstream.stdout + upstream.stderr
    with pytest.raises(ConfigError, match="PKCS#11 key pkcs11:token=nope"):
        release_signer(f"pkcs11:token=nope;object=k3a?module-path={SOFTHSM}&pin-value=1234")


def test_a_key_whose_identity_lacks_the_release_role_signs_nothing_that_verifies(
        releases, keys, policies, k3a_cmd, k3a_env):
    """The same ECDSA key named as an identity of the policy, with every role but release:
    what it signs is refused by `k3a verify --signature` and the signature gate."""
    entry = KeyEntry(pem=keys["intruder"].with_suffix(".pub.pem").read_text())
    document = with_people(policies)
    named = document.identities
    roles = [r for r in ROLES if r != "release"]
    widened = named.model_copy(update={"identities": {
        **named.identities, "ops": Identity(roles=roles, keys=[entry])}})
    (policies / IDENTITIES_FILE).write_text(identities_yaml(widened))
    use_policy(releases.store, policies)
    manifest, release = _signed_release(releases, keys, key="intruder")
    refused = run_process("verify", "--signature", release.id, "--store", releases.store.url,
                          env=k3a_env, cmd=k3a_cmd, expect=None)
    assert refused.returncode == 4, refused.stderr
    assert "untrusted key" in refused.stderr
    gate = signature_gate(releases.store, release, "production", keys_in(policies))
    assert not gate.passed and "untrusted key" in gate.reason
