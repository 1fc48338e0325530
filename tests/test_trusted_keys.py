"""Trusted release keys come only from the store's signed policy in force
(k3artifacts/policy/signing_keys.py), on a file store and on SeaweedFS: a key trusted by a local
directory (``K3A_POLICIES``, ``--policies``) is never accepted by `k3a verify --signature` nor
rendered into the verifier's ConfigMap by `k3a render --verify-signature`."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.cli import cli
from k3artifacts.releases.signatures import sign_tuple
from k3artifacts.signing.keys import load_signer
from k3artifacts.signing.revision import sign_revision
from k3artifacts.stores.file import FileStore
from k3artifacts.trust.pins import pin_name
from tests.conftest import REPO_ROOT
from tests.fixtures.moves import use_policy
from tests.support.releases import Releases


@pytest.fixture(params=["file", pytest.param("seaweed", marks=pytest.mark.s3)])
def store(request, tmp_path):
    if request.param == "file":
        return FileStore(tmp_path / "store")
    return request.getfixturevalue("seaweed_store")


@pytest.fixture
def env(request, store, k3a_env):
    base = dict(k3a_env, K3A_STORE=store.url)
    if not isinstance(store, FileStore):
        base.update(request.getfixturevalue("seaweed").env)
        base.pop("AWS_SESSION_TOKEN", None)  # a moto server's fake one, if one ran before
    return base


def _key(path):
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    path.with_suffix(".pub.pem").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def _policies(where, name, key):
    """A policy directory trusting ``key`` (as ``name``) on production."""
    (where / "signing" / "keys").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "policies" / "promotion-gates.yaml", where)
    shutil.copytree(REPO_ROOT / "policies" / "eval-suites", where / "eval-suites")
    shutil.copy(key.with_suffix(".pub.pem"), where / "signing" / "keys" / f"{name}.pub.pem")
    (where / "signing" / "trusted-keys.yaml").write_text(yaml.safe_dump({
        "schema_version": 1, "keys": {name: f"keys/{name}.pub.pem"},
        "channels": {"production": {"required": True}}}))
    return where


def k3a(env, *args, expect=0):
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == expect, (result.exit_code, result.stdout, result.stderr)
    return result


def test_a_trusted_key_in_a_local_directory_is_ignored(store, env, tmp_path):
    release_key, intruder = _key(tmp_path / "release.pem"), _key(tmp_path / "intruder.pem")
    use_policy(store, _policies(tmp_path / "store-policy", "release", release_key))
    local = _policies(tmp_path / "local-policy", "intruder", intruder)
    tuple_ = Releases(store, tmp_path / "scratch").release()
    w = tuple_.binding.weights
    signer = load_signer(str(intruder))
    sign_revision(store, w.repo_id, w.commit, signer)
    sign_tuple(store, tuple_.id, signer)
    pointed = dict(env, K3A_POLICIES=str(local))

    refused = k3a(pointed, "verify", "--signature", tuple_.id, expect=4)
    assert "untrusted key" in refused.stderr
    flagged = k3a(env, "verify", "--signature", tuple_.id, "--policies", str(local), expect=9)
    assert "trusted release keys come from the store's policy (" in flagged.stderr

    rendered = json.loads(k3a(pointed, "render", tuple_.id, "--target", "eks",
                              "--verify-signature", "--json").stdout)
    (config_map,) = [d for d in rendered["documents"] if d["kind"] == "ConfigMap"]
    assert set(config_map["data"]) == {"trusted-keys.yaml", "release.pub.pem",
                                       pin_name("file:///k3a-store")}
    assert "intruder" not in json.dumps(config_map)
    k3a(env, "render", tuple_.id, "--target", "eks", "--verify-signature", "--policies",
        str(local), expect=9)
