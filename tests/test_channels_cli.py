"""The channel commands as an operator runs them: `k3a` in subprocesses, exit codes, output."""

from __future__ import annotations

import itertools
import json
import os
import pwd
import re
import subprocess
import sys

import pytest

from k3artifacts.policy.record import in_force
from k3artifacts.releases.channels import current, history
from tests.fixtures.moves import use_policy
from tests.fixtures.people import key_file
from tests.fixtures.releases import ATOMIC_STORES, require_atomic_cas
from tests.support.cli import Ran, invoke
from tests.support.waiting import wait_until

#: Who acts unless a test signs as someone else: this account's personal key, named after it.
ME = pwd.getpwuid(os.getuid()).pw_name

CODE = {"modeling_kimi.py": b"def forward(x):\n    return x\n"}


@pytest.fixture
def k3a_env_store(request, k3a_env, store, policies):
    """The store's policy: the checkout's, naming the tests' people (each signs with their own
    key: tests/fixtures/people.py), with production's stay on staging not waited for (the
    promotion_order gate's clock is tested in test_release_safety.py)."""
    from k3artifacts.stores.file import FileStore

    gates = policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace("min_hours: 24", "min_hours: 0"))
    use_policy(store, policies)
    if isinstance(store, FileStore):
        base = k3a_env
    elif request.node.callspec.params.get("store") == "seaweed":
        base = dict(k3a_env, **request.getfixturevalue("seaweed").env)
        # A moto server started earlier in the session fakes a session token in this
        # process's environment; SeaweedFS's keys have none.
        base.pop("AWS_SESSION_TOKEN", None)
    else:
        base = request.getfixturevalue("s3_env")
    return dict(base, K3A_STORE=store.url)


@pytest.fixture
def k3a(k3a_env_store, tmp_path):
    """The real `k3a` command in-process (seconds matter); separate processes are used below
    where the point is separate processes. ``as_``: sign as that person (their key), else as
    this account (its personal key, the identity ME)."""

    def run(*args: str, expect: int = 0, as_: str | None = None) -> Ran:
        env = k3a_env_store if as_ is None else dict(
            k3a_env_store, K3A_IDENTITY_KEY=str(key_file(as_, tmp_path)))
        return invoke(*args, env=env, expect=expect)

    run.env = k3a_env_store  # type: ignore[attr-defined]
    return run


def test_staged_revision_to_production_and_back(k3a, releases, store, tmp_path):
    old, new = releases.release(code=CODE), releases.release(code=CODE)

    dry = k3a("gates", old.id, "staging", expect=5)
    assert re.search(r"license\s+FAIL\s+license sha256", dry.stdout)
    assert re.search(r"remote_code\s+FAIL\s+not reviewed: modeling_kimi.py", dry.stdout)
    assert re.search(r"artifact\s+pass", dry.stdout)
    # The dry run is the promotion's plan: the same refusal the move gives.
    assert "2 gate(s) failed" in dry.stderr and "\n  remote_code: " in dry.stderr

    blocked = k3a("promote", old.id, "staging", expect=5)
    assert "2 gate(s) failed" in blocked.stderr and "--override-gate" in blocked.stderr

    assert k3a("review", "license", old.id, "--show").stdout.startswith("MIT License")
    k3a("review", "license", old.id, "--note", "read it", as_="alice")
    code = k3a("review", "code", old.id, as_="alice")
    assert "recorded: modeling_kimi.py" in code.stdout
    again = json.loads(k3a("review", "license", old.id, "--json", as_="alice").stdout)
    assert again["written"] is False

    report = json.loads(k3a("gates", old.id, "staging", "--json").stdout)
    assert report["passed"] is True and [g["name"] for g in report["results"]] == [
        "artifact",
        "license",
        "remote_code",
    ]
    moved = json.loads(k3a("promote", old.id, "staging", "--why", "smoke ok", "--json").stdout)
    assert moved["changed"] and moved["entry"]["seq"] == 1 and moved["entry"]["who"] == ME

    eval_blocked = k3a("promote", old.id, "production", expect=5)
    assert "evaluation: no evaluation run" in eval_blocked.stderr
    report_file = tmp_path / "eval.json"
    report_file.write_text(json.dumps({"suite": "k3-smoke", "passed": 97, "total": 100, "x": 1}))
    attached = k3a("eval", "attach", old.id, str(report_file))
    assert "attached: k3-smoke 97/100 = 97.0%" in attached.stdout
    assert "the evaluation gate does not accept it" in attached.stdout
    still_blocked = k3a("promote", old.id, "production", as_="bob", expect=5)
    assert "attached by hand" in still_blocked.stderr
    override = ("--override-gate", "evaluation", "--reason", "97/100 attached; endpoint down")
    own = k3a("promote", old.id, "production", *override, expect=5, as_="alice")
    # separation of duties
    assert "alice reviewed the license and code" in own.stderr
    out = k3a("promote", old.id, "production", *override, as_="bob").stdout
    assert f"production: (empty) -> {old.id} (promote #1 by bob; policy v1 " in out

    # The new revision's code is the same file: already reviewed by sha256.
    k3a("review", "license", new.id, as_="alice")
    assert "already reviewed: modeling_kimi.py" in k3a("review", "code", new.id, as_="a").stdout
    k3a("promote", new.id, "staging")  # production takes only what staging served
    k3a(
        "promote",
        new.id,
        "production",
        "--override-gate",
        "evaluation",
        "--reason",
        "hotfix; eval queued",
        "--why",
        "CVE fix",
    )
    assert current(store, "production").tuple_id == new.id

    back = k3a("rollback", "production", "--why", "5xx spike").stdout
    assert f"production: {new.id} -> {old.id} (rollback #3 by {ME}" in back

    listed = k3a("history", "production").stdout.splitlines()
    assert listed[0].split()[:3] == ["seq", "when", "(UTC)"]
    assert "override evaluation: hotfix; eval queued" in listed[2]
    assert "5xx spike" in listed[3] and "rollback" in listed[3]
    entries = json.loads(k3a("history", "production", "--json").stdout)
    assert [e["action"] for e in entries] == ["promote", "promote", "rollback"]
    assert entries[1]["overrides"] == [{"gate": "evaluation", "reason": "hotfix; eval queued"}]

    channels = json.loads(k3a("channels", "list", "--json").stdout)
    assert {c["channel"]: c["tuple_id"] for c in channels} == {
        "production": old.id,
        "staging": new.id,
    }
    # The reviews are records in the store, and every move names the policy that judged it.
    assert {e["policy_digest"] for e in entries} == {in_force(store).digest}
    reviews = store.list_keys("releases/reviews/")
    assert len(reviews) == 2 and reviews[0].startswith("releases/reviews/code/")


