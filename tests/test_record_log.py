"""A record one member made, deleted by another member, is reported missing by name
(k3artifacts/releases/record_log.py), on a file store and on SeaweedFS: every record made for a
tuple is logged in the tuple's signed record log, so the gates, `k3a tuple show` and `k3a eval
list` name the record gone (its key, kind, signer, when: RecordMissing, exit 4, with a next
step) instead of reading it as never recorded; deleting its log entry too is refused as a
rewind by a client that saw it. The deletions are what anyone with write access to the store
does (`rm` on the tree, DeleteObject on S3), no k3a code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3artifacts.canonical import canonical_digest
from k3artifacts.policy.signed import store_id
from k3artifacts.releases.record_log import layout
from k3artifacts.releases.reviews import review_key
from k3artifacts.trust.chain import Link
from k3artifacts.trust.envelope import sign_record
from tests.fixtures.any_store import remove
from tests.fixtures.channel_moves import fresh_reader
from tests.fixtures.moves import use_policy
from tests.fixtures.people import key_file, signer_of
from tests.support.cli import invoke


def member(who: str, env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """`k3a` as ``who`` (an identity of the store's policy with every role), on this client."""
    return dict(env, K3A_IDENTITY_KEY=str(key_file(who, tmp_path)))


@pytest.fixture
def reviewed(any_store, any_env, any_releases, policies, tmp_path):
    """A tuple whose license and remote code alice reviewed with `k3a review`."""
    release = any_releases.release(code={"modeling_kimi.py": b"class Kimi: ...\n",
                                         "tokenization_kimi.py": b"class Tok: ...\n"})
    use_policy(any_store, policies)
    alice = member("alice", any_env, tmp_path)
    invoke("review", "license", release.id, env=alice)
    invoke("review", "code", release.id, env=alice)
    return release, alice


def names_missing(refused, key: str, kind: str, signer: str) -> None:
    assert refused.stderr.count(f"{key} ({kind} signed by {signer}, recorded ") == 1, \
        refused.stderr
    assert "missing from the store" in refused.stderr and "next:" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_honest_path_lists_every_record_and_passes(any_env, reviewed, tmp_path):
    release, alice = reviewed
    for env in (alice, fresh_reader(any_env, tmp_path)):
        shown = invoke("tuple", "show", release.id, "--json", env=env).json
        records = shown.pop("records")
        assert {(r["kind"], r["signed_by"]) for r in records} == {("review", "alice")}
        assert review_key("license", release.binding.license_sha256) in {
            r["key"] for r in records}
        assert len(records) == 3  # the license and each remote-code file
        invoke("gates", release.id, "staging", env=env)
    human = invoke("tuple", "show", release.id, env=alice).stdout
    assert f"record    {review_key('license', release.binding.license_sha256)} (review " \
           "signed by alice" in human


def test_a_review_another_member_deleted_is_named_missing(any_store, any_env, reviewed,
                                                          tmp_path):
    """bob removes alice's license review: the license gate does not say "not reviewed", and
    `k3a tuple show` names it, for this client and for one that never read the store."""
    release, alice = reviewed
    key = review_key("license", release.binding.license_sha256)
    remove(any_store, key)
    for env in (member("bob", any_env, tmp_path), fresh_reader(any_env, tmp_path)):
        for args in (["gates", release.id, "staging"], ["promote", release.id, "staging"],
                     ["tuple", "show", release.id]):
            names_missing(invoke(*args, env=env, expect=4), key, "review", "alice")
        refused = invoke("tuple", "show", release.id, "--json", env=env, expect=4).json
        assert refused["exit_code"] == 4 and key in refused["error"] and refused["next"]
    # Recording it again (the next step) restores what the log names.
    invoke("review", "license", release.id, env=alice)
    invoke("gates", release.id, "staging", env=alice)


def test_an_evaluation_another_member_deleted_is_named_missing(any_store, any_env, reviewed,
                                                               tmp_path):
    release, alice = reviewed
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"suite": "manual", "passed": 9, "total": 10}))
    attached = invoke("eval", "attach", release.id, str(report), "--json", env=alice).json
    key = f"releases/evaluations/{release.id}/{attached['record']['report_sha256']}.json"
    assert [r["attached_by"] for r in invoke("eval", "list", release.id, "--json",
                                             env=alice).json] == ["alice"]
    remove(any_store, key)
    bob = member("bob", any_env, tmp_path)
    for args in (["eval", "list", release.id], ["tuple", "show", release.id],
                 ["gates", release.id, "production"]):
        names_missing(invoke(*args, env=bob, expect=4), key, "evaluation", "alice")


