"""What an operator sees on long and failing runs (issue 16): progress off a terminal, fast
failure on an endpoint that cannot be reached, a missing store, the advice of each error, and
Ctrl-C.

Staging runs as a real ``k3a`` subprocess (stderr is a pipe, as in a Kubernetes Job) against
the local hub slowed down by its ``stall`` fault; message cases run in-process through click's
runner (same code, streams and exit codes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from k3artifacts.releases.tuples import tuple_key
from tests.staging_helpers import REPO, small_release
from tests.support.cli import invoke
from tests.support.hubfaults import Fault

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def run(cmd, env, *args, timeout=120):
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=timeout)


def next_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("next: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def json_progress(stderr: str) -> list[dict]:
    docs = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [d for d in docs if d.get("event") == "progress"]


# ---- progress when stderr is not a terminal ---------------------------------------------------


@pytest.fixture
def slow_hub(local_hub, tmp_path):
    """Two 1 MiB shards, each stalling 1.5 s halfway through its body."""
    local_hub.hub.add_commit(REPO, small_release(tmp_path, shard_bytes=1 << 20))
    local_hub.hub.faults.add("*.safetensors", Fault.stall(1.5, after_bytes=512 << 10, times=2))
    return local_hub


def test_stage_off_a_terminal_logs_periodic_json_progress(k3a_cmd, k3a_env, slow_hub, tmp_path):
    proc = run(k3a_cmd, k3a_env, "stage", REPO, "--endpoint", slow_hub.endpoint,
               "--store", f"file://{tmp_path / 'store'}", "--progress-interval", "0.25",
               "--log-format", "json", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    lines = json_progress(proc.stderr)
    periodic = [d for d in lines if not d["final"]]
    # ~1.5 s of stall at one line per 0.25 s: several lines while nothing moves.
    assert len(periodic) >= 3, proc.stderr
    done = [d["bytes_done"] for d in lines]
    assert done == sorted(done), "byte counts must never go back"
    assert all(d["bytes_total"] == result["total_bytes"] for d in lines)
    assert all(d["files_total"] == result["files"] and d["phase"] == "staging" for d in lines)
    assert any(0 < d["bytes_done"] < d["bytes_total"] for d in periodic)
    assert {"rate_bytes_per_s", "eta_s", "files_done", "ts", "level"} <= set(lines[0])
    final = lines[-1]
    assert final["final"] and final["bytes_done"] == final["bytes_total"]
    assert final["files_done"] == final["files_total"]


def test_stage_off_a_terminal_logs_text_lines_from_the_environment(
    k3a_cmd, k3a_env, slow_hub, tmp_path
):
    env = {**k3a_env, "K3A_PROGRESS_INTERVAL": "0.25"}
    proc = run(k3a_cmd, env, "stage", REPO, "--endpoint", slow_hub.endpoint,
               "--store", f"file://{tmp_path / 'store'}")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if " staging: " in line]
    assert len(lines) >= 4, proc.stderr
    assert all(" of " in line and "/s" in line and "files " in line for line in lines)
    assert "ETA" in "".join(lines[:-1]) and "done in" in lines[-1]


def test_verify_reports_progress_lines_too(k3a_cmd, k3a_env, local_hub, tmp_path):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    store = f"file://{tmp_path / 'store'}"
    staged = run(k3a_cmd, k3a_env, "stage", REPO, "--endpoint", local_hub.endpoint,
                 "--store", store, "-q", "--json")
    commit, files = json.loads(staged.stdout)["commit"], json.loads(staged.stdout)["files"]
    proc = run(k3a_cmd, k3a_env, "verify", f"{REPO}@{commit}", "--store", store,
               "--log-format", "json")
    assert proc.returncode == 0, proc.stderr
    (final,) = json_progress(proc.stderr)
    assert final["phase"] == "verifying" and final["bytes_done"] == final["bytes_total"] > 0
    assert final["files_done"] == final["files_total"] == files


# ---- endpoints that cannot be reached ---------------------------------------------------------


@pytest.mark.parametrize(
    "endpoint,why",
    [("http://k3a-no-such-host.invalid", "does not resolve"),
     ("http://127.0.0.1:9", "connection refused")],
    ids=["dns", "refused"],
)
def test_unreachable_hub_fails_fast_naming_endpoint(k3a_cmd, k3a_env, tmp_path, endpoint, why):
    started = time.monotonic()
    proc = run(k3a_cmd, k3a_env, "stage", "moonshotai/Kimi-K3", "--endpoint", endpoint,
               "--store", f"file://{tmp_path / 'store'}")
    elapsed = time.monotonic() - started
    assert proc.returncode == 8, proc.stderr
    assert elapsed < 5, f"took {elapsed:.1f} s"
    assert endpoint in proc.stderr and why in proc.stderr
    assert "HF_ENDPOINT" in next_line(proc.stderr)


def test_unreachable_s3_fails_fast_naming_the_variable(k3a_env, tmp_path):
    env = {**k3a_env, "K3A_S3_ENDPOINT_URL": "http://k3a-no-such-host.invalid:9000",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1"}
    env.pop("AWS_MAX_ATTEMPTS", None)
    started = time.monotonic()
    stderr = invoke("revision", "list", REPO, "--store", "s3://k3a-bucket/k3a", env=env,
                    expect=8).stderr
    assert time.monotonic() - started < 5
    assert "k3a-no-such-host.invalid:9000" in stderr
    assert "K3A_S3_ENDPOINT_URL" in next_line(stderr)


# ---- a store that is not there ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["revision", "list", REPO],
        ["channel", "list"],
        ["channel", "history", "production"],
        ["tuple", "list"],
        ["verify", f"{REPO}@{COMMIT}"],
        ["render", "production", "--target", "eks"],
        ["rollback", "production"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_missing_store_is_an_error_for_read_commands(k3a_env, tmp_path, args):
    missing = tmp_path / "no" / "such-store"
    refused = invoke(*args, "--store", f"file://{missing}", env=k3a_env, expect=7)
    assert f"no store at file://{missing}" in refused.stderr
    assert "K3A_STORE" in next_line(refused.stderr)
    assert refused.stdout == "" and not missing.exists()


@pytest.mark.s3
def test_a_missing_bucket_is_an_error(s3_env):
    stderr = invoke("channel", "list", "--store", "s3://k3a-no-such-bucket/k3a", env=s3_env,
                    expect=7).stderr
    assert "no store at s3://k3a-no-such-bucket/k3a" in stderr


def test_an_empty_existing_store_is_fine(k3a_env, tmp_path):
    (tmp_path / "store").mkdir()
    listed = invoke("channel", "list", "--store", f"file://{tmp_path / 'store'}", env=k3a_env)
    assert "no channels yet" in listed.stdout


# ---- each error with its own advice -----------------------------------------------------------


@pytest.fixture
def tampered(tmp_path):
    from k3artifacts.stores.file import FileStore
    from tests.support.releases import Releases

    store = FileStore(tmp_path / "store")
    release = Releases(store, tmp_path / "scratch").release()
    path = store.local_path(tuple_key(release.id))
    body = json.loads(path.read_text())
    body["binding"]["serving"]["args"].append("--enforce-eager")
    path.chmod(0o644)
    path.write_text(json.dumps(body))
    return store, release


@pytest.mark.parametrize("command", [["tuple", "show"], ["render", "--target", "eks"]],
                         ids=["tuple-show", "render"])
def test_a_tampered_tuple_has_its_own_advice(k3a_env, tampered, command):
    store, release = tampered
    args = [*command[:1], release.id, *command[1:]] if command[0] == "render" else [
        *command, release.id]
    stderr = invoke(*args, "--store", store.url, env=k3a_env, expect=4).stderr
    assert "1 record(s) refused" in stderr and "tuple-tampered" in stderr
    advice = next_line(stderr)
    assert "changed outside k3a" in advice and "restore" in advice
    assert "published" not in advice and "allowance" not in advice


def test_rollback_of_a_channel_the_policy_refuses_does_not_suggest_promoting(
    k3a_env, tampered
):
    store, _ = tampered  # no policy recorded yet: the packaged defaults name the channels
    stderr = invoke("rollback", "canary", "--store", store.url, env=k3a_env, expect=7).stderr
    advice = next_line(stderr)
    assert "not a channel of the gate policy" in advice and "production, staging" in advice
    assert "k3a promote" not in advice
    # A channel the policy allows but nobody promoted to yet: promoting is the way.
    stderr = invoke("rollback", "staging", "--store", store.url, env=k3a_env, expect=7).stderr
    assert "k3a promote <tuple-id> staging" in next_line(stderr)
    stderr = invoke("channel", "history", "canary", "--store", store.url, env=k3a_env,
                    expect=7).stderr
    assert "not a channel of the gate policy" in next_line(stderr)


@pytest.mark.parametrize("digest", ["deadbeef", "sha256:" + "a" * 64, "A" * 64])
def test_a_malformed_expected_digest_is_a_usage_error(k3a_env, tmp_path, digest):
    (tmp_path / "store").mkdir()
    stderr = invoke("verify", f"{REPO}@{COMMIT}", "--expect-digest", digest,
                    "--store", f"file://{tmp_path / 'store'}", env=k3a_env, expect=2).stderr
    assert "is not a manifest digest" in stderr and "64 hex" in next_line(stderr)
    assert "re-stage" not in stderr


@pytest.mark.parametrize("bad_id", ["k3t-xyz", "K3T-" + "a" * 24])
def test_a_malformed_tuple_id_is_a_usage_error(k3a_env, tmp_path, bad_id):
    (tmp_path / "store").mkdir()
    stderr = invoke("tuple", "show", bad_id, "--store",
                    f"file://{tmp_path / 'store'}", env=k3a_env, expect=2).stderr
    assert "k3t-<24 hex>" in next_line(stderr)


@pytest.mark.parametrize(
    "report,words",
    [
        ({"suite": "mmlu", "passed": "ten", "total": 12},
         ["passed: got 'ten', expected a valid integer"]),
        ({"suite": "mmlu", "total": 12}, ["passed: missing"]),
        ({"suite": "mmlu", "passed": 13, "total": 12}, ["passed (13) is more than total (12)"]),
        ([1, 2], ["expected an object"]),
    ],
    ids=["not-a-number", "missing-field", "passed-above-total", "not-an-object"],
)
def test_a_bad_evaluation_report_is_explained_in_plain_words(
    k3a_env, tmp_path, report, words
):
    from k3artifacts.stores.file import FileStore
    from tests.support.releases import Releases

    store = FileStore(tmp_path / "store")
    release = Releases(store, tmp_path / "scratch").release()
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    stderr = invoke("eval", "attach", release.id, str(path), "--store",
                    store.url, env=k3a_env, expect=9).stderr
    assert str(path) in stderr
    for word in words:
        assert word in stderr
    assert "pydantic" not in stderr and "http" not in stderr and "type=" not in stderr
    assert '"suite"' in next_line(stderr)


def test_verify_counts_only_files_of_the_manifest(k3a_env, tmp_path):
    from k3artifacts.stores.file import FileStore
    from tests.support.releases import Releases

    store = FileStore(tmp_path / "store")
    published = Releases(store, tmp_path / "scratch").publish()
    root = store.local_path(f"models/{published.repo_id}/{published.commit}")
    root.chmod(0o755)
    (root / "stray.bin").write_bytes(b"not listed")
    stderr = invoke("verify", f"{published.repo_id}@{published.commit}",
                    "--store", store.url, "-q", env=k3a_env, expect=4).stderr
    assert "1 file(s) not in the manifest" in stderr
    assert " of " not in stderr.splitlines()[0], "no file of the manifest is wrong"


# ---- Ctrl-C -----------------------------------------------------------------------------------


def test_ctrl_c_mid_stage_exits_130_and_a_rerun_resumes(k3a_cmd, k3a_env, local_hub, tmp_path):
    local_hub.hub.add_commit(REPO, small_release(tmp_path, shard_bytes=2 << 20))
    local_hub.hub.faults.add("*.safetensors", Fault.stall(4, after_bytes=1 << 20, times=2))
    store = f"file://{tmp_path / 'store'}"
    args = ["stage", REPO, "--endpoint", local_hub.endpoint, "--store", store,
            "--log-format", "json", "--progress-interval", "0.1"]
    proc = subprocess.Popen([*k3a_cmd, *args], env=k3a_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:  # wait until bytes of the shards are arriving
            seen.append(line)
            if line.startswith("{") and json.loads(line).get("bytes_done", 0) > (1 << 20):
                break
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=20)[1]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, "".join(seen) + rest
    assert time.monotonic() - started < 5, "Ctrl-C must not wait for transfers to drain"
    assert "interrupted" in rest
    assert "re-run the same command to resume" in next_line(rest)
    assert not (tmp_path / "store" / "models").exists() or not list(
        (tmp_path / "store" / "models").rglob("manifest.json"))

    local_hub.hub.faults.clear()
    again = run(k3a_cmd, k3a_env, "stage", REPO, "--endpoint", local_hub.endpoint,
                "--store", store, "-q", "--json")
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout)
    assert not result["already_published"]
    assert result["downloaded_bytes"] < result["total_bytes"], "the re-run started over"


# ---- once an endpoint answered: the retry policy, each retry logged ---------------------------


def test_hub_errors_after_first_contact_are_retried_and_logged(k3a_cmd, k3a_env, local_hub,
                                                               tmp_path):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    # The hub answers (so it is reachable), but 503 twice to resolving the revision: the
    # retry policy applies (huggingface_hub retries the listing itself, with its own log).
    local_hub.hub.faults.add("/api/models/*/revision/*", Fault.http_status(503, times=2))
    proc = run(k3a_cmd, k3a_env, "stage", REPO, "--endpoint", local_hub.endpoint,
               "--store", f"file://{tmp_path / 'store'}", "-q", "--retries", "4",
               "--log-format", "json")
    assert proc.returncode == 0, proc.stderr
    retries = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    retries = [r for r in retries if r["level"] == "warning" and "retrying" in r["message"]]
    assert len(retries) == 2, proc.stderr
    assert "attempt 1 of 4" in retries[0]["message"] and "503" in retries[0]["message"]


@pytest.mark.s3
def test_s3_errors_after_first_contact_are_retried_and_logged(s3_env, s3_store, s3_url,
                                                              s3_fault_proxy, tmp_path):
    from tests.support.releases import Releases

    manifest = Releases(s3_store, tmp_path / "scratch").publish()
    s3_fault_proxy.add("GetObject", "*/.k3a/manifest.json", times=2)
    env = {**s3_env, "K3A_S3_ENDPOINT_URL": s3_fault_proxy.endpoint}
    listed = invoke("revision", "list", manifest.repo_id, "--store", s3_url, "--json", env=env)
    assert [r["commit"] for r in listed.json] == [manifest.commit]
    logged = [line for line in listed.stderr.splitlines() if "retrying per policy" in line]
    assert len(logged) == 2 and all("HTTP 503" in line for line in logged), listed.stderr


# ---- the demo's path --------------------------------------------------------------------------


def test_demo_keeps_its_files_with_the_store_and_points_down_the_offline_path(k3a_env, tmp_path):
    store = tmp_path / "elsewhere" / "store"
    env = {**k3a_env, "K3A_STORE": f"file://{store}"}
    out = invoke("demo", "--size", "2MiB", "--shards", "2", "--json", "-q", env=env).json
    assert (store / ".k3a-demo").is_dir()
    assert not (Path(k3a_env["XDG_DATA_HOME"]) / "k3artifacts" / "demo").exists()
    steps = out["next"]
    # Each line runs the k3a that ran the demo (here `python -m k3artifacts`: no k3a on PATH).
    k3a = "-m k3artifacts " if "-m k3artifacts" in steps[0] else "k3a "
    verbs = [s.split(k3a, 1)[1].split()[0] for s in steps]
    assert verbs == ["tuple", "review", "review", "promote", "render"]
    assert f"tuple create demo/Kimi-K3-synthetic@{out['commit']}" in steps[0]
    assert steps[0].startswith("TUPLE=$(") and "--offline" in steps[0] and "@sha256:" in steps[0]
    assert "verify" not in " ".join(steps), "the demo just verified; next is the release path"


def test_an_unreachable_registry_suggests_offline(k3a_env, tmp_path):
    from k3artifacts.stores.file import FileStore
    from tests.support.releases import Releases

    store = FileStore(tmp_path / "store")
    manifest = Releases(store, tmp_path / "scratch").publish()
    stderr = invoke("tuple", "create", f"{manifest.repo_id}@{manifest.commit}",
                    "--image", "127.0.0.1:9/vllm:v1", "--profile", "p6-b300-tp8",
                    "--store", store.url, env=k3a_env, expect=8).stderr
    assert "--offline" in next_line(stderr) and "@sha256:" in next_line(stderr)


@pytest.mark.s3
def test_stage_to_s3_reports_what_the_store_received(k3a_cmd, s3_env, s3_url, local_hub,
                                                     tmp_path):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    proc = run(k3a_cmd, s3_env, "stage", REPO, "--endpoint", local_hub.endpoint,
               "--store", s3_url, "--log-format", "json", "--json",
               "--quarantine", str(tmp_path / "q"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    final = json_progress(proc.stderr)[-1]
    assert final["final"] and final["bytes_stored"] == result["total_bytes"]


def test_a_download_host_that_never_answered_fails_fast(tmp_path):
    from k3artifacts.errors import Unavailable
    from k3artifacts.net.policy import RetryPolicy
    from k3artifacts.revisions.hashing import MultiHasher
    from k3artifacts.staging.download import fetch

    started = time.monotonic()
    with pytest.raises(Unavailable, match="never answered") as err:
        fetch("http://k3a-no-such-host.invalid/x.safetensors", {}, tmp_path / "x.part", 10,
              MultiHasher, policy=RetryPolicy(attempts=8), label="x.safetensors")
    assert time.monotonic() - started < 5
    assert "HF_ENDPOINT" in err.value.hint