def test_license_changed_since_review_needs_a_new_review(k3a, releases):
    old = releases.release()
    new = releases.release(license_text="Modified MIT: show 'Kimi K3' in your UI\n")
    k3a("review", "license", old.id, as_="alice")
    k3a("promote", old.id, "staging")
    blocked = k3a("promote", new.id, "staging", expect=5)
    assert f"license sha256 {new.binding.license_sha256} has not been reviewed" in blocked.stderr
    k3a("review", "license", new.id, as_="bob")
    k3a("promote", new.id, "staging")


def test_errors_have_exit_codes_and_next_steps(k3a, releases, tmp_path):
    release = releases.release()
    unknown_channel = k3a("history", "production", expect=7)
    assert "never been promoted to" in unknown_channel.stderr and "next:" in unknown_channel.stderr
    k3a("rollback", "production", expect=7)
    k3a("promote", release.id, "prodution", expect=7)
    k3a("promote", "k3t-" + "0" * 24, "staging", expect=7)
    k3a("promote", "not-a-tuple", "staging", expect=2)
    k3a("promote", release.id, "Bad_Name", expect=9)
    mismatched = k3a("promote", release.id, "staging", "--override-gate", "license", expect=2)
    assert "one --reason for each --override-gate" in mismatched.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"suite": "s", "passed": 5, "total": 4}))
    k3a("eval", "attach", release.id, str(bad), expect=9)


def test_exit_codes_reach_the_shell(k3a_cmd, k3a_env_store, releases):
    release = releases.release()
    for args, code in [
        (["promote", release.id, "staging"], 5),
        (["rollback", "staging"], 7),
    ]:
        proc = subprocess.run(
            [*k3a_cmd, *args],
            env=k3a_env_store,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == code, proc.stderr
        assert proc.stderr.startswith("error: ") and "next: " in proc.stderr


# Imports k3a (the slow part of a start), says so by creating its ready file, then waits for
# the go file: the racers' moves start within milliseconds of each other instead of a second
# apart. The spin on the go file is the wait itself (the test removes the racer if it never
# comes).
RACER = """
import os, sys, time
from pathlib import Path
from k3artifacts.cli import cli
from k3artifacts.policy.record import in_force
Path(sys.argv[2]).touch()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.001)
cli(args=sys.argv[3:], prog_name="k3a")
"""


@pytest.mark.parametrize("store", ATOMIC_STORES, indirect=True)
def test_racing_promotions_in_separate_processes(k3a, releases, store, reviewed, tmp_path):
    """Separate processes, no hooks in k3a: whatever the interleaving, every racer either won
    (its entry is in the history) or exited 6 naming a winner, and the history has no gap."""
    require_atomic_cas(store)
    candidates = [releases.release() for _ in range(5)]
    for r in candidates:
        reviewed(r)
    k3a("promote", candidates[0].id, "staging")
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(len(candidates) - 1)]
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(go), str(flag), "promote", r.id, "staging"],
            env=k3a.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r, flag in zip(candidates[1:], ready, strict=True)
    ]
    try:
        wait_until(lambda: all(f.exists() for f in ready), "every racer to have imported k3a",
                   timeout=60)
    finally:
        go.touch()
    outcomes = [(p.wait(120), *p.communicate()) for p in racers]
    codes = [code for code, _, _ in outcomes]
    assert set(codes) <= {0, 6} and 0 in codes, outcomes
    entries = history(store, "staging")
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    assert len(entries) == 1 + codes.count(0)
    for before, after in itertools.pairwise(entries):
        assert after.previous_tuple_id == before.tuple_id
    winners = {e.tuple_id for e in entries[1:]}
    for code, _, stderr in outcomes:
        if code == 6:
            named = re.search(r"staging moved to (k3t-[0-9a-f]{24})", stderr)
            assert named and named.group(1) in winners, stderr
    assert current(store, "staging").tuple_id == entries[-1].tuple_id
