"""Rendering from the tuple alone: deterministic, and valid for what it targets."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime

import jsonschema
import kubernetes_validate
import pytest
import yaml

from k3artifacts.errors import ConfigError, NotFound, TamperedRecord
from k3artifacts.policy.record import packaged_document
from k3artifacts.releases.binding import create_tuple
from k3artifacts.releases.channels import HistoryEntry, commit_move, read_state
from k3artifacts.releases.lookup import resolve_tuple
from k3artifacts.releases.tuples import ImageRef, WeightsRef, tuple_key
from k3artifacts.serving.profiles import (
    MANIFESTS_DIR,
    FsxTarget,
    StorageTarget,
    load_profile,
    serving_spec,
)
from k3artifacts.serving.render import render
from tests.fixtures import people
from tests.fixtures.moves import seed_people

IMAGE = ImageRef(repository="registry.example.com/vllm", digest="sha256:" + "1" * 64, tag="k3")
VERIFIER = "registry.example.com/k3a-worker@sha256:" + "2" * 64
SCHEMA = json.loads((MANIFESTS_DIR / "schemas" / "inferenceendpointconfig-v1.json").read_text())
K8S = "1.33.0"
FSX = FsxTarget(
    file_system_id="fs-0123456789abcdef0",
    dns_name="fs-0123.fsx.us-west-2.amazonaws.com",
    mount_name="abcdefgh",
    mounted_at="/",
)


def vllm_args(release) -> list[str]:
    """The tuple's args as rendered: vLLM serves the profile's name and the tuple id (each in
    /v1/models), so readiness can tell which tuple an endpoint was started from."""
    args = [a for a in release.binding.serving.args if not a.startswith("--served-model-name=")]
    assert len(args) == len(release.binding.serving.args) - 1
    return [*args, "--served-model-name", "Kimi-K3", release.id]


def make(published, profile="p6-b300-tp8", storage=None, verifier=VERIFIER):
    p = published
    spec = serving_spec(load_profile(profile), storage=storage, verifier_image=verifier)
    return create_tuple(p.store, p.repo_id, p.commit, IMAGE, spec).release


def s3_release(release, location="s3://k3a-releases/prod/models/moonshotai/Kimi-K3-tiny/"):
    """The same binding as if the revision had been published to an S3 store."""
    b = release.binding
    weights = WeightsRef(**{**b.weights.model_dump(), "location": location + b.weights.commit})
    resources = {**b.serving.resources, "storage": {"fsx": None, "s3_region": "us-west-2"}}
    serving = b.serving.model_copy(update={"resources": resources})
    binding = b.model_copy(update={"weights": weights, "serving": serving})
    return release.model_copy(update={"binding": binding, "id": binding.tuple_id()})


def validate_k8s(docs):
    for doc in docs:
        if doc["kind"] == "LeaderWorkerSet":
            # A CRD kubernetes-validate has no schema for: validate the pod templates it wraps.
            lwt = doc["spec"]["leaderWorkerTemplate"]
            for key in ("leaderTemplate", "workerTemplate"):
                kubernetes_validate.validate(
                    {
                        "apiVersion": "v1",
                        "kind": "PodTemplate",
                        "metadata": {"name": key.lower()},
                        "template": lwt[key],
                    },
                    K8S,
                    strict=True,
                )
        else:
            kubernetes_validate.validate(doc, K8S, strict=True)


def test_hyperpod_fsx(published_revision):
    release = make(published_revision, storage=StorageTarget(fsx=FSX))
    out = render(release, "hyperpod")
    (doc,) = out.documents
    jsonschema.validate(doc, SCHEMA)
    spec = doc["spec"]
    assert spec["instanceType"] == "ml.p6-b300.48xlarge"
    source = spec["modelSourceConfig"]
    assert source["modelSourceType"] == "fsx"
    assert source["fsxStorage"] == {
        "fileSystemId": FSX.file_system_id,
        "dnsName": FSX.dns_name,
        "mountName": FSX.mount_name,
    }
    root = str(published_revision.store.root).lstrip("/")
    assert (
        source["modelLocation"]
        == f"{root}/models/{published_revision.repo_id}/{published_revision.commit}"
    )
    worker = spec["worker"]
    assert worker["image"] == IMAGE.reference
    assert worker["args"] == vllm_args(release)
    assert {"name": "VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION", "value": "1"} in worker[
        "environmentVariables"
    ]
    assert worker["modelVolumeMount"]["mountPath"] == "/opt/ml/model"
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert worker["requestLimits"]["maxConcurrentRequests"] == 256
    assert doc["metadata"]["annotations"]["k3a.io/tuple-id"] == release.id


def test_hyperpod_s3(published_revision):
    release = s3_release(make(published_revision))
    (doc,) = render(release, "hyperpod").documents
    jsonschema.validate(doc, SCHEMA)
    source = doc["spec"]["modelSourceConfig"]
    assert source["s3Storage"] == {"bucketName": "k3a-releases", "region": "us-west-2"}
    assert (
        source["modelLocation"]
        == f"prod/models/moonshotai/Kimi-K3-tiny/{release.binding.weights.commit}"
    )


def test_schema_rejects_what_the_crd_rejects(published_revision):
    (doc,) = render(make(published_revision, storage=StorageTarget(fsx=FSX)), "hyperpod").documents
    for mutate in (
        lambda d: d["spec"].__setitem__("instanceType", "p6-b300.48xlarge"),
        lambda d: d["spec"]["worker"].__setitem__("image", "registry.example.com/vllm:k3"),
        lambda d: d["spec"]["worker"].pop("modelVolumeMount"),
        lambda d: d["spec"]["modelSourceConfig"].__setitem__("modelSourceType", "nfs"),
    ):
        bad = json.loads(json.dumps(doc))
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, SCHEMA)


def test_hyperpod_refuses_a_local_path_and_multi_node(published_revision):
    with pytest.raises(ConfigError, match="cannot mount"):
        render(make(published_revision), "hyperpod")
    two = make(published_revision, profile="b200x8-2node-tp8-pp2", storage=StorageTarget(fsx=FSX))
    with pytest.raises(ConfigError, match="2 nodes"):
        render(two, "hyperpod")


@pytest.mark.parametrize("where", ["host", "fsx", "s3"])
def test_eks_single_node_validates(published_revision, where):
    storage = StorageTarget(fsx=FSX) if where == "fsx" else None
    release = make(published_revision, storage=storage)
    if where == "s3":
        release = s3_release(release)
    docs = render(release, "eks").documents
    validate_k8s(docs)
    kinds = [d["kind"] for d in docs]
    expected = ["Deployment", "Service", "PodDisruptionBudget"]
    assert kinds == (
        expected if where == "host" else ["PersistentVolume", "PersistentVolumeClaim", *expected]
    )
    deploy = docs[kinds.index("Deployment")]
    assert deploy["metadata"]["annotations"]["k3a.io/tuple-id"] == release.id
    pod = deploy["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["image"] == VERIFIER
    b = release.binding
    assert init["command"][:3] == ["timeout", "--kill-after=30", "2700"]
    assert init["command"][3:] == [
        "k3a",
        "verify",
        f"{b.weights.repo_id}@{b.weights.commit}",
        "--store",
        "file:///k3a-store",
        "--expect-digest",
        b.weights.manifest_digest,
    ]
    (vllm,) = pod["containers"]
    assert vllm["image"] == IMAGE.reference and vllm["args"] == vllm_args(release)
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert vllm["startupProbe"]["failureThreshold"] * vllm["startupProbe"]["periodSeconds"] >= 3600
    assert "/v1/completions" in vllm["readinessProbe"]["exec"]["command"][-1]
    model_mount = next(m for m in vllm["volumeMounts"] if m["mountPath"] == b.serving.model_path)
    store_mount = init["volumeMounts"][0]
    # The server sees exactly the bound revision; the verifier sees the store around it.
    assert model_mount["subPath"].endswith(f"models/{b.weights.repo_id}/{b.weights.commit}")
    assert model_mount["readOnly"] and store_mount["readOnly"]
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == "p6-b300.48xlarge"


def test_eks_two_nodes_is_a_leader_worker_set(published_revision):
    release = make(
        published_revision, profile="b200x8-2node-tp8-pp2", storage=StorageTarget(fsx=FSX)
    )
    docs = render(release, "eks").documents
    validate_k8s(docs)
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2
    leader = lwt["leaderTemplate"]["spec"]
    assert leader["containers"][0]["args"] == vllm_args(release)
    assert leader["initContainers"][0]["command"][3] == "k3a"
    assert lwt["workerTemplate"]["spec"]["initContainers"][0]["command"][3] == "k3a"
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["selector"]["role"] == "leader"


def test_eks_needs_a_verifier_image(published_revision):
    with pytest.raises(ConfigError, match="verifier image"):
        render(make(published_revision, verifier=None), "eks")


def test_channel_name_resolves_through_its_pointer(published_revision):
    release = make(published_revision)
    store = published_revision.store
    policy = seed_people(store, packaged_document())
    entry = HistoryEntry(channel="production", seq=1, action="promote", tuple_id=release.id,
                         who="alice", when=datetime.now(UTC), policy_digest=policy.digest,
                         policy_version=policy.version)
    commit_move(store, read_state(store, "production"), entry, acting=people.person("alice"))
    assert resolve_tuple(store, "production").id == release.id
    assert resolve_tuple(store, release.id).id == release.id
    with pytest.raises(NotFound):
        resolve_tuple(store, "staging")


def test_a_tampered_tuple_does_not_render(published_revision):
    release = make(published_revision)
    path = published_revision.store.local_path(tuple_key(release.id))
    body = json.loads(path.read_text())
    body["binding"]["image"]["digest"] = "sha256:" + "9" * 64
    path.chmod(0o644)
    path.write_text(json.dumps(body))
    with pytest.raises(TamperedRecord):
        resolve_tuple(published_revision.store, release.id)


def test_cli_render_is_byte_identical(published_revision, k3a_cmd, k3a_env, tmp_path):
    release = make(published_revision, storage=StorageTarget(fsx=FSX))
    store = f"file://{published_revision.store.root}"
    outputs = {}
    for target in ("hyperpod", "eks"):
        runs = []
        for n in (1, 2):
            out = tmp_path / f"run{n}"
            proc = subprocess.run(  # noqa: PLW1510 (exit code asserted below)
                [
                    *k3a_cmd,
                    "render",
                    release.id,
                    "--target",
                    target,
                    "--out",
                    str(out),
                    "--store",
                    store,
                ],
                env=k3a_env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stderr
            runs.append((out / f"kimi-k3-p6-b300-tp8.{target}.yaml").read_bytes())
        assert runs[0] == runs[1]
        outputs[target] = list(yaml.safe_load_all(runs[0]))
    jsonschema.validate(outputs["hyperpod"][0], SCHEMA)
    validate_k8s(outputs["eks"])
    # stdout and --out carry the same bytes
    stdout = subprocess.run(
        [*k3a_cmd, "render", release.id, "--target", "eks", "--store", store],
        check=True,
        env=k3a_env,
        capture_output=True,
        timeout=120,
    ).stdout
    assert stdout == runs[1]


def test_the_kubernetes_check_can_fail(published_revision):
    docs = render(make(published_revision), "eks").documents
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    deploy["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["gpu"] = ["8"]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(docs)


@pytest.mark.s3
def test_s3_store_tuple_renders_for_hyperpod(s3_store, tmp_path):
    from tests.fixtures.revisions import COMMIT, LICENSE_TEXT, REPO_ID, publish

    publish(s3_store, tmp_path / "q", REPO_ID, COMMIT, {"LICENSE": LICENSE_TEXT.encode()})
    spec = serving_spec(load_profile("p6-b300-tp8"), storage=StorageTarget(s3_region="us-east-1"))
    release = create_tuple(s3_store, REPO_ID, COMMIT, IMAGE, spec).release
    assert release.binding.weights.location.startswith("s3://")
    (doc,) = render(release, "hyperpod").documents
    jsonschema.validate(doc, SCHEMA)
    source = doc["spec"]["modelSourceConfig"]
    assert source["s3Storage"] == {"bucketName": s3_store.bucket, "region": "us-east-1"}
    key_prefix = "/".join(p for p in (s3_store.prefix, "models", REPO_ID, COMMIT) if p)
    assert source["modelLocation"] == key_prefix
    # The rendered location names the published bytes in the bucket.
    head = s3_store.client.head_object(Bucket=s3_store.bucket, Key=f"{key_prefix}/LICENSE")
    assert head["ContentLength"] == len(LICENSE_TEXT.encode())
