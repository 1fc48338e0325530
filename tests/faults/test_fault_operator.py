"""Bad operator input: malformed or unreachable store URLs and hub endpoints, bad repo ids,
revisions and targets. Outcome: one line saying what is wrong, a ``next:`` line saying what to
do, the documented exit code, and nothing written anywhere.

The real ``k3a`` command runs in-process (click's runner: the same code, exit codes and
streams, without a 3-second interpreter start per case); one case runs as a separate process
to show the codes reach the shell. Channel, tuple id, image tag and profile input are covered
where those commands live (see README.md in this directory).
"""

from __future__ import annotations

import pytest

from tests.staging_helpers import REPO
from tests.support.cli import Ran, invoke, run_process

pytestmark = pytest.mark.faults

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def k3a(k3a_env, tmp_path):
    def run(*args: str) -> Ran:
        return invoke(*args, env={**k3a_env, "K3A_QUARANTINE": str(tmp_path / "q")},
                      expect=None)

    return run


def assert_told(ran: Ran, expect: int, *words: str) -> None:
    ran.expect(expect)
    stderr = ran.stderr
    lines = stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and lines[-1].startswith("next: "), stderr
    assert "Traceback" not in stderr
    for word in words:
        assert word in stderr


def assert_untouched(tmp_path, *names: str) -> None:
    for name in names:
        assert not (tmp_path / name).exists(), f"{name} was created"


@pytest.mark.parametrize(
    "url,words",
    [
        ("file://nfs-host/k3a", ["has a host", "file:///path"]),
        ("ftp://example.com/k3a", ["unsupported store URL"]),
        ("s3://Not_A_Bucket/k3a", ["not a valid S3 bucket name"]),
        ("s3://", ["not an s3://bucket"]),
        ("s3://bucket/k3a?region=us-west-2", ["query or fragment"]),
    ],
    ids=["file-with-host", "ftp", "s3-bad-bucket", "s3-no-bucket", "s3-query"],
)
@pytest.mark.parametrize("command", ["stage", "verify"])
def test_malformed_store_url(k3a, local_hub, tmp_path, url, words, command):
    if command == "stage":
        args = ["stage", REPO, "--endpoint", local_hub.endpoint, "--store", url, "-q"]
    else:
        args = ["verify", f"{REPO}@{COMMIT}", "--store", url, "-q"]
    assert_told(k3a(*args), 9, *words)
    assert local_hub.hub.requests == []
    assert_untouched(tmp_path, "q", "home/data")


def test_unreachable_s3_endpoint(k3a, s3_env, tmp_path, monkeypatch):
    # boto3 retries a refused connection (10 attempts by default, about 30 s): two here.
    env = {**s3_env, "K3A_S3_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "2"}
    result = invoke("verify", f"{REPO}@{COMMIT}", "--store", "s3://k3a-x/p", env=env,
                    expect=None)
    assert_told(result, 8, "cannot reach the endpoint", "K3A_S3_ENDPOINT_URL")


@pytest.mark.parametrize(
    "args,expect,words",
    [
        (["--endpoint", "huggingface.co"], 9, ["not a valid http(s) URL", "--endpoint"]),
        (["--endpoint", "http://127.0.0.1:99999"], 9, ["not a valid http(s) URL"]),
        (["--endpoint", "http://127.0.0.1:9", "--retries", "1"], 8, ["unavailable", "re-run"]),
    ],
    ids=["endpoint-without-scheme", "endpoint-bad-port", "hub-unreachable"],
)
def test_bad_hub_endpoint(k3a, file_store, tmp_path, args, expect, words):
    assert_told(k3a("stage", REPO, "--store", file_store.url, "-q", *args), expect, *words)
    assert not file_store.root.exists()


@pytest.mark.parametrize(
    "repo,revision,expect,words",
    [
        ("Kimi-K3", "main", 2, ["not a Hub repo id", "org/name"]),
        ("moonshotai/../etc", "main", 2, ["not a Hub repo id"]),
        ("moonshotai/Kimi-K4", "main", 7, ["repository not found"]),
        (REPO, "v9.9", 7, ["revision not found"]),
    ],
    ids=["no-org", "traversal", "unknown-repo", "unknown-revision"],
)
def test_bad_repo_or_revision(k3a, local_hub, file_store, tmp_path, repo, revision, expect, words):
    from tests.staging_helpers import small_release

    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    assert_told(k3a("stage", repo, "--revision", revision, "--endpoint", local_hub.endpoint,
                    "--store", file_store.url, "--retries", "1", "-q"), expect, *words)
    assert not [r for r in local_hub.hub.requests if "/resolve/" in r.url]
    assert not file_store.root.exists()


@pytest.mark.parametrize(
    "target,expect,words",
    [
        ("moonshotai/Kimi-K3@main", 2, ["neither org/name@<40-hex commit>"]),
        (f"Kimi-K3@{COMMIT}", 2, ["not a Hub repo id"]),
        (f"{REPO}@{COMMIT}", 7, ["not published", "k3a stage"]),
        ("/no/such/revision/dir", 2, ["neither"]),
    ],
    ids=["branch-not-commit", "bad-repo", "unpublished", "missing-directory"],
)
def test_bad_verify_target(k3a, file_store, target, expect, words):
    file_store.root.mkdir(parents=True)  # an empty store: the target, not the store, is wrong
    assert_told(k3a("verify", target, "--store", file_store.url, "-q"), expect, *words)


def test_exit_code_and_hint_reach_the_shell(k3a_cmd, k3a_env, tmp_path):
    proc = run_process("stage", REPO, "--store", "file://host/x", "-q",
                       env=k3a_env, cmd=k3a_cmd, expect=None)
    assert_told(proc, 9, "file:///path")
    assert proc.stdout == ""
