"""What a gate says about a file of the store's policy names the policy and the file inside it:
the gates read the policy document in memory, so there is no path on disk to name."""

from __future__ import annotations

import pytest

from k3artifacts.errors import MigrationNeeded
from k3artifacts.policy.record import in_force
from k3artifacts.policy.signing_keys import release_keys
from tests.fixtures.moves import (
    check_gate,
    seed_people,
    trust_release_keys,
    use_policy,
    with_people,
)


def test_a_signature_gate_reason_names_the_policy_version_and_its_file(store, releases,
                                                                         policies):
    release = releases.release()
    packaged = check_gate(store, release, "production", "signature")
    digest = in_force(store).digest[:12]
    assert not packaged.passed
    assert packaged.reason.startswith(
        f"the packaged policy ({digest}) identities.yaml names no identity holding the release "
        "role for channel production")
    trust_release_keys(policies, {})
    policy = use_policy(store, policies)
    recorded = check_gate(store, release, "production", "signature")
    assert recorded.reason == (f"policy v{policy.version} ({policy.digest[:12]}) "
                               "identities.yaml names no identity holding the release role for "
                               "channel production with an ECDSA key")
    assert "k3a-policy-" not in packaged.reason + recorded.reason


def test_a_policy_still_trusting_keys_the_old_way_is_named_with_its_migration(store, releases,
                                                                              policies):
    """A policy in force that still carries signing/trusted-keys.yaml (signed into force
    before release keys were identities): no reader takes its keys; the gate names the policy,
    the file and `k3a trust migrate`."""
    document = with_people(policies).with_file(
        "signing/trusted-keys.yaml", "schema_version: 1\nkeys: {}\n")
    policy = seed_people(store, document)
    gate = check_gate(store, releases.release(), "production", "signature")
    assert not gate.passed and gate.reason.startswith(
        f"policy v{policy.version} ({policy.digest[:12]}) still trusts release keys by "
        "signing/trusted-keys.yaml")
    with pytest.raises(MigrationNeeded, match="signing/trusted-keys.yaml") as refused:
        release_keys(store)  # what `k3a verify --signature` and a pod's render read
    assert "k3a trust migrate" in refused.value.hint