def test_deleting_the_log_entry_too_is_a_rewind_for_a_client_that_saw_it(any_store, any_env,
                                                                         reviewed, tmp_path):
    """bob removes alice's license review, the log's entries from it on, and sets the log's
    head back to the entry before (or removes the log): alice's client, which verified the
    newer head, refuses the tuple's records as rewound."""
    release, alice = reviewed
    where = layout(release.id)
    invoke("tuple", "show", release.id, env=alice)  # this client verifies the head
    entries = any_store.list_keys(where.entries_prefix)
    assert len(entries) == 3
    newest = json.loads(any_store.read(entries[-1]).data)["body"]["entry"]["records"][-1]
    remove(any_store, newest["key"])
    remove(any_store, entries[-1])
    older = any_store.read(entries[-2]).data
    any_store.replace(where.pointer_key, older, any_store.read(where.pointer_key).token)
    for args in (["gates", release.id, "staging"], ["tuple", "show", release.id]):
        refused = invoke(*args, env=alice, expect=4)
        assert f"{where.pointer_key}: refused (rewound)" in refused.stderr, refused.stderr
        assert f"{where.name}: this client verified #{len(entries)}" in refused.stderr
    for key in any_store.list_keys(where.entries_prefix):
        remove(any_store, key)
    remove(any_store, where.pointer_key)
    refused = invoke("tuple", "show", release.id, env=alice, expect=4)
    assert "refused (rewound)" in refused.stderr and "no head" in refused.stderr


def test_a_log_entry_that_drops_a_record_is_refused(any_store, any_env, reviewed, tmp_path):
    """bob appends an entry, validly signed by him, whose list leaves out alice's license
    review, and removes the review: a client that never read the log refuses the entry."""
    release, _ = reviewed
    where = layout(release.id)
    head = json.loads(any_store.read(where.pointer_key).data)["body"]
    license_key = review_key("license", release.binding.license_sha256)
    kept = [r for r in head["entry"]["records"] if r["key"] != license_key]
    extra = {**kept[-1], "key": "releases/reviews/code/" + "0" * 64 + ".json"}
    link = Link(seq=head["seq"] + 1, previous=canonical_digest(head),
                entry={"tuple_id": release.id, "records": [*kept, extra]})
    forged = sign_record(key=where.entry_key(link.seq), kind=where.entry_kind, body=link,
                         signer=signer_of("bob"), identity="bob",
                         store_id=store_id(any_store))
    any_store.replace(where.pointer_key, forged, any_store.read(where.pointer_key).token)
    remove(any_store, license_key)
    refused = invoke("gates", release.id, "staging", env=fresh_reader(any_env, tmp_path),
                     expect=4)
    assert f"refused (edit): entry #{link.seq} of {where.name} does not keep every record" \
        in refused.stderr, refused.stderr


@pytest.mark.parametrize("signed_by", ["promote", "refresh"])
def test_a_fresh_client_is_held_to_the_log_head_the_freshness_head_names(
        any_store, any_env, reviewed, tmp_path, signed_by):
    """alice's promotion (she holds `freshness`), or `k3a trust refresh`, re-signs the store's
    freshness head naming the tuple's record log head; bob then deletes a review with its log
    entry and sets the log back: a client that never read the log refuses it too."""
    release, alice = reviewed
    where = layout(release.id)
    if signed_by == "promote":
        invoke("promote", release.id, "staging", env=alice)
    else:
        invoke("trust", "refresh", env=alice)
    named = json.loads(any_store.read("releases/trust/freshness.json").data)["body"]["records"]
    assert named[release.id]["seq"] == 3
    entries = any_store.list_keys(where.entries_prefix)
    newest = json.loads(any_store.read(entries[-1]).data)["body"]["entry"]["records"][-1]
    remove(any_store, newest["key"])
    remove(any_store, entries[-1])
    any_store.replace(where.pointer_key, any_store.read(entries[-2]).data,
                      any_store.read(where.pointer_key).token)
    refused = invoke("gates", release.id, "staging", env=fresh_reader(any_env, tmp_path),
                     expect=4)
    assert f"{where.pointer_key}: refused (rewound): {where.name}: this client verified #3 " \
        in refused.stderr, refused.stderr
    assert "in the store's signed freshness head" in refused.stderr


def test_a_refresh_refuses_a_log_whose_pointer_was_removed(any_store, any_env, reviewed):
    """bob removes the pointer of the tuple's record log, its entries left: `k3a trust refresh`
    names that log refused instead of leaving it out of the heads it verifies."""
    release, alice = reviewed
    where = layout(release.id)
    remove(any_store, where.pointer_key)
    refused = invoke("trust", "refresh", env=alice, expect=4)
    assert f"{where.pointer_key}: refused (rewound): {where.name} has no head, but its log " \
           "holds entries" in refused.stderr, refused.stderr
