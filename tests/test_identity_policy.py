"""Who acts and what judges: identity nobody can type, the store's policy, its recorded
changes, and channel pointers that must match their history.

Two identities on a file store: this process's account and a throwaway OS user
(tests/fixtures/identities.py) running the real `k3a` under its own uid.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess

import pytest

from k3artifacts.errors import GateFailed
from k3artifacts.policy.document import PolicyDocument
from k3artifacts.policy.record import changes, in_force
from k3artifacts.releases.channels import current, history
from k3artifacts.releases.reviewing import review_code, review_license
from k3artifacts.trust.identities import KeyEntry, identities_yaml
from k3artifacts.trust.keys import signer_key_id as key_id
from tests.fixtures import people
from tests.fixtures.identities import k3a_as, pin_as
from tests.fixtures.moves import promote, use_policy
from tests.fixtures.people import person
from tests.fixtures.releases import REVIEWER, passing_run, staged_for
from tests.support.cli import invoke
from tests.support.releases import Releases

ME = pwd.getpwuid(os.getuid()).pw_name
CODE = {"modeling_kimi.py": b"def forward(x):\n    return x\n"}


def loose_dir(policies, tmp_path):
    """A copy of the policy with production's gates emptied, as a promoter could write."""
    loose = tmp_path / "loose"
    subprocess.run(["cp", "-r", str(policies), str(loose)], check=True)
    gates = loose / "promotion-gates.yaml"
    text = gates.read_text()
    start = text.index("  production:\n    gates: [")
    end = text.index("]", start) + 1
    gates.write_text(text[:start] + "  production:\n    gates: []" + text[end:])
    return loose


def test_logname_and_user_do_not_make_the_reviewer_someone_else(
    file_store, policies, k3a_env, k3a_cmd, tmp_path
):
    """`LOGNAME=alice USER=alice` (and K3A_ACTOR) name nobody: the reviews and the promoter are
    both the account of the real uid, so separation of duties still refuses."""
    store = file_store
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release(code=CODE)
    me_env = dict(k3a_env, K3A_STORE=store.url)
    posing = dict(me_env, LOGNAME="alice", USER="alice", K3A_ACTOR="alice")
    subprocess.run([*k3a_cmd, "review", "license", release.id], env=me_env, check=True,
                   capture_output=True)
    subprocess.run([*k3a_cmd, "review", "code", release.id], env=me_env, check=True,
                   capture_output=True)
    passing_run(store, release)
    staged_for(store, release, policies)

    gates = subprocess.run([*k3a_cmd, "gates", release.id, "production", "--json"], env=posing,
                           capture_output=True, text=True, check=False)
    assert gates.returncode == 5, gates.stderr
    duties = next(r for r in json.loads(gates.stdout)["results"]
                  if r["name"] == "separation_of_duties")
    assert not duties["passed"] and f"{ME} reviewed the license and code" in duties["reason"]
    assert "alice" not in gates.stdout

    promoted = subprocess.run([*k3a_cmd, "promote", release.id, "production"], env=posing,
                              capture_output=True, text=True, check=False)
    assert promoted.returncode == 5 and "separation_of_duties" in promoted.stderr
    assert [e.channel for e in history(store, "staging")] == ["staging"]
    with pytest.raises(Exception, match="never been promoted"):
        history(store, "production")


@pytest.fixture
def judged_store(any_store, any_env):
    """A store and the environment of a `k3a` acting on it: a file tree, or SeaweedFS, which
    has no identity service (no STS): who acts is the key, on both."""
    return any_store, any_env


