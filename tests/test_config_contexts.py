"""Named contexts in $XDG_CONFIG_HOME/k3a/config.yaml, as a team uses them for its staging and
production stores: made and chosen with `k3a config`, chosen per command by `--context` or
`K3A_CONTEXT`, and under the environment and the flags (flag > environment > context >
default). A config file someone else could have written, or one that is not what it should be,
is refused by name (exit 9) before any command reads it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.cli import invoke

IMAGE = "registry.example.com/vllm@sha256:" + "0" * 64
VERIFIER = "registry.example.com/k3a-worker@sha256:" + "1" * 64


@pytest.fixture
def two_stores(tmp_path):
    """Two stores, each with a demo release and a tuple of it (which binds where its weights
    are, so the two differ): (url, tuple id) by name."""
    stores = {}
    for name in ("staging", "production"):
        env = {"K3A_STORE": f"file://{tmp_path / name}"}
        commit = invoke("demo", "--size", "1MiB", "--shards", "1", "--json", env=env
                        ).json["commit"]
        tuple_id = invoke("tuple", "create", f"demo/Kimi-K3-synthetic@{commit}", "--offline",
                          "--profile", "p6-b300-tp8", "--image", IMAGE, "--verifier-image",
                          VERIFIER, env=env)
        stores[name] = (env["K3A_STORE"], tuple_id.stdout.split()[0])
    return stores


def _listed(*args: str, env=None) -> set[str]:
    return {line.split()[0] for line in invoke("tuple", "list", *args, env=env or {}
                                               ).stdout.splitlines() if line.startswith("k3t-")}


def test_contexts_choose_the_store_under_environment_and_flags(two_stores):
    (staging, in_staging), (production, in_production) = two_stores.values()
    assert in_staging != in_production
    invoke("config", "set-context", "staging", "--store", staging, "--channel", "staging")
    invoke("config", "set-context", "prod", "--store", production)
    invoke("config", "use", "staging")
    listed = invoke("config", "list").stdout.splitlines()
    assert listed == [f"  prod             {production}", f"* staging          {staging}"]

    unset = {"K3A_STORE": None, "K3A_CONTEXT": None}
    assert _listed(env=unset) == {in_staging}                       # the current context
    assert _listed(env={**unset, "K3A_CONTEXT": "prod"}) == {in_production}  # K3A_CONTEXT
    both = invoke("--context", "staging", "tuple", "list", env={**unset, "K3A_CONTEXT": "prod"})
    assert in_staging in both.stdout and in_production not in both.stdout   # --context wins
    # The environment overrides the context; a flag overrides both.
    assert _listed(env={"K3A_STORE": production, "K3A_CONTEXT": None}) == {in_production}
    assert _listed("--store", staging, env={"K3A_STORE": production,
                                            "K3A_CONTEXT": "prod"}) == {in_staging}

    shown = invoke("config", "show", "--json", env={**unset, "K3A_CHANNEL": "canary"}).json
    assert shown["context"] == "staging"
    assert shown["store"] == {"value": staging, "from": "context staging"}
    assert shown["channel"] == {"value": "canary", "from": "environment (K3A_CHANNEL)"}

    # A context the file does not hold is refused by name, whoever chose it.
    refused = invoke("--context", "nope", "tuple", "list", env=unset, expect=9)
    assert "no context 'nope'" in refused.stderr and "prod, staging" in refused.stderr
    assert "next: `k3a config list`" in refused.stderr
    invoke("config", "use", "nope", expect=9)
    invoke("config", "set-context", "bad name", "--store", staging, expect=2)


def test_the_config_file_is_this_accounts_alone(two_stores):
    invoke("config", "set-context", "staging", "--store", two_stores["staging"][0])
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "k3a" / "config.yaml"
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700


HOSTILE = {
    "world-writable": ("current-context: a\ncontexts: {a: {store: 'file:///tmp/x'}}\n", 0o666,
                       "is writable by others (mode 666)"),
    "group-writable": ("contexts: {}\n", 0o620, "is writable by others (mode 620)"),
    "unknown-key": ("contexts: {a: {store: 'file:///tmp/x', key: /tmp/evil.pem}}\n", 0o600,
                    "contexts.a.key: not a known field"),
    "unknown-top-level-key": ("profiles: {}\n", 0o600, "profiles: not a known field"),
    "wrong-type": ("contexts: {a: {store: 42}}\n", 0o600,
                   "contexts.a.store: got 42, expected a valid string"),
    "contexts-a-list": ("contexts: [a, b]\n", 0o600, "contexts: got list, expected an object"),
    "not-yaml": ("contexts: {a: [\n", 0o600, "is not YAML"),
    "bad-context-name": ("contexts: {'../x': {store: 'file:///tmp/x'}}\n", 0o600,
                         "contexts.../x"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_config_file_is_refused_by_name(tmp_path, case):
    text, mode, said = HOSTILE[case]
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "k3a" / "config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    path.chmod(mode)
    env = {"K3A_STORE": f"file://{tmp_path / 'store'}"}
    for args in (("tuple", "list"), ("config", "list")):
        ran = invoke(*args, env=env, expect=9)
        assert f"error: config file {path}" in ran.stderr and said in ran.stderr, ran.report()
        assert "next: " in ran.stderr and "Traceback" not in ran.stderr
    assert invoke("tuple", "list", "--json", env=env, expect=9).json["exit_code"] == 9


def test_a_config_file_of_another_account_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("giving a file to another account needs root")
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "k3a" / "config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("contexts: {}\n")
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    ran = invoke("config", "list", expect=9)
    assert f"config file {path} belongs to uid 65534, not to you" in ran.stderr


def test_a_contexts_identity_key_signs_unless_the_variable_names_another(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    keys = {}
    for name in ("team", "mine"):
        path = tmp_path / f"{name}.pem"
        path.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        path.chmod(0o600)
        keys[name] = str(path)
    invoke("config", "set-context", "team", "--identity-key", keys["team"])
    unset = {"K3A_IDENTITY_KEY": None, "K3A_CONTEXT": None}
    assert invoke("--context", "team", "key", "show", "--json", env=unset).json["source"] \
        == keys["team"]
    assert invoke("--context", "team", "key", "show", "--json",
                  env={"K3A_IDENTITY_KEY": keys["mine"]}).json["source"] == keys["mine"]
    # Without a context chosen, the personal key (none made yet: not found, nothing made).
    invoke("key", "show", env=unset, expect=7)
