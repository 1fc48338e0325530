"""The root of trust (k3artifacts/trust/root.py, pins.py, enrol.py, rotation.py): pinned per
client outside the store, rotated only under the old root's threshold, and refused when the
client's copy could have been written by another account or disagrees with the store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import (
    ConfigError,
    HistoryRewound,
    TrustRootError,
    UntrustedRecord,
    UsageError,
)
from k3artifacts.stores.file import FileStore
from k3artifacts.trust import enrol, rotation
from k3artifacts.trust.chain import Mark
from k3artifacts.trust.envelope import add_signature
from k3artifacts.trust.heads import heads_path, remember, seen
from k3artifacts.trust.identities import KeyEntry
from k3artifacts.trust.pins import (
    config_map_files,
    follow,
    load_pin,
    pin_path,
    require_pin,
)
from k3artifacts.trust.root import (
    first_root,
    next_root,
    proposal_key,
    root_key,
    sign_root,
    verify_root_rotation,
)
from tests.fixtures.any_store import remove
from tests.support.cli import run_process
from tests.trust_helpers import signer

ALICE, BOB, CAROL, MALLORY = signer(), signer("ecdsa-p256"), signer(), signer()


def keys(**people):
    return {name: [KeyEntry.for_signer(s)] for name, s in people.items()}


@pytest.fixture
def store(tmp_path):
    (tmp_path / "store").mkdir()
    return FileStore(tmp_path / "store")


@pytest.fixture
def client(tmp_path, monkeypatch):
    """Switch this process to the configuration of a named client (each its own XDG dir)."""
    def use(name: str) -> Path:
        home = tmp_path / "clients" / name
        monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
        return home
    use("alice")
    return use


def refused(reason: str, call, *args, **kwargs) -> UntrustedRecord:
    with pytest.raises(UntrustedRecord) as caught:
        call(*args, **kwargs)
    assert caught.value.reason == reason, str(caught.value)
    return caught.value


def test_first_use_pins_the_seeder_and_publishes_the_root_for_others(store, client):
    pin, changed = enrol.first_use(store, ALICE, "alice")
    assert changed and pin.how == "first-use" and pin.root.version == 1
    assert (pin.root.threshold, list(pin.root.identities)) == (1, ["alice"])
    assert require_pin(store.url) == pin == load_pin(store.url)
    assert enrol.first_use(store, ALICE, "alice") == (pin, False)
    # Nobody else takes the store over by first use, not even on a fresh client.
    client("mallory")
    with pytest.raises(TrustRootError, match="already has a root of trust"):
        enrol.first_use(store, MALLORY, "mallory")
    with pytest.raises(TrustRootError, match="pins no root of trust"):
        require_pin(store.url)
    # Pinned by its fingerprint, given out of band, and by nothing else.
    refused("root-mismatch", enrol.join, store, "0" * 64)
    joined, _ = enrol.join(store, pin.root.fingerprint)
    assert joined.root == pin.root and joined.how == "fingerprint"


def test_a_rotation_signed_under_the_old_root_is_followed_by_every_client(store, client):
    pin, _ = enrol.first_use(store, ALICE, "alice")
    client("bob")
    enrol.join(store, pin.root.fingerprint)
    client("alice")
    done = rotation.rotate(store, pin, ALICE, add=keys(bob=BOB), remove=[], threshold=None)
    # One identity's root needs one signature: published at once, threshold now two.
    assert done.published and done.root.version == 2 and done.root.threshold == 2
    assert done.pin.root == done.root == load_pin(store.url).root
    client("bob")
    followed, changed = follow(store, require_pin(store.url))
    assert changed and followed.root == done.root and followed.how == "rotation"


def test_a_rotation_short_of_the_threshold_waits_for_a_cosigner(store, client):
    pin, _ = enrol.first_use(store, ALICE, "alice")
    pin = rotation.rotate(store, pin, ALICE, add=keys(bob=BOB), remove=[], threshold=None).pin
    proposed = rotation.rotate(store, pin, ALICE, add=keys(carol=CAROL), remove=[],
                               threshold=None)
    assert not proposed.published and proposed.key == proposal_key(3)
    assert store.read(root_key(3)) is None and follow(store, pin) == (pin, False)
    # A cosigner signs only the proposal they were shown.
    refused("root-mismatch", rotation.cosign, store, pin, BOB, "f" * 64)
    with pytest.raises(ConfigError, match="not one of root v2's identities"):
        rotation.cosign(store, pin, CAROL, proposed.root.fingerprint)
    done = rotation.cosign(store, pin, BOB, proposed.root.fingerprint)
    assert done.published and done.signers == {"alice", "bob"}
    assert set(load_pin(store.url).root.identities) == {"alice", "bob", "carol"}


def test_a_rotation_not_signed_by_the_threshold_is_refused(store, client):
    pin, _ = enrol.first_use(store, ALICE, "alice")
    pin = rotation.rotate(store, pin, ALICE, add=keys(bob=BOB), remove=[], threshold=None).pin
    v2 = pin.root
    # Written straight into the store with one of two signatures: every reader refuses it.
    alone = next_root(v2, remove=["bob"])
    store.create(root_key(3), sign_root(alone, ALICE, "alice"))
    refused("threshold", follow, store, pin)
    refused("threshold", verify_root_rotation, v2, sign_root(alone, ALICE, "alice"))
    # Signed by keys the old root does not hold, or following another root.
    refused("untrusted-key", verify_root_rotation, v2, sign_root(alone, MALLORY, "alice"))
    elsewhere = next_root(next_root(first_root(keys(alice=ALICE)), add=keys(carol=CAROL)),
                          add=keys(bob=BOB))
    both = add_signature(sign_root(elsewhere, ALICE, "alice"), key=root_key(3), signer=BOB)
    refused("root-mismatch", verify_root_rotation, v2, both)
    assert verify_root_rotation(v2, add_signature(sign_root(alone, ALICE, "alice"),
                                                  key=root_key(3), signer=BOB))[0] == alone


def test_a_root_pinned_differently_from_the_stores_is_refused(store, client):
    enrol.first_use(store, ALICE, "alice")
    client("bob")
    team = first_root(keys(bob=BOB, carol=CAROL))
    err = refused("root-mismatch", enrol.pin_keys, store, team, None)
    assert "the store's root v1" in str(err)
    assert load_pin(store.url) is None  # nothing pinned
    # A client pinning one root is never moved to another by pinning again (here the keys of
    # a team, pinned before the store has any root).
    fresh = FileStore(store.root.parent / "fresh")
    enrol.pin_keys(fresh, team, None)
    with pytest.raises(TrustRootError, match="already pins root v1"):
        enrol.pin_keys(fresh, first_root(keys(carol=CAROL)), None)
    assert load_pin(fresh.url).root == team


def test_a_team_pins_its_keys_before_first_use_and_publishes_them(store, client):
    team = first_root(keys(alice=ALICE, bob=BOB))
    assert team.threshold == 2
    pin, changed = enrol.pin_keys(store, team, ALICE)
    assert changed and pin.how == "init" and store.read(root_key(1)) is not None
    client("bob")
    assert enrol.pin_keys(store, team, BOB)[0].root == team  # the same root, published once
    client("carol")
    assert enrol.join(store, team.fingerprint)[0].root == team


def test_a_root_needs_two_identities_for_a_change_that_is_not_provably_stricter():
    with pytest.raises(UsageError, match="at least 2"):
        first_root(keys(alice=ALICE, bob=BOB), threshold=1)
    with pytest.raises(UsageError, match="could never be met"):
        first_root(keys(alice=ALICE), threshold=2)
    with pytest.raises(UsageError, match="one key is one identity"):
        first_root({"alice": [KeyEntry.for_signer(ALICE)], "bob": [KeyEntry.for_signer(ALICE)]})
    root = first_root(keys(alice=ALICE, bob=BOB, carol=CAROL))
    assert root.authorize(frozenset({"alice"}), stricter=True, key="k") == {"alice"}
    refused("threshold", root.authorize, frozenset({"alice", "mallory"}), stricter=False, key="k")
    assert root.authorize(frozenset({"alice", "carol"}), stricter=False, key="k") == {"alice",
                                                                                     "carol"}


def _pin_file(store, client) -> Path:
    enrol.first_use(store, ALICE, "alice")
    return pin_path(store.url)


@pytest.mark.parametrize("spoil, why", [
    (lambda p: p.chmod(0o666), "can be written by other accounts"),
    (lambda p: p.parent.chmod(0o777), "can be written by other accounts"),
    (lambda p: os.chown(p, 54321, -1), "belongs to uid 54321"),
    (lambda p: p.write_text("{"), "malformed"),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "store": "file:///x"})),
     "is for file:///x"),
])


def test_a_pin_another_account_could_write_or_that_does_not_parse_is_refused(
        store, client, spoil, why):
    path = _pin_file(store, client)
    if "belongs" in why and os.getuid() != 0:
        pytest.skip("giving a file to another uid needs root")
    spoil(path)
    with pytest.raises(TrustRootError, match=why):
        require_pin(store.url)


def test_the_pin_renders_as_configmap_data_a_verifier_loads(store, client):
    pin, _ = enrol.first_use(store, ALICE, "alice")
    (name, text), = config_map_files(pin).items()
    # As a ConfigMap volume lays it out: a file owned by root, read-only, behind links.
    mounted = client("pod") / "k3artifacts" / "trust"
    (mounted / "..data").mkdir(parents=True)
    (mounted / "..data" / name).write_text(text)
    (mounted / "..data" / name).chmod(0o444)
    (mounted / name).symlink_to(Path("..data") / name)
    assert load_pin(store.url) == pin


def accounts(store: Path, k3a_cmd, k3a_env, tmp_path: Path):
    """A new file store at ``store``, and `k3a ARGS --json` on it as ``who`` (their own
    configuration, so their own key): ``k3a(who, *args, code=0)``, its JSON document."""
    store.mkdir()
    env = {**k3a_env, "K3A_STORE": f"file://{store}"}

    def k3a(who: str, *args: str, code: int = 0) -> dict:
        return run_process(*args, "--json", env={**env, "XDG_CONFIG_HOME": str(tmp_path / who)},
                           cmd=k3a_cmd, expect=code).json

    return k3a


def test_the_cli_walks_first_use_a_second_account_joining_and_a_cosigned_rotation(
        k3a_cmd, k3a_env, tmp_path):
    store = tmp_path / "store"
    k3a = accounts(store, k3a_cmd, k3a_env, tmp_path)

    first = k3a("alice", "trust", "init", "--name", "alice")
    fingerprint = first["root"]["fingerprint"]
    assert first["how"] == "first-use" and first["root"]["threshold"] == 1
    assert k3a("bob", "trust", "show", code=9)["exit_code"] == 9
    bob_key = k3a("bob", "key", "create")["public_path"]
    assert k3a("bob", "trust", "init", "--fingerprint", "0" * 64, code=4)["exit_code"] == 4
    assert k3a("bob", "trust", "init", "--fingerprint", fingerprint)["how"] == "fingerprint"
    added = k3a("alice", "trust", "rotate", "--add", f"bob={bob_key}")
    assert added["published"] and added["root"]["threshold"] == 2
    assert k3a("bob", "trust", "show")["root"]["version"] == 2
    carol_key = k3a("carol", "key", "create")["public_path"]
    proposed = k3a("alice", "trust", "rotate", "--add", f"carol={carol_key}")
    assert not proposed["published"] and proposed["signed_by"] == ["alice"]
    assert k3a("carol", "trust", "init", "--fingerprint", fingerprint)["root"]["version"] == 2
    assert k3a("carol", "trust", "rotate", "--cosign", proposed["root"]["fingerprint"],
               code=9)["exit_code"] == 9  # carol is not a root identity of v2 yet
    done = k3a("bob", "trust", "rotate", "--cosign", proposed["root"]["fingerprint"])
    assert done["published"] and done["signed_by"] == ["alice", "bob"]
    shown = k3a("alice", "trust", "show")
    assert shown["changed"] and sorted(shown["root"]["identities"]) == ["alice", "bob", "carol"]
    assert list(shown["config_map"]) == [Path(shown["pin"]).name]
    assert k3a("alice", "trust", "rotate", code=2)["exit_code"] == 2
    # A stored root a client pins differently: refused by name, exit 4.
    pinned = tmp_path / "alice" / "k3artifacts" / "trust" / Path(shown["pin"]).name
    record = json.loads((store / "releases/trust/root/0000000003.json").read_text())
    record["body"]["threshold"] = 3
    (store / "releases/trust/root/0000000003.json").write_bytes(canonical_json(record))
    assert pinned.exists()
    assert "root-mismatch" in k3a("alice", "trust", "show", code=4)["error"]


def test_a_proposal_signed_before_a_root_rotation_is_exit_6_as_the_docs_say(
        k3a_cmd, k3a_env, tmp_path):
    """The issue's case: a policy change alice proposed (and signed) under root v1, applied
    after the root rotated to v2, was refused as "tampered" (exit 4); docs/reference/
    exit-codes.md and docs/policy-and-identity.md say a proposal whose root rotated since is
    a lost race (exit 6): propose again. Proposed again, it applies."""
    k3a = accounts(tmp_path / "store", k3a_cmd, k3a_env, tmp_path)

    k3a("alice", "policy", "init")
    fingerprint = k3a("alice", "trust", "show")["root"]["fingerprint"]
    policies = tmp_path / "policies"
    k3a("alice", "policy", "show", "--out", str(policies))
    gates = policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace("  keep: 2\n", "  keep: 3\n"))
    stale = k3a("alice", "policy", "propose", str(policies), "--why", "keep three")["id"]
    bob_key = k3a("bob", "key", "create")["public_path"]
    k3a("bob", "trust", "init", "--fingerprint", fingerprint)
    assert k3a("alice", "trust", "rotate", "--add", f"bob={bob_key}")["published"]

    refused = k3a("alice", "policy", "apply", stale, code=6)
    assert refused["exit_code"] == 6
    assert refused["error"] == (f"{stale} was signed under root v1; the root rotated to v2 "
                                "since; nothing was written")
    assert "propose the change again" in refused["next"]
    again = k3a("alice", "policy", "propose", str(policies), "--why", "keep three")["id"]
    assert k3a("alice", "policy", "apply", again)["version"] == 2


def test_a_root_rotation_deleted_from_the_store_is_refused_by_a_client_that_followed_it(
        any_store, client):
    """Root v2 removed from the store (a restored copy from before the rotation), on a file
    store and on S3: a client pinning v2 refuses it, naming both heads; one that never saw v2
    reads v1 as before."""
    store = any_store
    pin, _ = enrol.first_use(store, ALICE, "alice")
    client("bob")
    enrol.join(store, pin.root.fingerprint)
    client("alice")
    done = rotation.rotate(store, pin, ALICE, add=keys(bob=BOB), remove=[], threshold=None)
    remove(store, root_key(2))
    caught = refused("rewound", follow, store, require_pin(store.url))
    assert isinstance(caught, HistoryRewound)
    assert f"the store's root: this client verified v2 ({done.root.fingerprint[:12]})" \
        in str(caught)
    client("bob")
    assert follow(store, require_pin(store.url))[0].root == pin.root


@pytest.mark.parametrize("spoil, why", [
    (lambda p: p.chmod(0o666), "can be written by other accounts"),
    (lambda p: os.chown(p, 54321, -1), "belongs to uid 54321"),
    (lambda p: p.write_text("{"), "malformed"),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "store": "file:///x"})),
     "are for file:///x"),
])


def test_remembered_heads_another_account_could_write_or_that_do_not_parse_are_refused(
        store, client, spoil, why):
    """Whoever could write them could make this client forget what it verified."""
    enrol.first_use(store, ALICE, "alice")
    remember(store.url, "channel staging", Mark(3, "a" * 64))
    path = heads_path(store.url)
    assert path.stat().st_mode & 0o777 == 0o644 and seen(store.url, "channel staging").seq == 3
    remember(store.url, "channel staging", Mark(2, "b" * 64))  # a head only moves forward
    assert seen(store.url, "channel staging") == Mark(3, "a" * 64)
    if "belongs" in why and os.getuid() != 0:
        pytest.skip("giving a file to another uid needs root")
    spoil(path)
    with pytest.raises(TrustRootError, match=why):
        seen(store.url, "channel staging")
