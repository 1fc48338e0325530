"""Channels, gates, promotion and rollback against a real store (every backend in `store`)."""

from __future__ import annotations

import itertools
import json
import threading

import pytest

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import ConfigError, GateFailed, NotFound, UntrustedRecord, VerifyMismatch
from k3artifacts.releases.channels import (
    Approval,
    ChannelMoved,
    current,
    history,
    history_key,
    list_channels,
    pointer_key,
)
from k3artifacts.releases.evaluations import attach_evaluation
from k3artifacts.releases.reviewing import review_code, review_license
from k3artifacts.revisions.manifest import manifest_key
from tests.fixtures.any_store import overwrite
from tests.fixtures.moves import check_gates, promote, rollback, use_policy
from tests.fixtures.people import person
from tests.fixtures.releases import ATOMIC_STORES, require_atomic_cas, staged_for

CODE = {"modeling_kimi.py": b"def forward(x):\n    return x\n"}


def _promote(store, release, channel, policies, **kw):
    return promote(store, release.id, channel, actor="alice", policies_dir=policies, **kw)


def _assert_gap_free(store, channel):
    entries = history(store, channel)
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    for before, after in itertools.pairwise(entries):
        assert after.previous_tuple_id == before.tuple_id
    assert current(store, channel).tuple_id == entries[-1].tuple_id
    return entries


def test_passing_gates_move_the_pointer_and_record_history(store, releases, policies, reviewed):
    release = releases.release(code=CODE)
    reviewed(release)
    result = _promote(store, release, "staging", policies, reason="first build")
    assert result.changed and result.entry.seq == 1 and result.previous_tuple_id is None
    assert [(g.name, g.passed) for g in result.gates] == [
        ("artifact", True),
        ("license", True),
        ("remote_code", True),
    ]
    (entry,) = _assert_gap_free(store, "staging")
    assert (entry.action, entry.who, entry.why) == ("promote", "alice", "first build")
    assert store.read(history_key("staging", 1)) is not None
    assert [p.channel for p in list_channels(store)] == ["staging"]


def test_a_failing_gate_blocks_promotion_with_its_reason(store, releases, policies):
    release = releases.release(code=CODE)
    with pytest.raises(GateFailed) as failed:
        _promote(store, release, "staging", policies)
    message = str(failed.value)
    assert "license:" in message and release.binding.license_sha256 in message
    assert "remote_code:" in message and "modeling_kimi.py" in message
    assert "artifact" not in message  # it passed
    assert failed.value.exit_code == 5
    assert store.read(pointer_key("staging")) is None
    assert store.list_keys("releases/channels/") == []


def test_an_override_needs_a_reason_and_is_recorded(store, releases, policies):
    release = releases.release()
    use_policy(store, policies)  # its root: every signed record names it
    review_license(store, release.id, by=person("rita"))
    staged_for(store, release, policies)
    with pytest.raises(ConfigError, match="needs a reason"):
        _promote(store, release, "production", policies, overrides={"evaluation": "  "})
    with pytest.raises(ConfigError, match="cannot override gate 'bogus'"):
        _promote(store, release, "production", policies, overrides={"bogus": "typo"})
    result = _promote(
        store,
        release,
        "production",
        policies,
        overrides={"evaluation": "suite down; manual check by bob", "license": "not needed"},
        approval=Approval(who="carol", decision="approved", reason="looks fine"),
    )
    (entry,) = history(store, "production")
    assert [(o.gate, o.reason) for o in entry.overrides] == [
        ("evaluation", "suite down; manual check by bob")
    ]
    gates = {g.name: g for g in entry.gates}
    assert not gates["evaluation"].passed and gates["evaluation"].overridden
    assert gates["license"].passed and not gates["license"].overridden
    assert result.unused_overrides == ["license"]
    assert entry.approval is not None and entry.approval.who == "carol"


def test_a_rejected_approval_moves_nothing(store, releases, policies, reviewed):
    release = releases.release()
    reviewed(release)
    with pytest.raises(GateFailed, match="rejected by carol: not yet"):
        _promote(
            store,
            release,
            "staging",
            policies,
            approval=Approval(who="carol", decision="rejected", reason="not yet"),
        )
    assert store.read(pointer_key("staging")) is None


def test_artifact_gate_names_each_problem(store, releases, policies, reviewed):
    manifest = releases.publish()
    good = releases.tuple_for(manifest)
    wrong_digest = releases.tuple_for(manifest, manifest_digest="0" * 64)
    reviewed(good)
    assert check_gates(store, good.id, "staging", policies_dir=policies).passed
    report = check_gates(store, wrong_digest.id, "staging", policies_dir=policies)
    (artifact,) = [r for r in report.results if r.name == "artifact"]
    assert not artifact.passed and f"is not the tuple's {'0' * 64}" in artifact.reason


