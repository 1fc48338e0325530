"""Mistakes a newcomer makes on a first day with k3a, each run as typed: no traceback, a
message naming the cause, a `next:` step, the exit code of the table (docs/reference/
exit-codes.md), the same under --json as one document, and nothing made before the input was
refused (no personal key, no store directory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from k3artifacts.localhub import LocalHub
from k3artifacts.localhub.synthetic import write_release
from tests.support.cli import invoke
from tests.support.ports import free_ports

COMMIT_ZERO = "0" * 40
IMAGE = "registry.example.com/vllm@sha256:" + "0" * 64
VERIFIER = "registry.example.com/k3a-worker@sha256:" + "1" * 64
DEMO_REPO = "demo/Kimi-K3-synthetic"
HUB_REPO = "demo/tiny"


@dataclass
class World:
    store: str
    hub: str
    commit: str
    tuple_id: str
    home: Path
    env: dict[str, str | None] = field(default_factory=dict)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("newcomer")
    home = root / "home"
    env: dict[str, str | None] = {
        "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_DATA_HOME": str(home / "data"), "HF_HOME": str(home / "hf"),
        "HF_TOKEN": None, "HF_ENDPOINT": None, "K3A_CONTEXT": None,
        "HF_HUB_DISABLE_XET": "1", "K3A_STORE": f"file://{root / 'store'}",
    }
    demo = invoke("demo", "--size", "2MiB", "--shards", "1", "--json", env=env).json
    tuple_id = invoke("tuple", "create", f"{DEMO_REPO}@{demo['commit']}", "--offline",
                      "--profile", "p6-b300-tp8", "--image", IMAGE, "--verifier-image",
                      VERIFIER, env=env).stdout.split()[0]
    hub = LocalHub(root / "hub", tokens={"hf_good"})
    hub.add_commit(HUB_REPO, write_release(root / "release", total_bytes=1 << 20, shards=1))
    endpoint = hub.start()
    yield World(store=env["K3A_STORE"], hub=endpoint, commit=demo["commit"],
                tuple_id=tuple_id, home=home, env=env)
    hub.stop()


@dataclass(frozen=True)
class Mistake:
    args: tuple[str, ...]
    code: int
    cause: str
    env: dict[str, str] = field(default_factory=dict)
    #: Whether the command takes --json (a failure still prints one document with it).
    json: bool = True


def _m(code: int, cause: str, *args: str, env: dict[str, str] | None = None,
       json: bool = True) -> Mistake:
    return Mistake(args, code, cause, env or {}, json)


CLOSED_PORT = free_ports(1)[0]

#: id -> the mistake; {hub}, {tuple}, {commit}, {store}, {closed} are filled in from the world.
MISTAKES = {
    "command-typo": _m(2, "No such command 'promte'. Did you mean 'promote'", "promte"),
    "missing-argument": _m(2, "Missing argument 'REPO_ID'", "stage"),
    "option-typo": _m(2, "No such option '--revison'", "stage", HUB_REPO, "--revison", "main"),
    "not-a-repo-id": _m(2, "'Kimi-K3' is not a Hub repo id", "stage", "Kimi-K3"),
    "endpoint-without-scheme": _m(9, "hub endpoint 'localhost:8080' is not a valid http(s) URL",
                                  "stage", HUB_REPO, "--endpoint", "localhost:8080"),
    "hub-not-running": _m(8, "connection refused", "stage", HUB_REPO, "--endpoint",
                          "http://127.0.0.1:{closed}"),
    "unknown-repo": _m(7, "demo/nope@main: repository not found", "stage", "demo/nope",
                       "--endpoint", "{hub}"),
    "unknown-branch": _m(7, f"{HUB_REPO}@v9: revision not found", "stage", HUB_REPO,
                         "--revision", "v9", "--endpoint", "{hub}"),
    "unknown-commit": _m(7, "revision not found", "stage", HUB_REPO, "--revision",
                         COMMIT_ZERO, "--endpoint", "{hub}"),
    "wrong-hf-token": _m(10, "the hub refused the token: HTTP 401", "stage", HUB_REPO,
                         "--endpoint", "{hub}", env={"HF_TOKEN": "hf_typo"}),
    "store-path-cannot-be-made": _m(9, "none can be made there: /proc is where it would start",
                                    "stage", HUB_REPO, "--endpoint", "{hub}", "--store",
                                    "file:///proc/k3a"),
    "store-path-under-a-file": _m(9, "/etc/hostname is where it would start, and it is not a "
                                  "directory", "stage", HUB_REPO, "--endpoint", "{hub}",
                                  "--store", "file:///etc/hostname/k3a"),
    "store-scheme": _m(9, "unsupported store URL 's4://bucket/k3a'", "tuple", "list",
                       "--store", "s4://bucket/k3a"),
    "store-url-two-slashes": _m(9, "store URL 'file://srv/k3a' has a host", "tuple", "list",
                                "--store", "file://srv/k3a"),
    "store-typo": _m(7, "no store at file:///tmp/no-such-k3a-store", "tuple", "list",
                     "--store", "file:///tmp/no-such-k3a-store"),
    "store-env-typo": _m(7, "no store at file:///tmp/no-such-k3a-store", "channel", "list",
                         env={"K3A_STORE": "file:///tmp/no-such-k3a-store"}),
    "malformed-env": _m(9, "K3A_HTTP_CONNECT_TIMEOUT: got 'abc'", "stage", HUB_REPO,
                        env={"K3A_HTTP_CONNECT_TIMEOUT": "abc"}),
    "short-tuple-id": _m(2, "'k3t-c833' is not a tuple id", "tuple", "show", "k3t-c833"),
    "unknown-tuple": _m(7, "tuple k3t-000000000000000000000000 is not in", "tuple", "show",
                        "k3t-000000000000000000000000"),
    "review-malformed-id": _m(2, "'k3t-zz' is not a tuple id", "review", "license", "k3t-zz"),
    "promote-unknown-channel": _m(7, "channel 'prod' is not configured in the store's policy",
                                  "promote", "{tuple}", "prod"),
    "rollback-never-promoted": _m(7, "channel 'staging' has never been promoted to",
                                  "rollback", "staging"),
    "history-unknown-channel": _m(7, "channel 'nochan' has never been promoted to", "channel",
                                  "history", "nochan"),
    "verify-branch-not-commit": _m(2, f"'{DEMO_REPO}@main' is neither org/name@<40-hex "
                                   "commit>", "verify", f"{DEMO_REPO}@main"),
    "verify-unpublished-commit": _m(7, f"{DEMO_REPO}@{COMMIT_ZERO} is not published", "verify",
                                    f"{DEMO_REPO}@{COMMIT_ZERO}"),
    "render-unknown-target": _m(2, "'k8s' is not one of hyperpod, eks", "render", "{tuple}",
                                "--target", "k8s", "--out", "/tmp/k3a-never"),
    "render-unknown-channel": _m(7, "'prod' is not a tuple id and there is no channel prod",
                                 "render", "prod", "--target", "eks", "--out", "/tmp/k3a-never"),
    "image-tag-offline": _m(9, "image vllm:latest is a tag and no digest", "tuple", "create",
                            f"{DEMO_REPO}@{{commit}}", "--offline", "--profile", "p6-b300-tp8",
                            "--image", "vllm:latest"),
    "unknown-profile": _m(7, "no serving profile 'p5'", "tuple", "create",
                          f"{DEMO_REPO}@{{commit}}", "--offline", "--profile", "p5",
                          "--image", IMAGE),
    "identity-key-missing": _m(7, "no identity key at /nonexistent/key.pem", "key", "show",
                               env={"K3A_IDENTITY_KEY": "/nonexistent/key.pem"}),
    "gates-option-of-eval": _m(2, "No such option '--suite'", "gates", "{tuple}", "staging",
                               "--suite", "k3-core"),
}


def _filled(world: World, mistake: Mistake) -> tuple[list[str], dict[str, str | None]]:
    values = {"hub": world.hub, "tuple": world.tuple_id, "commit": world.commit,
              "store": world.store, "closed": CLOSED_PORT}
    return ([a.format(**values) for a in mistake.args], {**world.env, **mistake.env})


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_newcomer_mistake_is_named_with_its_next_step(world, name):
    mistake = MISTAKES[name]
    args, env = _filled(world, mistake)
    keys = world.home / "config" / "k3artifacts" / "keys"
    ran = invoke(*args, env=env, expect=mistake.code)
    said = ran.stdout + ran.stderr
    assert "Traceback" not in said, ran.report()
    assert f"error: {mistake.cause}" in ran.stderr or mistake.cause in ran.stderr, ran.report()
    nexts = [line for line in ran.stderr.splitlines() if line.startswith("next: ")]
    assert len(nexts) == 1 and len(nexts[0]) > len("next: ") + 10, ran.report()
    if mistake.json:
        doc = invoke(*args, "--json", env=env, expect=mistake.code).json
        assert doc["exit_code"] == mistake.code and mistake.cause in doc["error"], doc
        assert doc["next"] and "Traceback" not in doc["error"]
    assert not keys.exists(), f"{name}: a personal key was made before the input was refused"
    assert not Path("/tmp/k3a-never").exists() and not Path("/proc/k3a").exists()


def test_there_are_at_least_twenty_nine(world):
    assert len(MISTAKES) >= 29
