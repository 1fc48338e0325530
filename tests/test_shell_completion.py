"""Shell completion as a shell runs it: bash sources the script `k3a` prints
(`_K3A_COMPLETE=bash_source k3a`) and calls its completion function, which runs k3a; zsh and fish
ask k3a the same way. Commands complete, and so do the store's tuple ids, channels and repos (from
`--store` on the line, else the environment or context); a store that cannot be read completes
nothing, silently."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import invoke

IMAGE = "registry.example.com/vllm@sha256:" + "0" * 64
VERIFIER = "registry.example.com/k3a-worker@sha256:" + "1" * 64
BIN = str(Path(sys.executable).parent)


@pytest.fixture
def store(tmp_path):
    env = {"K3A_STORE": f"file://{tmp_path / 'store'}"}
    commit = invoke("demo", "--size", "1MiB", "--shards", "1", "--json", env=env).json["commit"]
    tuple_id = invoke("tuple", "create", f"demo/Kimi-K3-synthetic@{commit}", "--offline",
                      "--profile", "p6-b300-tp8", "--image", IMAGE, "--verifier-image",
                      VERIFIER, env=env).stdout.split()[0]
    invoke("review", "license", tuple_id, env=env)
    invoke("review", "code", tuple_id, env=env)
    invoke("promote", tuple_id, "staging", env=env)
    return env["K3A_STORE"], tuple_id


def _bash(k3a_env, words: list[str], store_url: str | None) -> list[str]:
    """COMPREPLY of bash's completion of ``words`` (the last one being typed)."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    env = {**k3a_env, "PATH": BIN + os.pathsep + k3a_env.get("PATH", "")}
    if store_url is not None:
        env["K3A_STORE"] = store_url
    quoted = " ".join(f"'{w}'" for w in words)
    script = (f'source <(_K3A_COMPLETE=bash_source k3a); COMP_WORDS=({quoted}); '
              f'COMP_CWORD={len(words) - 1}; _k3a_completion k3a; '
              'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_bash_completes_commands_tuple_ids_channels_and_repos(store, k3a_env):
    url, tuple_id = store
    assert _bash(k3a_env, ["k3a", "pro"], url) == ["promote"]
    assert _bash(k3a_env, ["k3a", "tuple", "show", ""], url) == [tuple_id]
    assert _bash(k3a_env, ["k3a", "promote", tuple_id, "st"], url) == ["staging"]
    assert _bash(k3a_env, ["k3a", "render", ""], url) == sorted([tuple_id, "staging"])
    assert _bash(k3a_env, ["k3a", "revision", "list", "de"], url) == ["demo/Kimi-K3-synthetic"]
    # The store named on the line is the one read.
    assert _bash(k3a_env, ["k3a", "tuple", "show", "--store", url, "k3t-"], None) == [tuple_id]


def test_a_store_that_cannot_be_read_completes_nothing_quietly(store, k3a_env, tmp_path):
    for url in ("s4://nowhere", f"file://{tmp_path / 'absent'}", "file:///proc/k3a"):
        assert _bash(k3a_env, ["k3a", "tuple", "show", ""], url) == []


def _asked(k3a_env, shell: str, words: str, cword: str, store_url: str) -> str:
    env = {**k3a_env, "K3A_STORE": store_url, "_K3A_COMPLETE": f"{shell}_complete",
           "COMP_WORDS": words, "COMP_CWORD": cword}
    done = subprocess.run([sys.executable, "-m", "k3artifacts"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


def test_zsh_and_fish_are_answered_too(store, k3a_env):
    url, tuple_id = store
    # zsh passes the index of the word typed; fish passes the word itself.
    assert tuple_id in _asked(k3a_env, "zsh", "k3a tuple show ", "3", url).split("\n")
    assert "staging" in _asked(k3a_env, "fish", "k3a channel history ", "", url)
    for shell, marker in (("zsh", "#compdef k3a"), ("fish", "complete --no-files --command k3a")):
        env = {**k3a_env, "_K3A_COMPLETE": f"{shell}_source"}
        script = subprocess.run([sys.executable, "-m", "k3artifacts"], env=env,
                                capture_output=True, text=True, timeout=60, check=True).stdout
        assert marker in script