def test_artifact_gate_refuses_pickles_and_unchecked_safetensors(
    store, releases, policies, reviewed
):
    release = releases.release(extra={"training_args.bin": b"\x80\x04pickle"})
    reviewed(release)
    report = check_gates(store, release.id, "staging", policies_dir=policies)
    assert not report.passed
    assert "training_args.bin is a pickle-family format" in report.failed[0].reason


def test_artifact_gate_checks_sizes_and_unlisted_files(file_store, tmp_path, policies):
    """File-tree surgery, so this one runs on the file store only."""
    import os

    from tests.support.releases import Releases

    releases = Releases(file_store, tmp_path / "scratch")
    manifest = releases.publish(shards=3)
    release = releases.tuple_for(manifest)
    root = file_store.local_path(f"models/{manifest.repo_id}/{manifest.commit}")
    os.chmod(root, 0o755)
    shard1, shard2 = root / manifest.files[1].path, root / manifest.files[2].path
    os.chmod(shard1, 0o644)
    shard1.write_bytes(b"short")
    os.unlink(shard2)
    (root / "smuggled.py").write_text("import os")
    report = check_gates(file_store, release.id, "staging", policies_dir=policies)
    reason = next(r for r in report.results if r.name == "artifact").reason
    assert f"{manifest.files[1].path} is 5 bytes, manifest says {manifest.files[1].size}" in reason
    assert f"{manifest.files[2].path} is missing" in reason
    assert "smuggled.py is in the store but not in the manifest" in reason


def test_evaluation_gate_refuses_attached_reports_unless_overridden(
    store, releases, policies, reviewed
):
    release = releases.release()
    reviewed(release)
    staged_for(store, release, policies)

    def evaluation():
        report = check_gates(store, release.id, "production", policies_dir=policies)
        return next(r for r in report.results if r.name == "evaluation")

    assert "no evaluation run of eval-suites/k3-core.yaml" in evaluation().reason
    high = {"suite": "k3-core", "passed": 99, "total": 100}
    _record, written = attach_evaluation(store, release.id, high, by=person("ci"))
    assert written
    _, again = attach_evaluation(store, release.id, high, by=person("ci"))
    assert not again  # create-once: the same report is not attached twice
    # Nothing ran the attached numbers: the gate names them and refuses.
    gate = evaluation()
    assert not gate.passed and "1 report(s) attached by hand (latest by ci)" in gate.reason
    with pytest.raises(GateFailed, match="evaluation"):
        _promote(store, release, "production", policies)
    moved = _promote(store, release, "production", policies,
                     overrides={"evaluation": "suite endpoint down; 99/100 attached by ci"})
    assert moved.changed and moved.entry.overrides[0].gate == "evaluation"


def test_license_changed_since_review_blocks_until_reviewed(store, releases, policies, reviewed):
    old = releases.release()
    reviewed(old)
    _promote(store, old, "staging", policies)
    new = releases.release(license_text="MIT License, modified: attribution required\n")
    with pytest.raises(GateFailed, match=f"license sha256 {new.binding.license_sha256}") as err:
        _promote(store, new, "staging", policies)
    assert f"differs from the one rita reviewed for {new.binding.weights.repo_id}" in str(
        err.value
    )
    outcome = review_license(store, new.id, by=person("bob"), note="attribution")
    assert outcome.written and outcome.review.license == "modified-mit"
    assert _promote(store, new, "staging", policies).changed


def test_reviews_are_idempotent_create_once_records_in_the_store(store, releases, policies):
    use_policy(store, policies)  # the reviews are read through the identities it names
    release = releases.release(code=CODE)
    first = review_license(store, release.id, by=person("alice"))
    assert first.written and first.key == f"releases/reviews/license/{release.binding.license_sha256}.json"
    before = store.read(first.key)
    again = review_license(store, release.id, by=person("bob"))
    assert not again.written and again.review.reviewed_by == "alice"
    assert store.read(first.key).data == before.data
    code = review_code(store, release.id, by=person("alice"))
    assert [r.path for r in code.recorded] == ["modeling_kimi.py"]
    code_again = review_code(store, release.id, by=person("alice"))
    assert code_again.recorded == [] and len(code_again.already_reviewed) == 1
    # Nothing but the fixture's own policy files in policies/: the reviews are store records.
    assert sorted(p.name for p in policies.rglob("*.yaml")) == [
        "k3-core.yaml", "promotion-gates.yaml"]


