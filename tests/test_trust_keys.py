"""The keys that sign records (k3artifacts/trust/keys.py), each kind for real: PEM files
(ed25519, ECDSA P-256 and P-384), the personal key made on first use, an AWS KMS key on the
moto server (RAW signing, checked outside KMS with its exported public key) and a key in a
SoftHSM token through PKCS#11."""

from __future__ import annotations

import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization

from k3artifacts.errors import ConfigError, NotFound, UntrustedRecord
from k3artifacts.signing.keys import Pkcs11Signer
from k3artifacts.trust.envelope import MAX_KEY, Bound, sign_record, verify_record
from k3artifacts.trust.identities import Identities, Identity, KeyEntry
from k3artifacts.trust.keys import (
    KmsSigner,
    identity_signer,
    key_id,
    personal_key_path,
)
from tests.support.cli import run_process
from tests.trust_helpers import identities, signer

KEY = "releases/evaluations/k3t-0123456789abcdef01234567/report.json"
BODY = {"pass_rate": 0.97}


@pytest.fixture(autouse=True)
def config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("K3A_IDENTITY_KEY", raising=False)
    monkeypatch.delenv("K3A_IDENTITY_KEY_PASSWORD", raising=False)
    return tmp_path / "config"


def round_trip(key_signer, name="eval-ci", roles=("evaluate",)):
    policy = Identities(identities={name: Identity(roles=list(roles),
                                                   keys=[KeyEntry.for_signer(key_signer)])})
    data = sign_record(key=KEY, kind="evaluation", body=BODY, signer=key_signer, identity=name,
                       store_id=None)
    return verify_record(data, key=KEY, kind="evaluation", keyring=policy.keyring(),
                         roles=["evaluate"], bound=Bound(None))


