"""k3a tuple create / tuples list|show|diff, in process and through the CLI."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from k3artifacts.errors import NotFound, TamperedRecord, UsageError
from k3artifacts.releases.binding import create_tuple
from k3artifacts.releases.tuples import ImageRef, TupleStore, diff_bindings, tuple_key
from k3artifacts.revisions.refs import parse_revision_ref
from k3artifacts.serving.profiles import load_profile, serving_spec
from tests.support.cli import run_process

IMAGE = ImageRef(repository="registry.example.com/vllm", digest="sha256:" + "1" * 64, tag="k3")


def test_same_inputs_same_id(published_revision):
    p = published_revision
    spec = serving_spec(load_profile("p6-b300-tp8"))
    first = create_tuple(
        p.store,
        p.repo_id,
        p.commit,
        IMAGE,
        spec,
        created_by="a",
        now=datetime(2025, 1, 1, tzinfo=UTC),
    )
    again = create_tuple(p.store, p.repo_id, p.commit, IMAGE, spec, created_by="b")
    assert first.new and not again.new
    assert again.release.id == first.release.id
    # The first record is kept: who and when are not part of the id and are not overwritten.
    assert again.release.created_by == "a"
    b = first.release.binding
    assert b.weights.manifest_digest == p.manifest.digest()
    assert b.weights.location == p.store.location(p.repo_id, p.commit)
    assert b.license_sha256 == p.manifest.license.sha256 is not None


def test_any_changed_input_gives_a_new_id(published_revision):
    p = published_revision
    b300 = serving_spec(load_profile("p6-b300-tp8"))
    base = create_tuple(p.store, p.repo_id, p.commit, IMAGE, b300).release
    other_image = IMAGE.model_copy(update={"digest": "sha256:" + "2" * 64})
    by_image = create_tuple(p.store, p.repo_id, p.commit, other_image, b300).release
    by_profile = create_tuple(
        p.store, p.repo_id, p.commit, IMAGE, serving_spec(load_profile("b200x8-2node-tp8-pp2"))
    ).release
    assert len({base.id, by_image.id, by_profile.id}) == 3
    changed = [field for field, _, _ in diff_bindings(base.binding, by_image.binding)]
    assert changed == ["image.digest"]


def test_unpublished_revision_is_refused(file_store):
    spec = serving_spec(load_profile("p6-b300-tp8"))
    with pytest.raises(NotFound, match="not published"):
        create_tuple(file_store, "moonshotai/Kimi-K3", "f" * 40, IMAGE, spec)


@pytest.mark.parametrize("text", ["moonshotai/Kimi-K3@main", "moonshotai/Kimi-K3", "x@" + "a" * 39])
def test_revision_must_be_a_commit(text):
    with pytest.raises(UsageError):
        parse_revision_ref(text)


def test_tampered_tuple_is_refused_on_read(published_revision):
    p = published_revision
    release = create_tuple(
        p.store, p.repo_id, p.commit, IMAGE, serving_spec(load_profile("p6-b300-tp8"))
    ).release
    path = p.store.local_path(tuple_key(release.id))
    body = json.loads(path.read_text())
    body["binding"]["serving"]["args"].append("--enforce-eager")
    path.chmod(0o644)
    path.write_text(json.dumps(body))
    with pytest.raises(TamperedRecord, match="tuple-tampered") as refused:
        TupleStore(p.store).get(release.id)
    assert refused.value.exit_code == 4  # a stored record refused, not release content (3)


# ---- through the CLI ------------------------------------------------------------------------


def test_cli_tuple_create_end_to_end(published_revision, oci_registry, k3a_cmd, k3a_env):
    p = published_revision
    pushed = oci_registry.push("k3a/vllm", "k3-cli")
    worker = oci_registry.push("k3a/pipeline", "v1", layer=b"k3a worker")
    store = f"file://{p.store.root}"
    args = [
        "tuple",
        "create",
        p.revision,
        "--image",
        f"{oci_registry.host}/k3a/vllm:k3-cli",
        "--profile",
        "p6-b300-tp8",
        "--verifier-image",
        f"{oci_registry.host}/k3a/pipeline:v1",
        "--store",
        store,
    ]
    first = json.loads(run_process(*args, "--json", env=k3a_env, cmd=k3a_cmd).stdout)
    assert first["created"] is True
    release = first["tuple"]
    assert release["binding"]["image"]["digest"] == pushed.digest
    assert release["binding"]["serving"]["resources"]["verifier_image"] == (
        f"{oci_registry.host}/k3a/pipeline@{worker.digest}"
    )
    human = run_process(*args, env=k3a_env, cmd=k3a_cmd).stdout
    assert human.splitlines()[0] == f"{release['id']} (already exists)"

    listed = json.loads(
        run_process("tuples", "list", "--store", store, "--json", env=k3a_env, cmd=k3a_cmd).stdout
    )
    assert [t["id"] for t in listed["tuples"]] == [release["id"]]
    shown = json.loads(
        run_process(
            "tuples", "show", release["id"], "--store", store, "--json", env=k3a_env, cmd=k3a_cmd
        ).stdout
    )
    assert shown.pop("records") == []  # nothing recorded for it yet
    assert shown == release

    # A second tuple, the same revision on another profile, diffed against the first.
    second = json.loads(
        run_process(
            "tuple",
            "create",
            p.revision,
            "--image",
            f"{oci_registry.host}/k3a/vllm@{pushed.digest}",
            "--profile",
            "b200x8-2node-tp8-pp2",
            "--store",
            store,
            "--json",
            env=k3a_env,
            cmd=k3a_cmd,
        ).stdout
    )
    diff = json.loads(
        run_process(
            "tuples",
            "diff",
            release["id"],
            second["tuple"]["id"],
            "--store",
            store,
            "--json",
            env=k3a_env,
            cmd=k3a_cmd,
        ).stdout
    )
    fields = {c["field"] for c in diff["changes"]}
    assert {"serving.profile", "serving.args", "image.tag"} <= fields
    assert "weights.commit" not in fields


def test_cli_refuses_tag_only_offline(published_revision, k3a_cmd, k3a_env):
    p = published_revision
    proc = run_process(
        "tuple",
        "create",
        p.revision,
        "--image",
        "registry.example.com/vllm:k3",
        "--profile",
        "p6-b300-tp8",
        "--offline",
        "--store",
        f"file://{p.store.root}",
        env=k3a_env,
        cmd=k3a_cmd,
        expect=None,
    )
    assert proc.returncode == 9
    assert "tag and no digest" in proc.stderr
    assert TupleStore(p.store).list_ids() == []


def test_cli_unpublished_revision_exit_7(file_store, k3a_cmd, k3a_env):
    file_store.root.mkdir(parents=True)  # the store is there; the revision is not
    proc = run_process(
        "tuple",
        "create",
        "moonshotai/Kimi-K3@" + "e" * 40,
        "--image",
        "registry.example.com/vllm@sha256:" + "1" * 64,
        "--profile",
        "p6-b300-tp8",
        "--store",
        f"file://{file_store.root}",
        env=k3a_env,
        cmd=k3a_cmd,
        expect=None,
    )
    assert proc.returncode == 7
    assert "not published" in proc.stderr and "next:" in proc.stderr


def test_cli_unknown_flag_in_profile_exit_9(published_revision, k3a_cmd, k3a_env, tmp_path):
    bad = tmp_path / "bad.yaml"
    text = load_profile("p6-b300-tp8").model_dump_json()
    data = json.loads(text)
    data["name"] = "bad"
    data["args"] = ["--tensor-paralel-size=8"]
    bad.write_text(json.dumps(data))
    p = published_revision
    proc = run_process(
        "tuple",
        "create",
        p.revision,
        "--image",
        "registry.example.com/vllm@sha256:" + "1" * 64,
        "--profile",
        str(bad),
        "--offline",
        "--store",
        f"file://{p.store.root}",
        env=k3a_env,
        cmd=k3a_cmd,
        expect=None,
    )
    assert proc.returncode == 9
    assert str(bad) in proc.stderr and "--tensor-paralel-size" in proc.stderr
