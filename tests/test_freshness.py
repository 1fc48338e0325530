"""The store's signed freshness head (k3artifacts/policy/freshness.py), on a file store and on
SeaweedFS: re-signed by every move and by `k3a trust refresh`, it bounds a frozen or restored
copy of the store for every reader, a fresh one included: once older than the lifetime the
store's policy sets, the store is refused by name; a history set back behind the heads it names
is refused by a client that never read the store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from k3artifacts.policy.freshness import KEY, KIND, Freshness
from k3artifacts.policy.loosening import loosening
from k3artifacts.policy.record import in_force
from k3artifacts.policy.signed import store_id
from k3artifacts.releases.channels import history_key, pointer_key
from k3artifacts.trust.envelope import parse_record, sign_record
from tests.fixtures import people
from tests.fixtures.any_store import overwrite, remove
from tests.fixtures.channel_moves import CHANNEL, fresh_reader
from tests.support.cli import invoke

LIFETIME = timedelta(hours=168)  # the packaged policy's


def _freshness(any_store) -> Freshness:
    return Freshness.model_validate(parse_record(any_store.read(KEY).data, key=KEY).body)


def _readers(env, served, tmp_path, expect: int, *, policy: bool = True) -> list[str]:
    third = served[-1]
    errs = []
    for args in (["render", CHANNEL, "--target", "eks"],
                 ["pull", CHANNEL, "--to", str(tmp_path / "node-cache")],
                 ["history", CHANNEL], *([["policy", "show"]] if policy else []),
                 ["gates", third.id, CHANNEL], ["rollback", CHANNEL]):
        done = invoke(*args, expect=expect, env=env)
        assert "Traceback" not in done.stderr, (args, done.stderr)
        errs.append(done.stderr)
    return errs


def test_every_move_re_signs_it_naming_the_heads_it_made(any_store, served):
    fresh = _freshness(any_store)
    policy = in_force(any_store)
    assert fresh.channels[CHANNEL].seq == 3 and fresh.policy.seq == policy.version
    assert fresh.expires - fresh.issued_at == LIFETIME


def test_a_frozen_store_is_refused_once_its_freshness_expired_until_refreshed(
        any_store, any_env, served, tmp_path):
    """The store as it was, read a week and an hour later (``K3A_NOW``): every reader, this
    client and a fresh one alike, refuses it by name with the next step; a root identity's
    refresh makes it readable again."""
    later = _freshness(any_store).issued_at + LIFETIME + timedelta(hours=1)
    stale = dict(any_env, K3A_NOW=later.isoformat())
    for env in (stale, fresh_reader(stale, tmp_path)):
        for err in _readers(env, served, tmp_path, expect=4):
            assert "signed freshness head expired at" in err and "frozen or restored" in err
            assert "k3a trust refresh" in err
    refreshed = invoke("trust", "refresh", "--json", env=stale).json
    assert refreshed["channels"][CHANNEL]["seq"] == 3
    assert datetime.fromisoformat(refreshed["expires"]) == later + LIFETIME
    invoke("render", CHANNEL, "--target", "eks", env=stale)


def test_a_rewound_channel_is_refused_by_a_client_that_never_read_it(any_store, any_env, served,
                                                                    tmp_path):
    """Entry #3 deleted and #2 copied over the pointer: a client with no remembered head
    compares with the heads the freshness head names."""
    remove(any_store, history_key(CHANNEL, 3))
    overwrite(any_store, pointer_key(CHANNEL), any_store.read(history_key(CHANNEL, 2)).data)
    for err in _readers(fresh_reader(any_env, tmp_path), served, tmp_path, expect=4,
                        policy=False):
        assert "refused (rewound): channel staging: this client verified #3 (" in err
        assert "in the store's signed freshness head" in err


def test_a_freshness_head_signed_by_a_key_the_policy_does_not_trust_is_refused(
        any_store, any_env, served, tmp_path):
    """One signed by a stranger, extending a frozen copy's life: refused, never a pass."""
    body = _freshness(any_store).model_copy(
        update={"expires": datetime.now(UTC) + timedelta(days=3650)}).model_dump(mode="json")
    overwrite(any_store, KEY, sign_record(key=KEY, kind=KIND, body=body,
                                          signer=people.signer_of("mallory"), identity="ci",
                                          store_id=store_id(any_store)))
    for err in _readers(any_env, served, tmp_path, expect=4):
        assert f"{KEY}: refused (untrusted-key)" in err


def test_a_longer_lifetime_loosens_a_shorter_one_does_not(policies):
    from tests.fixtures.moves import with_people

    document = with_people(policies)
    text = document.files["promotion-gates.yaml"]
    longer = document.with_file("promotion-gates.yaml",
                                text.replace("lifetime_hours: 168", "lifetime_hours: 720"))
    shorter = document.with_file("promotion-gates.yaml",
                                 text.replace("lifetime_hours: 168", "lifetime_hours: 24"))
    assert loosening(document, longer) == [
        "changes freshness.lifetime_hours (168.0 -> 720.0)"]
    assert loosening(document, shorter) == []