def write_key(path, private_key, mode=0o600, password=None):
    encryption = (serialization.BestAvailableEncryption(password) if password
                  else serialization.NoEncryption())
    path.write_bytes(private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    path.chmod(mode)
    return path


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa-p256", "ecdsa-p384"])
def test_a_pem_key_file_signs_records_its_identity_verifies(kind, tmp_path, monkeypatch):
    path = write_key(tmp_path / "me.pem", signer(kind).private_key)
    monkeypatch.setenv("K3A_IDENTITY_KEY", str(path))
    mine = identity_signer(create=True)
    assert not mine.created and mine.signer.source == str(path)
    assert round_trip(mine.signer).signers == {"eval-ci"}
    # The same record is refused by a policy that names another key for that identity.
    policy = identities(**{"eval-ci": (signer(kind), ["evaluate"])})
    data = sign_record(key=KEY, kind="evaluation", body=BODY, signer=mine.signer,
                       identity="eval-ci", store_id=None)
    with pytest.raises(UntrustedRecord, match="untrusted-key"):
        verify_record(data, key=KEY, kind="evaluation", keyring=policy.keyring(),
                      roles=["evaluate"], bound=Bound(None))


def test_the_personal_key_is_made_on_first_use_private_and_said_where(k3a_cmd, k3a_env):
    def k3a(*args, expect=0):
        return run_process(*args, env=k3a_env, cmd=k3a_cmd, expect=expect)

    shown = k3a("key", "show", expect=7)
    assert "k3a key create" in shown.stderr
    made = k3a("key", "create")
    keys = os.path.join(k3a_env["XDG_CONFIG_HOME"], "k3artifacts", "keys")
    assert f"Your identity key has been saved in {keys}/personal.pem" in made.stdout
    assert f"Your public key has been saved in {keys}/personal.pub.pem" in made.stdout
    modes = {name: stat.S_IMODE(os.stat(os.path.join(keys, name)).st_mode)
             for name in ("", "personal.pem", "personal.pub.pem")}
    assert modes == {"": 0o700, "personal.pem": 0o600, "personal.pub.pem": 0o644}
    view = k3a("key", "show", "--json").json
    public = open(os.path.join(keys, "personal.pub.pem")).read()
    assert (view["kind"], view["public_key"]) == ("ed25519", public)
    assert view["key_id"] in made.stdout and view["entry"] == {"pem": public}
    again = k3a("key", "create", "--json", expect=6)
    assert again.json["exit_code"] == 6


def test_a_process_that_signs_makes_the_personal_key_once(config_home):
    first = identity_signer(create=True)
    assert first.created and first.signer.source == str(personal_key_path())
    assert str(personal_key_path()).startswith(str(config_home))
    second = identity_signer(create=True)
    assert not second.created
    assert key_id(second.signer.public_key) == key_id(first.signer.public_key)


def test_a_key_file_others_can_read_or_that_is_not_a_signing_key_is_refused(tmp_path,
                                                                             monkeypatch):
    path = write_key(tmp_path / "open.pem", signer().private_key, mode=0o644)
    monkeypatch.setenv("K3A_IDENTITY_KEY", str(path))
    with pytest.raises(ConfigError, match="can be read or written by other accounts"):
        identity_signer(create=False)
    path.chmod(0o600)
    identity_signer(create=False)
    path.write_text("not a key")
    with pytest.raises(ConfigError, match="not a usable PEM private key"):
        identity_signer(create=False)
    monkeypatch.setenv("K3A_IDENTITY_KEY", str(tmp_path / "absent.pem"))
    with pytest.raises(NotFound, match="no identity key"):
        identity_signer(create=True)


def test_an_encrypted_key_file_takes_its_passphrase(tmp_path, monkeypatch):
    path = write_key(tmp_path / "locked.pem", signer("ecdsa-p256").private_key,
                     password=b"correct horse")
    monkeypatch.setenv("K3A_IDENTITY_KEY", str(path))
    with pytest.raises(ConfigError, match="encrypted") as caught:
        identity_signer(create=False)
    assert "K3A_IDENTITY_KEY_PASSWORD" in caught.value.hint
    monkeypatch.setenv("K3A_IDENTITY_KEY_PASSWORD", "correct horse")
    assert round_trip(identity_signer(create=False).signer).signer == "eval-ci"


@pytest.fixture
def kms(moto_endpoint, monkeypatch):
    """A KMS client on the moto server; k3a's KMS signer pointed at it."""
    import boto3

    monkeypatch.setenv("K3A_KMS_ENDPOINT_URL", moto_endpoint)
    return boto3.client("kms", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.mark.s3
def test_a_kms_key_signs_raw_and_verifies_outside_kms(kms, monkeypatch):
    meta = kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]
    kms.create_alias(AliasName="alias/k3a-eval", TargetKeyId=meta["Arn"])
    monkeypatch.setenv("K3A_IDENTITY_KEY", "kms:alias/k3a-eval")
    mine = identity_signer(create=True).signer
    # The key as GetPublicKey names it: its ARN on AWS, its id on moto.
    assert isinstance(mine, KmsSigner) and mine.arn in (meta["Arn"], meta["KeyId"])
    entry = KeyEntry.for_signer(mine)
    assert entry.kms == mine.arn and entry.pem.startswith("-----BEGIN PUBLIC KEY-----")
    assert mine.source == f"kms:{mine.arn}"
    # Verified with the public key alone, as every reader does: KMS is not asked again.
    assert round_trip(mine).signers == {"eval-ci"}
    # The largest statement k3a signs (longest store key, longest identity name) fits KMS RAW.
    longest, name = "k/" + "a" * (MAX_KEY - 2), "n" * 128
    # ... for a store with an id (a root's: 32 hex).
    data = sign_record(key=longest, kind="evaluation", body={"blob": "x" * 100_000}, signer=mine,
                       identity=name, store_id="f" * 32)
    policy = Identities(identities={name: Identity(keys=[entry])})
    assert verify_record(data, key=longest, kind="evaluation", keyring=policy.keyring(),
                         roles=None, bound=Bound("f" * 32)).signer == name


@pytest.mark.s3
def test_a_kms_key_of_another_kind_is_refused(kms, monkeypatch):
    arn = kms.create_key(KeySpec="ECC_NIST_P384", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
    monkeypatch.setenv("K3A_IDENTITY_KEY", f"kms:{arn}")
    with pytest.raises(ConfigError, match="ECC_NIST_P384 for SIGN_VERIFY, not ECC_NIST_P256"):
        identity_signer(create=False)
    monkeypatch.setenv("K3A_IDENTITY_KEY", "kms:alias/none")
    with pytest.raises(NotFound, match="KMS GetPublicKey of alias/none"):
        identity_signer(create=False)


def test_a_pkcs11_key_signs_records_inside_its_token(softhsm_uri, monkeypatch):
    uri, pem = softhsm_uri
    monkeypatch.setenv("K3A_IDENTITY_KEY", uri)
    mine = identity_signer(create=False).signer
    assert isinstance(mine, Pkcs11Signer) and "1234" not in mine.source
    entry = KeyEntry.for_signer(mine)
    assert entry.pem == pem.decode() and entry.pkcs11 == mine.source
    assert round_trip(mine).signers == {"eval-ci"}
    with pytest.raises(ValueError, match="must not carry a PIN"):
        KeyEntry(pem=entry.pem, pkcs11=uri)
