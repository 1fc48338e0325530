"""`k3a gc`: retire revisions no channel can reach, never one a channel's window can, and never
leave a channel pointing at deleted weights when a promotion races it."""

from __future__ import annotations

import json
import os
import random
import threading
import time

import pytest

from k3artifacts.errors import Conflict, GateFailed, NotFound
from k3artifacts.policy.model import load_gate_policy
from k3artifacts.promotion.gates.context import human_bytes
from k3artifacts.releases.channels import channel_names, current
from k3artifacts.releases.retention import plan, retire
from k3artifacts.releases.retirement import RevisionRetiring, tombstone_key
from k3artifacts.releases.tuples import TupleStore
from k3artifacts.stores.file import FileStore
from k3artifacts.stores.s3 import S3Store
from tests.fixtures.moves import promote, rollback, use_policy
from tests.fixtures.people import person
from tests.fixtures.releases import passing_run
from tests.support.cli import invoke
from tests.support.releases import Releases
from tests.support.waiting import until_a_later_second, wait_until


@pytest.fixture
def gc_policies(policies):
    """The checkout's policy; staging's rollback window narrowed to two entries, and no wait
    on staging before production (what gc reads is the history, not the clock)."""
    gates = policies / "promotion-gates.yaml"
    text = gates.read_text().replace("min_hours: 24", "min_hours: 0")
    text = text.replace("    gates: [artifact, license, remote_code]\n",
                        "    gates: [artifact, license, remote_code]\n    rollback_window: 2\n", 1)
    gates.write_text(text)
    return policies


def _weights_present(store, release):
    w = release.binding.weights
    return store.read_manifest(w.repo_id, w.commit) is not None


def _every_channel_is_servable(store):
    for channel in channel_names(store):
        release = TupleStore(store).get(current(store, channel).tuple_id)
        assert _weights_present(store, release), f"{channel} points at deleted weights"


def test_gc_keeps_what_rollback_windows_reach_and_removes_the_rest(
    request, store, releases, reviewed, gc_policies, k3a_env
):
    a, b, c, d, e = (releases.release() for _ in range(5))
    until_a_later_second(store)  # f is the newest
    f = releases.release()
    for r in (a, b, c, d, e, f):
        reviewed(r)
    for r in (a, b, c, d):
        promote(store, r.id, "staging", actor="ci", policies_dir=gc_policies)
    passing_run(store, b)
    promote(store, b.id, "production", actor="pat", policies_dir=gc_policies,
            overrides={"promotion_order": "b served staging before c and d"})

    env = dict(k3a_env, K3A_STORE=store.url, K3A_POLICIES=str(gc_policies))
    if isinstance(store, S3Store):
        env = dict(request.getfixturevalue("s3_env"), K3A_STORE=store.url,
                   K3A_POLICIES=str(gc_policies))

    def k3a(*args):
        return invoke(*args, env=env).stdout

    dry = json.loads(k3a("gc", "--keep", "1", "--keep-days", "0", "--json"))
    actions = {v["commit"]: v["action"] for v in dry}
    commit = {r.id: r.binding.weights.commit for r in (a, b, c, d, e, f)}
    assert actions == {commit[a.id]: "retire", commit[b.id]: "keep", commit[c.id]: "keep",
                       commit[d.id]: "keep", commit[e.id]: "retire", commit[f.id]: "keep"}
    reasons = {v["commit"]: v["reason"] for v in dry}
    assert "production current" in reasons[commit[b.id]]
    assert "staging #3" in reasons[commit[c.id]] and "staging current" in reasons[commit[d.id]]
    assert "newest 1" in reasons[commit[f.id]]
    human = k3a("gc", "--keep", "1", "--keep-days", "0")
    assert f"retire  moonshotai/Kimi-K3@{commit[e.id][:12]}" in human and "would free" in human
    assert "dry run: would free" in human and "--apply to act" in human
    assert all(_weights_present(store, r) for r in (a, b, c, d, e, f))  # dry runs

    out = k3a("gc", "--keep", "1", "--keep-days", "0", "--apply")
    size = dry[0]["bytes"]
    assert f"retired moonshotai/Kimi-K3@{commit[a.id][:12]}" in out and "frees" in out
    assert "freed" in out and size > 0
    assert not _weights_present(store, a) and not _weights_present(store, e)
    assert store.list_keys(f"models/moonshotai/Kimi-K3/{commit[a.id]}/") == []
    assert all(_weights_present(store, r) for r in (b, c, d, f))
    assert store.list_keys("releases/retirement/") == []  # no tombstone or pin left
    _every_channel_is_servable(store)
    # Outside the window: rolling back to it is refused, naming the missing weights.
    with pytest.raises(NotFound, match="no longer in"):
        rollback(store, "staging", to=a.id, actor="ops")
    # Inside it: still one command away.
    assert rollback(store, "staging", actor="ops").tuple_id == c.id
    # Defaults come from the policy: nothing more to retire.
    again = json.loads(k3a("gc", "--json"))
    assert {v["action"] for v in again} == {"keep"}


