"""Identities and roles in the store's policy (``identities.yaml``, carried by the policy
document): parsed and refused like every policy file, and what a change to them loosens."""

from __future__ import annotations

import shutil

import pytest

from k3artifacts.bundled import POLICIES
from k3artifacts.errors import ConfigError
from k3artifacts.policy.document import IDENTITIES_FILE, PolicyDocument
from k3artifacts.trust.identities import (
    SEEDED_ROLES,
    Identities,
    Identity,
    KeyEntry,
    identities_yaml,
    loosening,
    parse_identities,
    seeded,
)
from tests.trust_helpers import identities, signer

ALICE, BOB = signer(), signer("ecdsa-p256")


@pytest.fixture
def policies(tmp_path):
    return shutil.copytree(POLICIES, tmp_path / "policies")


def test_the_packaged_policy_names_nobody_and_a_document_carries_its_identities(policies):
    packaged = PolicyDocument.from_dir(POLICIES)
    assert IDENTITIES_FILE in packaged.files and packaged.identities.identities == {}
    (policies / IDENTITIES_FILE).write_text(identities_yaml(seeded("alice",
                                                                   KeyEntry.for_signer(ALICE))))
    document = PolicyDocument.from_dir(policies)
    # Every role but release: a release key is an identity of its own, added by a change.
    assert document.identities.identities["alice"].roles == list(SEEDED_ROLES)
    assert document.digest != packaged.digest
    # A document without the file (stored before identities existed) names nobody.
    older = PolicyDocument.parse_files(
        {k: v for k, v in packaged.files.items() if k != IDENTITIES_FILE}, where="test")
    assert older.identities == Identities()


PEM = '"' + KeyEntry.for_signer(ALICE).pem.replace("\n", "\\n") + '"'


@pytest.mark.parametrize("text, why", [
    ("identities: {alice: {roles: [review], keys: []}}", "at least 1 item"),
    (f"identities: {{alice: {{roles: [deploy], keys: [{{pem: {PEM}}}]}}}}", "review"),
    ("identities: {alice: {keys: [{pem: not-a-key}]}}", "not a usable PEM public key"),
    (f"identities: {{'bad name': {{keys: [{{pem: {PEM}}}]}}}}", "not an identity name"),
    ("identities: [", "not valid YAML"),
])
def test_a_malformed_identities_file_is_refused_naming_it(policies, text, why):
    (policies / IDENTITIES_FILE).write_text(text)
    with pytest.raises(ConfigError, match="identities.yaml"):
        PolicyDocument.from_dir(policies)
    with pytest.raises(ConfigError, match="here") as caught:
        parse_identities(text, where="here")
    assert why in str(caught.value)


def test_one_key_is_one_identity():
    entry = KeyEntry.for_signer(ALICE)
    with pytest.raises(ValueError, match="one key is one identity"):
        Identities(identities={"alice": Identity(keys=[entry]), "also-alice": Identity(
            keys=[entry])})


def test_adding_an_identity_a_key_or_a_role_loosens_and_removing_does_not():
    before = identities(alice=(ALICE, ["review", "promote"]))
    after = identities(alice=(ALICE, ["review", "promote", "approve"]), bob=(BOB, ["review"]))
    assert loosening(before, after) == ["lets alice sign approve",
                                        "trusts a new identity bob (review)"]
    assert loosening(after, before) == []
    rekeyed = Identities(identities={"alice": Identity(
        roles=["review", "promote"], keys=[KeyEntry.for_signer(ALICE), KeyEntry.for_signer(BOB)])})
    assert loosening(before, rekeyed) == [
        f"trusts a new key {KeyEntry.for_signer(BOB).id[:16]} for alice"]
    assert parse_identities(identities_yaml(after), where="round trip") == after
