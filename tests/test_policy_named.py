"""What a gate says about a file of the store's policy names the policy and the file inside it:
the gates read the policy document in memory, so there is no path on disk to name."""

from __future__ import annotations

from k3artifacts.policy.record import in_force
from tests.fixtures.moves import check_gate, use_policy


def test_a_signature_gate_reason_names_the_policy_version_and_its_file(store, releases,
                                                                         policies):
    release = releases.release()
    packaged = check_gate(store, release, "production", "signature")
    digest = in_force(store).digest[:12]
    assert not packaged.passed
    assert packaged.reason.startswith(
        f"the packaged policy ({digest}) signing/trusted-keys.yaml lists no trusted signing key")
    (policies / "signing" / "trusted-keys.yaml").write_text(
        "schema_version: 1\nkeys: {}\nchannels: {production: {required: true}}\n")
    policy = use_policy(store, policies)
    recorded = check_gate(store, release, "production", "signature")
    assert recorded.reason == (f"policy v{policy.version} ({policy.digest[:12]}) "
                               "signing/trusted-keys.yaml lists no trusted signing key for "
                               "channel production")
    assert "k3a-policy-" not in packaged.reason + recorded.reason


def test_a_bad_key_file_of_the_policy_in_force_is_named_in_it(store, releases, policies):
    """The gates read the policy's files in memory: a key file that is no key is named as the
    policy's file, never a path on disk."""
    (policies / "signing" / "keys").mkdir(parents=True, exist_ok=True)
    (policies / "signing" / "keys" / "release.pub.pem").write_text("not a key\n")
    (policies / "signing" / "trusted-keys.yaml").write_text(
        "schema_version: 1\nkeys: {release: keys/release.pub.pem}\n"
        "channels: {production: {required: true}}\n")
    policy = use_policy(store, policies)
    gate = check_gate(store, releases.release(), "production", "signature")
    assert not gate.passed and gate.reason.startswith(
        f"trusted key policy v{policy.version} ({policy.digest[:12]}) "
        "signing/keys/release.pub.pem: not a PEM public key")
