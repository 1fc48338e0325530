"""A tuple whose profile loads with ``--load-format k3a`` renders pods that read the weights
once: no ``verify-weights`` init container, vLLM told the tuple and the store (mounted as the
verifier would see it) and given the pinned root; without a pinned root to give it the render
refuses. Profiles of images without the plugin keep the verify container."""

from __future__ import annotations

import json

import pytest

from k3artifacts.errors import ConfigError
from k3artifacts.loading.vllm_plugin import LoaderConfig
from k3artifacts.policy.signing_keys import verifier_trust
from k3artifacts.serving.profiles import StorageTarget
from k3artifacts.serving.render import render
from k3artifacts.serving.render.common import STORE_MOUNT
from k3artifacts.serving.render.eks import VERIFIER_CONFIG, VERIFIER_VOLUME
from tests.fixtures.moves import use_policy
from tests.test_render import FSX, make, s3_release, validate_k8s
from tests.test_signing import keys, policies  # noqa: F401 - fixtures

K3A = "p6-b300-tp8-k3a"


def _pod(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]


def test_k3a_load_format_renders_no_verify_container_and_tells_vllm_the_tuple(
        published_revision, policies):  # noqa: F811
    p = published_revision
    use_policy(p.store, policies)
    release = make(p, profile=K3A)
    docs = render(release, "eks", verifier=verifier_trust(p.store)).documents
    validate_k8s(docs)
    pod = _pod(docs)
    assert "initContainers" not in pod  # the weights are read once, by vLLM
    (vllm,) = pod["containers"]
    args = vllm["args"]
    assert "--load-format=k3a" in args
    extra = LoaderConfig.model_validate_json(args[args.index("--model-loader-extra-config") + 1])
    assert extra.tuple == release.id and extra.store == f"file://{STORE_MOUNT}"
    assert {"name": "XDG_CONFIG_HOME", "value": VERIFIER_CONFIG} in vllm["env"]
    mounts = {m["mountPath"]: m for m in vllm["volumeMounts"]}
    assert mounts[STORE_MOUNT]["readOnly"] and mounts[VERIFIER_CONFIG]["name"] == VERIFIER_VOLUME
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    volume = next(v for v in pod["volumes"] if v["name"] == VERIFIER_VOLUME)
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]


def test_k3a_load_format_without_a_pinned_root_is_refused(published_revision):
    release = make(published_revision, profile=K3A)
    with pytest.raises(ConfigError, match="--load-format k3a") as err:
        render(release, "eks")
    assert "--verify-signature" in (err.value.hint or "")


def test_profiles_without_the_plugin_keep_the_verify_container(published_revision, policies):  # noqa: F811
    p = published_revision
    use_policy(p.store, policies)
    docs = render(make(p), "eks", verifier=verifier_trust(p.store)).documents
    pod = _pod(docs)
    assert [c["name"] for c in pod["initContainers"]] == ["verify-weights"]
    assert "--model-loader-extra-config" not in pod["containers"][0]["args"]
    assert json.dumps(pod).count(VERIFIER_CONFIG) >= 1


@pytest.mark.parametrize("where", ["fsx", "s3"])
def test_node_cache_with_k3a_pulls_then_vllm_verifies_the_local_copy(
        published_revision, policies, where):  # noqa: F811
    from k3artifacts.trust.pins import Pin, pin_name

    p = published_revision
    use_policy(p.store, policies)
    release = make(p, profile=K3A, storage=StorageTarget(fsx=FSX) if where == "fsx" else None)
    release = s3_release(release) if where == "s3" else release
    docs = render(release, "eks-node-cache", verifier=verifier_trust(p.store)).documents
    validate_k8s(docs)
    pod = _pod(docs)
    assert [c["name"] for c in pod["initContainers"]][:1] == ["pull-weights"]
    assert "verify-weights" not in json.dumps(pod["initContainers"])  # one read: vLLM's
    (vllm,) = pod["containers"]
    args = vllm["args"]
    extra = LoaderConfig.model_validate_json(args[args.index("--model-loader-extra-config") + 1])
    pull = pod["initContainers"][0]["command"]
    assert extra.tuple == release.id and extra.store == pull[pull.index("--store") + 1]
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    pin = Pin.model_validate_json(config_map["data"][pin_name(extra.store)])
    assert pin.store == extra.store  # the root pinned for the store vLLM reads
    mounts = {m["mountPath"]: m for m in vllm["volumeMounts"]}
    model = mounts[release.binding.serving.model_path]
    assert model["name"] == "node-cache" and model["readOnly"]
    assert (STORE_MOUNT in mounts) == (where == "fsx")  # S3 is read through its API
    # The pull leaves the weights on the node to vLLM's hash; a file vLLM refuses is recorded
    # in the one directory of the cache it writes, where the next pull looks.
    assert "--verified-by-loader" in pull
    refused = mounts[extra.refusals]
    assert refused["name"] == "node-cache" and not refused.get("readOnly")
    assert refused["subPath"] == ".k3a-cache/refused"


def test_node_cache_without_k3a_refuses_a_signature_check_it_would_not_make(
        published_revision, policies):  # noqa: F811
    p = published_revision
    use_policy(p.store, policies)
    with pytest.raises(ConfigError, match="only with --load-format k3a"):
        render(make(p, storage=StorageTarget(fsx=FSX)), "eks-node-cache",
               verifier=verifier_trust(p.store))
