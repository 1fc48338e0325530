"""What a node's start pays for before its first byte: the two commands the rendered init
containers run, `k3a pull` from S3 and `k3a verify DIR --expect-digest`, import only what their
work needs (issue 42's floor: every module an interpreter loads is start-up time, three
processes per commit). Run as a node runs them: whole processes, `-X importtime`."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.releases import Releases

#: Nothing a node's start needs: the Hub client and its HTTP stack, boto3's transfer layer,
#: signing and YAML (an unsigned revision), the OpenAI and Kubernetes clients, Prefect, rich.
NOT_AT_NODE_START = {"huggingface_hub", "httpx", "httpx2", "httpcore", "boto3", "s3transfer",
                     "yaml", "openai", "kubernetes", "prefect", "rich", "requests", "jinja2"}
#: The AWS SDK, which only a command that talks to S3 may load.
AWS = {"botocore", "awscrt", "urllib3"}


def imported(cmd: list[str], env: dict[str, str], *args: str) -> tuple[set[str], str]:
    """Top-level packages a real ``k3a ARGS`` process imported, and its stdout."""
    python, *rest = cmd
    proc = subprocess.run([python, "-X", "importtime", *rest, *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in proc.stderr.splitlines()
            if line.startswith("import time:")}, proc.stdout


@pytest.mark.s3
def test_a_node_start_imports_only_what_pull_and_verify_use(seaweed, seaweed_store, tmp_path,
                                                           k3a_cmd, k3a_env):
    releases = Releases(seaweed_store, tmp_path / "scratch")
    manifest = releases.publish(extra={"big.bin": b"x" * (1 << 20)})
    env = {**k3a_env, **seaweed.env}
    env.pop("AWS_SESSION_TOKEN", None)
    cache = tmp_path / "cache"
    modules, out = imported(k3a_cmd, env, "pull", f"{manifest.repo_id}@{manifest.commit}",
                            "--store", seaweed_store.url, "--to", str(cache), "--json")
    assert "botocore" in modules and "xxhash" in modules  # it did fetch and hash
    assert not modules & NOT_AT_NODE_START, sorted(modules & NOT_AT_NODE_START)
    pulled = json.loads(out)

    modules, _ = imported(k3a_cmd, k3a_env, "verify", pulled["path"], "--expect-digest",
                          pulled["manifest_digest"], "-q")
    assert "xxhash" in modules
    assert not modules & (NOT_AT_NODE_START | AWS), sorted(modules & (NOT_AT_NODE_START | AWS))

    modules, _ = imported(k3a_cmd, k3a_env, "pull", "--help")
    assert not modules & (NOT_AT_NODE_START | AWS), sorted(modules & (NOT_AT_NODE_START | AWS))
