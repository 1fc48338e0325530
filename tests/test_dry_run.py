"""`--dry-run` on stage, promote, rollback and gc prints the plan of the move (its plan/act split:
docs/architecture.md) and touches nothing: the store's whole tree, hidden files and locks
included, is byte-identical afterwards, and no personal key or pin is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.staging_helpers import REPO, small_release
from tests.support.cli import invoke
from tests.support.witness import tree_snapshot

IMAGE = "registry.example.com/vllm@sha256:" + "0" * 64
VERIFIER = "registry.example.com/k3a-worker@sha256:" + "1" * 64


def _tuple(env, commit: str) -> str:
    return invoke("tuple", "create", f"demo/Kimi-K3-synthetic@{commit}", "--offline",
                  "--profile", "p6-b300-tp8", "--image", IMAGE, "--verifier-image", VERIFIER,
                  env=env).stdout.split()[0]


@pytest.fixture
def walked(tmp_path):
    """A store whose staging channel served tuple A, then B (reviews recorded)."""
    store = tmp_path / "store"
    env = {"K3A_STORE": f"file://{store}"}
    demo = ("demo", "--size", "2MiB", "--shards", "1", "--json")
    first = _tuple(env, invoke(*demo, env=env).json["commit"])
    invoke("review", "license", first, env=env)
    invoke("review", "code", first, env=env)
    invoke("promote", first, "staging", env=env)
    second = _tuple(env, invoke(*demo, "--next-revision", "--change", "config.json",
                                env=env).json["commit"])
    invoke("promote", second, "staging", env=env)
    return store, env, first, second


def _untouched(store: Path, config: Path, run):
    before, keys_before = tree_snapshot(store), tree_snapshot(config)
    ran = run()
    assert tree_snapshot(store) == before, "the dry run changed the store"
    assert tree_snapshot(config) == keys_before, "the dry run changed this client's files"
    return ran


def test_promote_and_rollback_dry_runs_print_the_plan_and_write_nothing(walked, tmp_path):
    store, env, first, second = walked
    config = Path(tmp_path / "home" / "config")  # XDG_CONFIG_HOME (tests/conftest.py)

    back = _untouched(store, config, lambda: invoke("rollback", "staging", "--dry-run",
                                                    env=env).stdout)
    assert f"dry run (rollback): would move staging: {second} -> {first}" in back
    assert "nothing written" in back
    plan = _untouched(store, config, lambda: invoke("rollback", "staging", "--dry-run",
                                                    "--json", env=env).json)
    assert (plan["dry_run"], plan["from"], plan["to"], plan["moves"]) == (True, second, first,
                                                                           True)
    assert [c["name"] for c in plan["checks"]] and all(c["passed"] for c in plan["checks"])

    there = _untouched(store, config, lambda: invoke("promote", second, "staging", "--dry-run",
                                                     env=env).stdout)
    assert f"staging already points at {second}: nothing to move" in there
    forward = _untouched(store, config, lambda: invoke("promote", first, "staging", "--dry-run",
                                                       "--json", env=env).json)
    assert (forward["action"], forward["from"], forward["to"]) == ("promote", second, first)
    assert {g["name"] for g in forward["checks"]} >= {"artifact", "license", "remote_code"}

    # Gates that fail: the table and the refusal, exit 5, still nothing written.
    refused = _untouched(store, config, lambda: invoke("promote", first, "production",
                                                       "--dry-run", env=env, expect=5))
    assert "evaluation" in refused.stdout and "cannot move onto production" in refused.stderr

    # The dry run does not go with the forms that record something.
    invoke("promote", first, "staging", "--dry-run", "--request-approval", env=env, expect=2)
    # The real move afterwards is the plan the dry run printed.
    moved = invoke("rollback", "staging", env=env).stdout
    assert f"staging: {second} -> {first}" in moved


def test_a_dry_run_by_someone_without_a_key_yet_makes_none(walked, tmp_path, monkeypatch):
    store, env, first, _ = walked
    fresh = tmp_path / "newcomer-config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(fresh))
    ran = invoke("rollback", "staging", "--dry-run", env=env, expect=None)
    assert ran.exit_code in (0, 9), ran.report()  # a key the policy does not name: refused
    assert not fresh.exists(), "a dry run made a personal key"


def test_gc_dry_run_is_the_plan_and_refuses_apply_beside_it(walked, tmp_path):
    store, env, *_ = walked
    config = Path(tmp_path / "home" / "config")
    said = _untouched(store, config, lambda: invoke("revision", "gc", "--dry-run", "--keep", "1",
                                                    env=env).stdout)
    assert "dry run: would free" in said
    invoke("revision", "gc", "--dry-run", "--apply", env=env, expect=2)


def test_stage_dry_run_plans_against_the_hub_and_writes_nothing(local_hub, tmp_path):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    store = tmp_path / "store"
    args = ("stage", REPO, "--endpoint", local_hub.endpoint, "--store", f"file://{store}")
    invoke(*args, "-q")
    local_hub.hub.add_commit(REPO, {**small_release(tmp_path), "config.json": b'{"v": 2}'})
    config = Path(tmp_path / "home" / "config")
    plan = _untouched(store, config, lambda: invoke(*args, "--dry-run", "--json").json)
    actions = {f["path"]: f["action"] for f in plan["files"]}
    assert actions["config.json"] == "download"
    assert {a for p, a in actions.items() if p != "config.json"} == {"reuse"}
    # A store that is not there yet is not made by the plan.
    fresh = tmp_path / "fresh"
    invoke("stage", REPO, "--endpoint", local_hub.endpoint, "--store", f"file://{fresh}",
           "--dry-run")
    assert not fresh.exists()
    invoke(*args, "--dry-run", "--repair", expect=2)
