"""Trusted release keys come only from the store's signed policy in force
(k3artifacts/policy/signing_keys.py), on a file store and on SeaweedFS: a key trusted by a local
directory (``K3A_POLICIES``, ``--policies``) is never accepted by `k3a verify --signature` nor
rendered into the verifier's ConfigMap by `k3a render --verify-signature`."""

from __future__ import annotations

import json
import shutil

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.policy.record import in_force
from k3artifacts.releases.signatures import sign_tuple
from k3artifacts.signing.revision import sign_revision
from k3artifacts.trust.identities import SEEDED_ROLES
from k3artifacts.trust.keys import release_signer
from k3artifacts.trust.pins import pin_name
from tests.conftest import REPO_ROOT
from tests.fixtures.moves import trust_release_keys, use_policy
from tests.fixtures.people import ME
from tests.support.cli import invoke
from tests.support.releases import Releases


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
    """A policy directory whose identity ``name``, holding ``key``, signs releases, required
    on production."""
    where.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "policies" / "promotion-gates.yaml", where)
    shutil.copytree(REPO_ROOT / "policies" / "eval-suites", where / "eval-suites")
    trust_release_keys(where, {name: key.with_suffix(".pub.pem")})
    return where


def test_a_trusted_key_in_a_local_directory_is_ignored(any_store, any_env, tmp_path):
    release_key, intruder = _key(tmp_path / "release.pem"), _key(tmp_path / "intruder.pem")
    use_policy(any_store, _policies(tmp_path / "store-policy", "release", release_key))
    local = _policies(tmp_path / "local-policy", "intruder", intruder)
    tuple_ = Releases(any_store, tmp_path / "scratch").release()
    w = tuple_.binding.weights
    signer = release_signer(str(intruder))
    sign_revision(any_store, w.repo_id, w.commit, signer)
    sign_tuple(any_store, tuple_.id, signer)
    pointed = dict(any_env, K3A_POLICIES=str(local))

    refused = invoke("verify", "--signature", tuple_.id, expect=4, env=pointed)
    assert "untrusted key" in refused.stderr
    flagged = invoke("verify", "--signature", tuple_.id, "--policies", str(local), expect=9, env=any_env)
    assert "trusted release keys come from the store's policy (" in flagged.stderr

    rendered = json.loads(invoke("render", tuple_.id, "--target", "eks",
                              "--verify-signature", "--json", env=pointed).stdout)
    (config_map,) = [d for d in rendered["documents"] if d["kind"] == "ConfigMap"]
    pin = pin_name("file:///k3a-store")
    # The pin, and beside it the heads of the store's histories the render saw.
    assert set(config_map["data"]) == {"release-identities.yaml", pin,
                                       pin.removesuffix(".json") + ".heads.json"}
    assert "intruder" not in json.dumps(config_map)
    invoke("render", tuple_.id, "--target", "eks", "--verify-signature", "--policies",
        str(local), expect=9, env=any_env)


def test_a_first_policy_naming_only_a_release_key_names_its_seeder_beside_it(any_store, any_env,
                                                                            tmp_path):
    """`k3a policy init --from DIR` whose identities.yaml names a release key and nobody else:
    the release identity signs releases, not records, so the seeder is named beside it (with
    every role but release), and both count as the policy says."""
    release_key = _key(tmp_path / "release.pem")
    tuple_ = Releases(any_store, tmp_path / "scratch").release()
    invoke("policy", "init", "--from", str(_policies(tmp_path / "p", "release", release_key)),
           env=any_env)
    named = in_force(any_store).document.identities
    assert named.identities["release"].roles == ["release"]
    assert named.identities[ME].roles == list(SEEDED_ROLES)
    invoke("sign", tuple_.id, "--signing-key", str(release_key), env=any_env)
    w = tuple_.binding.weights
    invoke("sign", f"{w.repo_id}@{w.commit}", "--signing-key", str(release_key), env=any_env)
    verified = invoke("verify", "--signature", tuple_.id, "--channel", "production",
                      env=any_env)
    assert "release" in verified.stdout


def test_a_policy_directory_still_trusting_keys_the_old_way_is_refused_by_name(any_store,
                                                                              any_env,
                                                                              tmp_path):
    """A policy directory with signing/trusted-keys.yaml (a copy made before release keys
    were identities) is refused where it is read, naming where its keys go now."""
    Releases(any_store, tmp_path / "scratch").release()
    where = _policies(tmp_path / "p", "release", _key(tmp_path / "release.pem"))
    (where / "signing").mkdir()
    (where / "signing" / "trusted-keys.yaml").write_text("schema_version: 1\nkeys: {}\n")
    refused = invoke("policy", "propose", str(where), "--why", "old copy", expect=9,
                     env=any_env)
    assert "signing/trusted-keys.yaml" in refused.stderr
    assert "k3a key show --entry NAME --roles release" in refused.stderr