def test_malformed_policy_files_and_review_records_are_named(store, releases, policies):
    release = releases.release()
    key = f"releases/reviews/license/{release.binding.license_sha256}.json"
    store.create(key, b'{"sha256": "abc", "reviewer": "alice"}')
    with pytest.raises(UntrustedRecord, match=f"{key}: refused \\(unsigned\\)") as bad:
        _promote(store, release, "staging", policies)
    assert bad.value.exit_code == 4
    gates_file = policies / "promotion-gates.yaml"
    gates_file.write_text("channels:\n  production:\n    gates: [artifact, evaluation]\n")
    with pytest.raises(ConfigError, match=f"{gates_file}.*min_pass_rate"):
        _promote(store, release, "production", policies)
    gates_file.write_text("channels:\n  production:\n    gates: [artifact, signatures]\n")
    with pytest.raises(ConfigError, match=f"{gates_file}.*unknown gate.*signatures"):
        _promote(store, release, "production", policies)


@pytest.mark.parametrize("store", ATOMIC_STORES, indirect=True)
def test_racing_promotions_threads_leave_one_winner(store, releases, policies, reviewed):
    require_atomic_cas(store)
    base, a, b = releases.release(), releases.release(), releases.release()
    for r in (base, a, b):
        reviewed(r)
    _promote(store, base, "staging", policies)
    _both_read_before_either_swaps(store)
    outcomes = _race(
        lambda: _promote(store, a, "staging", policies),
        lambda: _promote(store, b, "staging", policies),
    )
    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    losers = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(winners) == 1 and len(losers) == 1
    assert isinstance(losers[0], ChannelMoved) and losers[0].exit_code == 6
    winner_id = winners[0].tuple_id
    assert winner_id in str(losers[0]) and "nothing was written" in str(losers[0])
    entries = _assert_gap_free(store, "staging")
    assert [e.tuple_id for e in entries] == [base.id, winner_id]


@pytest.mark.parametrize("store", ATOMIC_STORES, indirect=True)
def test_promotion_racing_a_rollback_leaves_one_winner(store, releases, policies, reviewed):
    require_atomic_cas(store)
    first, second, third = releases.release(), releases.release(), releases.release()
    for r in (first, second, third):
        reviewed(r)
    _promote(store, first, "staging", policies)
    _promote(store, second, "staging", policies)
    _both_read_before_either_swaps(store)
    outcomes = _race(
        lambda: _promote(store, third, "staging", policies),
        lambda: rollback(store, "staging", actor="bob", reason="bad latency"),
    )
    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    losers = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(winners) == 1 and isinstance(losers[0], ChannelMoved)
    assert winners[0].tuple_id in str(losers[0])
    entries = _assert_gap_free(store, "staging")
    assert len(entries) == 3 and entries[-1].tuple_id in (first.id, third.id)


def _both_read_before_either_swaps(store):
    """Hold each pointer compare-and-swap until two movers have read the same pointer, so the
    race is real every run instead of depending on thread scheduling."""
    barrier = threading.Barrier(2, timeout=30)
    real_replace = store.replace

    def replace(key, data, expected):
        # The channel pointer's swap only (a move also re-signs the store's freshness head).
        if key.startswith("releases/channels/") and key.endswith(".json") \
                and "/history/" not in key:
            barrier.wait()
        return real_replace(key, data, expected)

    store.replace = replace


def _race(*calls):
    outcomes: list[object] = [None] * len(calls)

    def run(i, call):
        try:
            outcomes[i] = call()
        except BaseException as exc:  # noqa: BLE001 - the outcome under test
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


def test_a_mover_dying_between_pointer_and_log_loses_no_entry(store, releases, policies, reviewed):
    first, second, third = releases.release(), releases.release(), releases.release()
    for r in (first, second, third):
        reviewed(r)
    _promote(store, first, "staging", policies)
    real_create = store.create

    def dies_before_logging(key, data):
        if "/history/" in key:
            raise SystemExit("killed")  # the process dies after its pointer swap
        return real_create(key, data)

    store.create = dies_before_logging
    with pytest.raises(SystemExit):
        _promote(store, second, "staging", policies)
    store.create = real_create
    assert current(store, "staging").tuple_id == second.id
    assert store.read(history_key("staging", 2)) is None
    # Readers see the move (its entry lives in the pointer) without writing anything.
    assert [e.tuple_id for e in history(store, "staging")] == [first.id, second.id]
    # The next mover writes the missing entry before its own: no gap.
    _promote(store, third, "staging", policies)
    assert store.read(history_key("staging", 2)) is not None
    entries = _assert_gap_free(store, "staging")
    assert [e.tuple_id for e in entries] == [first.id, second.id, third.id]