def _paused(monkeypatch, tmp_path, point):
    resume = tmp_path / f"resume-{point}"
    monkeypatch.setenv("K3A_FAULT_PAUSE", f"{point}:30")
    monkeypatch.setenv("K3A_FAULT_RESUME", str(resume))
    return resume


def _run(fn):
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, box


def _setup_race(store, tmp_path, reviewed, policies):
    releases = Releases(store, tmp_path / "scratch")
    old, doomed = releases.release(), releases.release()
    until_a_later_second(store)
    releases.release()  # the newest, which keep=1 keeps
    for r in (old, doomed):
        reviewed(r)
    promote(store, old.id, "staging", actor="ci", policies_dir=policies)
    policy = load_gate_policy(policies)
    (verdict,) = [v for v in plan(store, policy, keep=1, keep_days=0)
                  if v.commit == doomed.binding.weights.commit]
    # Nothing reaches `doomed` yet, and `old` is what staging serves: gc would delete doomed.
    assert verdict.action == "retire"
    return old, doomed, policy, verdict


@pytest.mark.parametrize("backend", ["file", "seaweed"])
def test_a_promotion_during_gc_is_refused_or_keeps_the_revision(
    request, backend, tmp_path, policies, monkeypatch, capsys
):
    store = (FileStore(tmp_path / "store") if backend == "file"
             else request.getfixturevalue("seaweed_store"))
    from k3artifacts.releases.reviewing import review_code, review_license

    use_policy(store, policies)  # the reviews are read through the identities it names

    def reviewed(r):
        review_license(store, r.id, by=person("rita"))
        review_code(store, r.id, by=person("rita"))

    old, doomed, policy, verdict = _setup_race(store, tmp_path, reviewed, policies)
    gate = doomed.binding.weights

    # 1. gc has tombstoned the revision and found it unreachable; a promotion arrives.
    resume = _paused(monkeypatch, tmp_path, "gc-checked")
    thread, box = _run(lambda: retire(store, verdict, policy, who="gc"))
    said = []

    def gc_paused():  # it says so on stderr once past its checks, before the delete
        said.append(capsys.readouterr().err)
        return "paused at gc-checked" in "".join(said)

    wait_until(gc_paused, "gc to pause between its checks and the delete", timeout=20)
    assert store.read(tombstone_key(gate.repo_id, gate.commit)) is not None
    with pytest.raises(RevisionRetiring) as refused:
        promote(store, doomed.id, "staging", actor="ci", policies_dir=policies)
    assert refused.value.exit_code == 6 and "being retired by gc" in str(refused.value)
    resume.touch()
    thread.join(30)
    assert box["result"].action == "retired"
    assert current(store, "staging").tuple_id == old.id
    _every_channel_is_servable(store)

    # 2. A promotion has pinned the revision (past its tombstone check); gc arrives.
    releases = Releases(store, tmp_path / "scratch2")
    releases.count = 100
    late = releases.release()
    until_a_later_second(store)
    releases.release()
    reviewed(late)
    (verdict,) = [v for v in plan(store, policy, keep=1, keep_days=0)
                  if v.commit == late.binding.weights.commit]
    assert verdict.action == "retire"
    resume = _paused(monkeypatch, tmp_path, "move-pinned")
    thread, box = _run(lambda: promote(store, late.id, "staging", actor="ci",
                                       policies_dir=policies))
    pins = f"releases/retirement/pins/{late.binding.weights.repo_id}/"
    wait_until(lambda: store.list_keys(pins), "the promotion to pin the revision", timeout=20)
    kept = retire(store, verdict, policy, who="gc")
    assert kept.action == "kept" and "being moved onto by ci" in kept.reason
    resume.touch()
    thread.join(30)
    assert box["result"].changed and current(store, "staging").tuple_id == late.id
    assert _weights_present(store, late)
    assert store.list_keys("releases/retirement/") == []
    _every_channel_is_servable(store)


