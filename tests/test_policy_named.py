"""What a gate says about a file of the store's policy names the policy and the file inside it,
never the temporary directory the judgement read it from (gone when anyone reads the reason)."""

from __future__ import annotations

import pytest

from k3artifacts.errors import ConfigError
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


def test_an_error_raised_during_a_judgement_names_the_policy_file(store):
    policy = in_force(store)
    with pytest.raises(ConfigError) as err, policy.document.written_to() as root:
        raise ConfigError(f"{root / 'signing' / 'trusted-keys.yaml'}: broken")
    assert str(err.value) == (f"the packaged policy ({policy.digest[:12]}) "
                              "signing/trusted-keys.yaml: broken")