def test_rollback_to_previous_and_to_an_explicit_tuple(store, releases, policies, reviewed):
    t1, t2, t3 = releases.release(), releases.release(), releases.release()
    for r in (t1, t2, t3):
        reviewed(r)
        _promote(store, r, "staging", policies)
    back = rollback(store, "staging", actor="bob", reason="p99 regression")
    assert back.changed and back.tuple_id == t2.id and back.previous_tuple_id == t3.id
    # A second rollback undoes the first, like `kubectl rollout undo`.
    assert rollback(store, "staging", actor="bob").tuple_id == t3.id
    explicit = rollback(store, "staging", to=t1.id, actor="bob", reason="known good")
    assert explicit.tuple_id == t1.id
    assert explicit.entry.gates[0].name == "weights_present"
    unchanged = rollback(store, "staging", to=t1.id, actor="bob")
    assert not unchanged.changed
    entries = _assert_gap_free(store, "staging")
    assert [(e.action, e.tuple_id) for e in entries] == [
        ("promote", t1.id),
        ("promote", t2.id),
        ("promote", t3.id),
        ("rollback", t2.id),
        ("rollback", t3.id),
        ("rollback", t1.id),
    ]
    assert entries[3].why == "p99 regression" and entries[3].who == "bob"


def test_rollback_refuses_targets_it_cannot_serve(store, releases, policies, reviewed):
    t1, t2, stranger = releases.release(), releases.release(), releases.release()
    for r in (t1, t2):
        reviewed(r)
        _promote(store, r, "staging", policies)
    with pytest.raises(NotFound, match=f"{stranger.id} has never been on channel staging"):
        rollback(store, "staging", to=stranger.id, actor="bob")
    w = t1.binding.weights
    store.delete_revision(w.repo_id, w.commit)
    with pytest.raises(NotFound) as gone:
        rollback(store, "staging", actor="bob")
    assert t1.id in str(gone.value) and w.commit in str(gone.value)
    assert "k3a stage" in gone.value.hint
    assert current(store, "staging").tuple_id == t2.id
    assert len(history(store, "staging")) == 2


def test_rollback_reads_the_manifest_as_the_gates_do(store, releases, policies, reviewed):
    """The issue's case: a rollback held the manifest's raw sha256 to the tuple's digest where
    the gates and the pull ask ``answers_to`` (canonical, or as stored). A revision published
    with provenance inside its manifest (a file marked reused), cited by its canonical digest:
    the gates pass it, and rolling back to it now does too; one whose manifest was replaced
    is refused by every reader alike."""
    t1, t2 = releases.release(), releases.release()
    for r in (t1, t2):
        reviewed(r)
        _promote(store, r, "staging", policies)
    w = t1.binding.weights
    key = manifest_key(w.repo_id, w.commit)
    data = json.loads(store.read(key).data)
    data["files"][0].update(source="reused", reused_from=t2.binding.weights.commit)
    overwrite(store, key, canonical_json(data))
    assert check_gates(store, t1.id, "staging").passed
    back = rollback(store, "staging", actor="bob")
    assert back.changed and back.tuple_id == t1.id

    w2 = t2.binding.weights
    replaced = json.loads(store.read(manifest_key(w2.repo_id, w2.commit)).data)
    replaced["files"][0]["size"] += 1
    overwrite(store, manifest_key(w2.repo_id, w2.commit), canonical_json(replaced))
    with pytest.raises(VerifyMismatch, match=f"cannot roll staging back to {t2.id}: .* is not "
                       f"the tuple's {w2.manifest_digest}"):
        rollback(store, "staging", to=t2.id, actor="bob")
    report = check_gates(store, t2.id, "staging")
    artifact = next(r for r in report.results if r.name == "artifact")
    assert not artifact.passed and f"is not the tuple's {w2.manifest_digest}" in artifact.reason


def test_unknown_names_and_nothing_to_roll_back(store, releases, policies, reviewed):
    release = releases.release()
    reviewed(release)
    with pytest.raises(NotFound, match="has never been promoted to") as unknown:
        history(store, "production")
    assert "k3a promote" in unknown.value.hint
    with pytest.raises(NotFound):
        rollback(store, "production", actor="bob")
    with pytest.raises(NotFound, match="not configured in the store's policy"):
        _promote(store, release, "prodution", policies)
    with pytest.raises(ConfigError, match="not a valid channel name"):
        _promote(store, release, "Prod_1", policies)
    with pytest.raises(NotFound, match="tuple k3t-0{24} is not in"):
        promote(store, "k3t-" + "0" * 24, "staging", actor="a", policies_dir=policies)
    _promote(store, release, "staging", policies)
    with pytest.raises(NotFound, match="nothing to roll back to"):
        rollback(store, "staging", actor="bob")
    again = _promote(store, release, "staging", policies)
    assert not again.changed and len(history(store, "staging")) == 1