def test_a_loose_policies_directory_cannot_move_production(judged_store, policies, tmp_path):
    store, env = judged_store
    use_policy(store, policies)
    in_store = in_force(store)
    release = Releases(store, tmp_path / "scratch").release()
    review_license(store, release.id, by=person(REVIEWER))
    review_code(store, release.id, by=person(REVIEWER))
    staged_for(store, release, policies, hours=48)
    loose = loose_dir(policies, tmp_path)

    flag = invoke("promote", release.id, "production", "--policies", str(loose), expect=9, env=env)
    assert "judged by the store's policy" in flag.stderr and "k3a policy propose" in flag.stderr
    # The old way of pointing at a policy directory is not read at all.
    invoke("promote", release.id, "production", expect=5, env=dict(env, K3A_POLICIES=str(loose)))
    invoke("gates", release.id, "production", "--policies", str(loose), expect=9, env=env)

    # Proposing it is allowed; applying it alone is not: it removes production's gates.
    proposed = invoke("policy", "propose", str(loose), "--json", env=env).json
    assert any("removes gate(s)" in n and "production" in n for n in proposed["needs"])
    alone = invoke("policy", "apply", proposed["id"], expect=5, env=env)
    assert "k3a approve" in alone.stderr
    own = invoke("approve", proposed["id"], expect=5, env=env)
    assert "cannot approve it" in own.stderr
    assert in_force(store).digest == in_store.digest
    with pytest.raises(Exception, match="never been promoted"):
        current(store, "production")


def test_a_policy_change_is_recorded_with_identity_and_digest(
    shared_store, second_user, policies, k3a_env, tmp_path
):
    store = shared_store
    env = dict(k3a_env, K3A_STORE=store.url)
    # The team's policy names both accounts' keys (each account's own: tests/fixtures/people).
    (policies / "identities.yaml").write_text(identities_yaml(people.identities()))
    seeded = invoke("policy", "init", "--from", str(policies), "--json", env=env).json
    assert seeded == {"version": 1, "digest": PolicyDocument.from_dir(policies).digest}
    invoke("policy", "init", expect=6, env=env)  # seeded once; after that, changes are proposed
    # The second account pins the root this one made on first use; it joins the root.
    pin_as(second_user, store, k3a_env)
    second_pem = tmp_path / "second.pub.pem"
    second_pem.write_text(KeyEntry.for_signer(people.signer_of(second_user)).pem)
    invoke("trust", "rotate", "--add", f"{second_user}={second_pem}", env=env)

    # Tightening: the proposer applies it alone.
    stricter = tmp_path / "stricter"
    subprocess.run(["cp", "-r", str(policies), str(stricter)], check=True)
    gates = stricter / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace(
        "    gates: [artifact, license, remote_code]\n",
        "    gates: [artifact, license, remote_code, signature]\n", 1))
    tighter = invoke("policy", "propose", str(stricter), "--json", env=env).json
    assert tighter["needs"] == [] and tighter["requested_by"] == {
        "name": ME, "source": "key", "account": None, "key_id": key_id(people.me_signer())}
    invoke("policy", "apply", tighter["id"], env=env)

    # Loosening: the proposer alone is refused; the second root identity approves, under its
    # own uid, with the real command, which signs the change too.
    loose = loose_dir(stricter, tmp_path)
    request = json.loads(invoke("policy", "propose", str(loose), "--why", "drill",
                                "--json", env=env).stdout)
    alone = invoke("policy", "apply", request["id"], expect=5, env=env)
    assert "needs 2 root identities of root v2" in alone.stderr and f"signed by {ME}" in (
        alone.stderr) and f"k3a approve {request['id']}" in alone.stderr
    shown = k3a_as(second_user, store, "approve", request["id"], "--show", env=k3a_env)
    assert "removes gate(s)" in shown.stdout and ME in shown.stdout
    approved = k3a_as(second_user, store, "approve", request["id"], "--reason", "drill only",
                      env=k3a_env)
    assert f"signed by root identities: {', '.join(sorted([ME, second_user]))}" in (
        approved.stdout)
    applied = invoke("policy", "apply", request["id"], "--json", env=env).json
    assert applied == {"version": 3, "digest": PolicyDocument.from_dir(loose).digest}

    recorded = changes(store)
    assert [(r.change.version, r.change.action, r.change.by.name, r.change.by.source,
             r.change.root_version, sorted(r.signers)) for r in recorded] == [
        (1, "seed", ME, "key", 1, [ME]), (2, "change", ME, "key", 2, [ME]),
        (3, "change", ME, "key", 2, sorted([ME, second_user]))]
    assert recorded[1].change.loosens == []
    third = recorded[2].change
    assert third.previous_digest == recorded[1].change.digest
    assert third.request_id == request["id"]
    assert any("production" in n for n in third.loosens) and third.why == "drill"
    listed = invoke("policy", "history", env=env).stdout
    assert f"signed by {', '.join(sorted([ME, second_user]))}" in listed and "v3" in listed

    # Moves name the version that judged them.
    release = Releases(store, tmp_path / "scratch").release()
    invoke("review", "license", release.id, env=env)
    invoke("review", "code", release.id, env=env)
    gated = invoke("gates", release.id, "staging", env=env).stdout
    assert re.search(r"signature\s+pass", gated)  # the gate v2 added is still there
    assert f"policy: version 3 ({applied['digest'][:12]})" in gated
    moved = invoke("promote", release.id, "staging", "--json", env=env).json["entry"]
    assert (moved["policy_version"], moved["policy_digest"]) == (3, applied["digest"])
    assert (moved["who"], moved["who_source"]) == (ME, "key")
    rendered = invoke("render", "staging", "--target", "eks", "--json", env=env)
    assert f"judged by policy v3 {applied['digest'][:12]}" in rendered.stderr, rendered.stderr
    assert rendered.json["channel"]["policy_digest"] == applied["digest"]


