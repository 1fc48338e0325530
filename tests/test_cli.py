"""The k3a command as a user runs it: a subprocess, exit codes, --json, messages."""

from __future__ import annotations

import json
import re
import subprocess

from tests.staging_helpers import REPO, small_release


def run(cmd, env, *args):
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=300)


def test_demo_publishes_and_verifies_then_is_a_noop(k3a_cmd, k3a_env, tmp_path):
    store = f"file://{tmp_path / 'store'}"
    first = run(k3a_cmd, k3a_env, "demo", "--size", "4MiB", "--shards", "2", "--store", store, "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["verified"] and not out["already_published"] and out["files"] > 5
    second = run(k3a_cmd, k3a_env, "demo", "--size", "4MiB", "--shards", "2", "--store", store, "--json")
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert again["already_published"] and again["manifest_digest"] == out["manifest_digest"]


def test_demo_next_revision_stages_a_second_commit_changing_one_file(k3a_cmd, k3a_env,
                                                                      tmp_path):
    """`k3a demo --next-revision --change FILE`: a new upstream commit in the demo's hub that
    changes FILE only; staging it downloads that file and shares every other one."""
    root = tmp_path / "store"
    common = ("--size", "4MiB", "--shards", "2", "--store", f"file://{root}", "--json")
    first = json.loads(run(k3a_cmd, k3a_env, "demo", *common).stdout)
    done = run(k3a_cmd, k3a_env, "demo", "--next-revision", "--change", "generation_config.json",
               *common)
    assert done.returncode == 0, done.stderr
    second = json.loads(done.stdout)
    assert second["upstream_commit"] == {"commit": second["commit"],
                                         "changed": "generation_config.json"}
    assert second["commit"] != first["commit"] and not second["already_published"]
    old, new = (root / "models" / "demo" / "Kimi-K3-synthetic" / c
                for c in (first["commit"], second["commit"]))
    changed = new / "generation_config.json"
    assert second["downloaded_bytes"] == changed.stat().st_size
    assert changed.read_bytes() != (old / "generation_config.json").read_bytes()
    shared = [p.name for p in old.iterdir() if p.is_file()
              and (new / p.name).stat().st_ino == p.stat().st_ino]
    assert len(shared) == first["files"] - 1
    # A file the demo's repo does not have is a usage error naming the ones it has.
    refused = run(k3a_cmd, k3a_env, "demo", "--next-revision", "--change", "nope.json", *common)
    assert refused.returncode == 2 and "config.json" in refused.stdout + refused.stderr


def test_stage_says_what_a_file_store_did_with_the_files(k3a_cmd, k3a_env, tmp_path):
    store = f"file://{tmp_path / 'store'}"
    done = run(k3a_cmd, k3a_env, "demo", "--size", "2MiB", "--shards", "1", "--store", store)
    assert done.returncode == 0, done.stderr
    # Files are linked (or copied) into the tree, never "uploaded"; counts and bytes apart.
    line = next(x for x in done.stdout.splitlines() if x.startswith("store files:"))
    assert "placed in the store's tree" in line and "uploaded" not in done.stdout
    assert re.search(r"\d+ placed in the store's tree \(hard link, else copy\) \([\d,]+ bytes\)",
                     line)


def test_stage_exit_codes(k3a_cmd, k3a_env, local_hub, tmp_path):
    files = small_release(tmp_path)
    files["weights.pkl"] = b"\x80\x04pickle"
    local_hub.hub.add_commit(REPO, files)
    store = f"file://{tmp_path / 'store'}"
    base = ("stage", REPO, "--endpoint", local_hub.endpoint, "--store", store, "-q")

    refused = run(k3a_cmd, k3a_env, *base)
    assert refused.returncode == 3
    assert "weights.pkl: [pickle]" in refused.stderr and "next:" in refused.stderr

    missing = run(k3a_cmd, k3a_env, *base, "--revision", "nope")
    assert missing.returncode == 7 and "revision not found" in missing.stderr

    bad_store = run(k3a_cmd, k3a_env, "stage", REPO, "--endpoint", local_hub.endpoint,
                    "--store", "file://host/x")
    assert bad_store.returncode == 9 and "file:///path" in bad_store.stderr

    allowed = run(k3a_cmd, k3a_env, *base, "--allow-pickle", "--json")
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["files"] == 8


def test_unreachable_hub_is_exit_8(k3a_cmd, k3a_env, tmp_path):
    proc = run(k3a_cmd, k3a_env, "stage", REPO, "--endpoint", "http://127.0.0.1:9",
               "--store", f"file://{tmp_path}/s", "-q")
    assert proc.returncode == 8 and "unavailable" in proc.stderr


def test_help_explains(k3a_cmd, k3a_env):
    proc = run(k3a_cmd, k3a_env, "--help")
    assert proc.returncode == 0 and "Exit codes" in proc.stdout
    for command in ("stage", "verify", "demo"):
        assert command in proc.stdout


def test_revisions_lists_what_is_published(k3a_cmd, k3a_env, local_hub, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    store = f"file://{tmp_path / 'store'}"
    missing = run(k3a_cmd, k3a_env, "revision", "list", REPO, "--store", store, "--json")
    assert missing.returncode == 7 and "no store at" in missing.stderr
    (tmp_path / "store").mkdir()
    empty = run(k3a_cmd, k3a_env, "revision", "list", REPO, "--store", store, "--json")
    assert empty.returncode == 0 and json.loads(empty.stdout) == []
    staged = run(k3a_cmd, k3a_env, "stage", REPO, "--endpoint", local_hub.endpoint,
                 "--store", store, "--json", "-q")
    assert staged.returncode == 0, staged.stderr
    listed = json.loads(run(k3a_cmd, k3a_env, "revision", "list", REPO, "--store", store, "--json").stdout)
    assert [r["commit"] for r in listed] == [commit]
    assert listed[0]["manifest_digest"] == json.loads(staged.stdout)["manifest_digest"]