@pytest.mark.parametrize("backend", ["file", "seaweed"])
def test_gc_racing_promotions_never_leaves_a_channel_on_deleted_weights(
    request, backend, tmp_path, policies
):
    store = (FileStore(tmp_path / "store") if backend == "file"
             else request.getfixturevalue("seaweed_store"))
    from k3artifacts.releases.reviewing import review_code, review_license

    use_policy(store, policies)  # the reviews are read through the identities it names
    releases = Releases(store, tmp_path / "scratch")
    candidates = [releases.release() for _ in range(8)]
    for r in candidates:
        review_license(store, r.id, by=person("rita"))
        review_code(store, r.id, by=person("rita"))
    policy = load_gate_policy(policies)
    gates = policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace(
        "    gates: [artifact, license, remote_code]\n",
        "    gates: [artifact, license, remote_code]\n    rollback_window: 1\n", 1))
    policy = load_gate_policy(policies)
    promote(store, candidates[0].id, "staging", actor="ci", policies_dir=policies)
    stop = threading.Event()
    outcomes = {"moved": 0, "refused": 0, "retired": 0}
    errors = []
    rng = random.Random(os.getpid())

    def promoter():
        while not stop.is_set():
            r = rng.choice(candidates)
            try:
                promote(store, r.id, "staging", actor="ci", policies_dir=policies)
                outcomes["moved"] += 1
            except (Conflict, GateFailed, NotFound):
                outcomes["refused"] += 1  # retiring, gone, or another move won
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

    def collector():
        while not stop.is_set():
            try:
                for v in plan(store, policy, keep=1, keep_days=0):
                    if v.action == "retire" and retire(store, v, policy, who="gc").action == \
                            "retired":
                        outcomes["retired"] += 1
            except (NotFound, Conflict):
                pass  # a revision deleted under a plan that listed it
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

    threads = [threading.Thread(target=promoter), threading.Thread(target=promoter),
               threading.Thread(target=collector)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and not errors:
        _every_channel_is_servable(store)
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors
    _every_channel_is_servable(store)
    assert outcomes["retired"] > 0 and outcomes["moved"] > 0, outcomes


def test_gc_counts_only_bytes_whose_last_link_it_removed(local_hub, file_store, tmp_path,
                                                         policies, k3a_env):
    """A revision staged after another hard-links the files they share: retiring the older one
    gives back only what no kept revision links, and gc says so, before and after."""
    from tests.staging_helpers import REPO, run_stage, small_release

    files = small_release(tmp_path)
    old = local_hub.hub.add_commit(REPO, files)
    run_stage(local_hub.endpoint, file_store, tmp_path / "q")
    until_a_later_second(file_store)  # the second revision is the newest
    new = local_hub.hub.add_commit(REPO, {**files, "config.json": b'{"v": 2}'})
    run_stage(local_hub.endpoint, file_store, tmp_path / "q")
    old_dir = file_store.local_path(f"models/{REPO}/{old}")
    new_dir = file_store.local_path(f"models/{REPO}/{new}")
    shard = "model-00001-of-00002.safetensors"
    assert os.stat(old_dir / shard).st_ino == os.stat(new_dir / shard).st_ino  # one inode
    own = ["config.json", ".k3a/manifest.json", ".k3a/provenance.json"]
    assert all(os.stat(old_dir / p).st_nlink == 1 for p in own)
    unique = sum(os.stat(old_dir / p).st_size for p in own)
    total = sum(f.stat().st_size for f in old_dir.rglob("*") if f.is_file())
    assert unique < total // 10

    env = dict(k3a_env, K3A_STORE=file_store.url, K3A_POLICIES=str(policies))
    args = ["gc", "--keep", "1", "--keep-days", "0"]
    dry = invoke(*args, "--json", env=env).json
    (planned,) = [v for v in dry if v["action"] == "retire"]
    assert (planned["commit"], planned["bytes"], planned["freed"]) == (old, total, unique)
    applied = invoke(*args, "--apply", env=env)
    assert "shared with kept revisions stays" in applied.stdout
    assert applied.stdout.splitlines()[-1] == f"freed {human_bytes(unique)}"
    assert not old_dir.exists() and os.stat(new_dir / shard).st_nlink == 1
    assert file_store.read_manifest(REPO, new) is not None
