"""EKS pods serving from the node cache (``k3a pull`` in an init container) and the pre-warm
DaemonSet: valid Kubernetes objects, byte-identical across runs."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from k3artifacts.errors import ConfigError
from k3artifacts.serving.profiles import StorageTarget
from k3artifacts.serving.render import render
from k3artifacts.serving.render.node_cache import NODE_CACHE_HOST_PATH
from tests.test_render import FSX, VERIFIER, make, s3_release, validate_k8s


def _release(published_revision, where, **kwargs):
    release = make(published_revision, storage=StorageTarget(fsx=FSX) if where == "fsx" else None,
                   **kwargs)
    return s3_release(release) if where == "s3" else release


@pytest.mark.parametrize("where", ["host", "fsx", "s3"])
def test_eks_node_cache_pulls_verifies_then_serves_the_local_copy(published_revision, where):
    release = _release(published_revision, where)
    docs = render(release, "eks-node-cache").documents
    validate_k8s(docs)
    kinds = [d["kind"] for d in docs]
    expected = ["Deployment", "Service", "PodDisruptionBudget", "Job"]
    assert kinds == (expected if where != "fsx"
                     else ["PersistentVolume", "PersistentVolumeClaim", *expected])
    pod = docs[kinds.index("Deployment")]["spec"]["template"]["spec"]
    w = release.binding.weights
    pull, verify, _warm = pod["initContainers"]
    assert pull["image"] == verify["image"] == VERIFIER
    store = {"s3": "s3://k3a-releases/prod", "host": "file:///k3a-store",
             "fsx": "file:///k3a-store"}[where]
    assert pull["command"][3:] == ["k3a", "pull", release.id, "--store", store,
                                   "--to", "/k3a-cache", "--keep", "3"]
    assert verify["command"][3:] == ["k3a", "verify",
                                     f"/k3a-cache/models/{w.repo_id}/{w.commit}",
                                     "--expect-digest", w.manifest_digest]
    cache = next(v for v in pod["volumes"] if v["name"] == "node-cache")
    assert cache["hostPath"]["path"] == NODE_CACHE_HOST_PATH
    (vllm,) = pod["containers"]
    model = next(m for m in vllm["volumeMounts"]
                 if m["mountPath"] == release.binding.serving.model_path)
    assert model == {"name": "node-cache", "mountPath": release.binding.serving.model_path,
                     "subPath": f"models/{w.repo_id}/{w.commit}", "readOnly": True}
    lease = f"/k3a-cache/.k3a-cache/leases/{w.repo_id.replace('/', '+')}+{w.commit}.lease"
    assert vllm["command"][:3] == ["flock", "-s", lease]
    if where == "s3":
        assert [v["name"] for v in pod["volumes"]] == ["node-cache", "dshm"]
        assert pull["env"] == [{"name": "AWS_REGION", "value": "us-west-2"}]


def test_multi_node_pods_each_pull_to_their_own_node(published_revision):
    release = make(published_revision, profile="b200x8-2node-tp8-pp2",
                   storage=StorageTarget(fsx=FSX))
    docs = render(release, "eks-node-cache").documents
    validate_k8s(docs)
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    for key in ("leaderTemplate", "workerTemplate"):
        spec = lws["spec"]["leaderWorkerTemplate"][key]["spec"]
        assert [c["name"] for c in spec["initContainers"]] == ["pull-weights", "verify-weights",
                                                               "warm-start"]
        assert spec["containers"][0]["command"][:2] == ["flock", "-s"]


@pytest.mark.parametrize("where", ["fsx", "s3"])
def test_prewarm_is_a_daemonset_on_the_profiles_gpu_nodes(published_revision, where):
    release = _release(published_revision, where)
    docs = render(release, "eks-prewarm").documents
    validate_k8s(docs)
    ds = docs[-1]
    assert ds["kind"] == "DaemonSet" and ds["metadata"]["name"].endswith("-prewarm")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == "p6-b300.48xlarge"
    assert [c["name"] for c in pod["initContainers"]] == ["pull-weights", "verify-weights",
                                                          "pull-warm"]
    w = release.binding.weights
    assert pod["containers"][0]["command"][:4] == ["k3a", "cache", "lease",
                                                   f"{w.repo_id}@{w.commit}"]


def test_pulling_needs_a_verifier_image(published_revision):
    for target in ("eks-node-cache", "eks-prewarm"):
        with pytest.raises(ConfigError, match="verifier image"):
            render(make(published_revision, verifier=None), target)


def test_cli_node_cache_renders_are_byte_identical(published_revision, k3a_cmd, k3a_env,
                                                   tmp_path):
    release = make(published_revision, storage=StorageTarget(fsx=FSX))
    store = f"file://{published_revision.store.root}"
    for target, extra, written in (("eks", ["--weights", "node-cache"], "eks-node-cache"),
                                   ("eks-prewarm", [], "eks-prewarm")):
        runs = []
        for n in (1, 2):
            out = tmp_path / f"run{n}"
            proc = subprocess.run(
                [*k3a_cmd, "render", release.id, "--target", target, *extra, "--out", str(out),
                 "--store", store],
                env=k3a_env, capture_output=True, text=True, timeout=120, check=False)
            assert proc.returncode == 0, proc.stderr
            runs.append((out / f"kimi-k3-p6-b300-tp8.{written}.yaml").read_bytes())
        assert runs[0] == runs[1]
        validate_k8s(list(yaml.safe_load_all(runs[0])))
    proc = subprocess.run([*k3a_cmd, "render", release.id, "--target", "hyperpod", "--weights",
                           "node-cache", "--store", store],
                          env=k3a_env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 9 and "--target eks" in proc.stderr