def test_the_override_hint_offers_only_gates_that_have_one(file_store, policies, tmp_path):
    store = file_store
    release = Releases(store, tmp_path / "scratch").release(code=CODE)
    use_policy(store, policies)  # its root: every signed record names it
    review_code(store, release.id, by=person("ci"))  # the promoter's own review
    gates = policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace(
        "    gates: [artifact, license, remote_code]\n",
        "    gates: [artifact, license, remote_code, separation_of_duties]\n"
        "    duties: {not_reviewer_of: [code]}\n", 1))
    with pytest.raises(GateFailed) as failed:
        promote(store, release.id, "staging", actor="ci", policies_dir=policies)
    assert "license" in str(failed.value) and "separation_of_duties" in str(failed.value)
    hint = failed.value.hint
    assert "override license with" in hint
    assert "separation_of_duties cannot be overridden" in hint


def test_k3a_rollback_needs_the_approval_the_store_policy_asks_for(
    shared_store, second_user, policies, k3a_env, tmp_path
):
    """`rollback_approval` binds `k3a rollback` as it binds the flow: refused without an
    approval record, moved with one a second identity gave."""
    store = shared_store
    gates = policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace(
        "    gates: [artifact, license, remote_code]\n",
        "    gates: [artifact, license, remote_code]\n    rollback_approval: true\n", 1))
    releases = Releases(store, tmp_path / "scratch")
    first, second = releases.release(), releases.release()
    use_policy(store, policies)  # its root: every signed record names it
    for r in (first, second):
        review_license(store, r.id, by=person(REVIEWER))
        review_code(store, r.id, by=person(REVIEWER))
        promote(store, r.id, "staging", actor="ci", policies_dir=policies)
    env = dict(k3a_env, K3A_STORE=store.url)

    refused = invoke("rollback", "staging", expect=5, env=env)
    assert "requires an approval" in refused.stderr and "--request-approval" in refused.stderr
    request = json.loads(invoke("rollback", "staging", "--request-approval", "--why", "p99",
                                "--json", env=env).stdout)
    assert (request["channel"], request["tuple_id"]) == ("staging", first.id)
    invoke("rollback", "staging", "--approval", request["id"], expect=5, env=env)  # not answered yet
    pin_as(second_user, store, k3a_env)
    k3a_as(second_user, store, "approve", request["id"], env=k3a_env)
    back = invoke("rollback", "staging", "--to", first.id, "--approval", request["id"], env=env)
    assert f"approved by {second_user}" in back.stdout
    entry = history(store, "staging")[-1]
    assert (entry.action, entry.tuple_id, entry.who) == ("rollback", first.id, ME)
    assert (entry.approval.who, entry.approval.request_id) == (second_user, request["id"])
