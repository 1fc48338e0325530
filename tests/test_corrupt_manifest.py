"""A published revision manifest edited in the store (truncated, or not a manifest) is a
stored record refused, exit 4, naming where it was read, for every reader: a pull, a
signature, a verify of the revision, the gates of a tuple that binds it. Never a traceback."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.revisions.manifest import manifest_key
from k3artifacts.stores.file import FileStore
from tests.support.cli import invoke
from tests.support.releases import Releases


@pytest.fixture
def broken(tmp_path, k3a_env):
    """(env, revision, tuple id) of a file store whose one revision's manifest was cut short
    by an insider after the tuple binding it was made."""
    store = FileStore(tmp_path / "store")
    releases = Releases(store, tmp_path / "scratch")
    manifest = releases.publish()
    release = releases.tuple_for(manifest)
    path = store.root / manifest_key(manifest.repo_id, manifest.commit)
    path.chmod(0o644)  # the tree's owner may; k3a left it read-only
    path.write_bytes(path.read_bytes()[:100])
    env = dict(k3a_env, K3A_STORE=store.url)
    return env, f"{manifest.repo_id}@{manifest.commit}", release.id, str(path)


@pytest.mark.parametrize("command", [
    ["pull", "{tuple}", "--to", "{tmp}/cache"],
    ["sign", "{revision}", "--signing-key", "{tmp}/release.pem"],
    ["verify", "{revision}"],
])
def test_a_cut_manifest_is_refused_by_name(broken, tmp_path, command):
    env, revision, tuple_id, path = broken
    key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "release.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (tmp_path / "release.pem").chmod(0o600)  # as its owner keeps it: k3a refuses one others read
    args = [a.format(tuple=tuple_id, revision=revision, tmp=tmp_path) for a in command]
    ran = invoke(*args, "--json", env=env, expect=4)
    assert "does not parse as a revision manifest" in ran.json["error"], ran.json
    assert revision.split("@")[1] in ran.json["error"]
    assert "Traceback" not in ran.stderr
    assert not (tmp_path / "cache" / "models").exists()


def test_the_artifact_gate_fails_naming_the_cut_manifest(broken):
    env, revision, tuple_id, path = broken
    ran = invoke("gates", tuple_id, "staging", "--json", env=env, expect=5)
    artifact = next(r for r in ran.json["results"] if r["name"] == "artifact")
    assert artifact["reason"].startswith(f"file://{path} does not parse as a revision manifest")
