"""The ``eks-rollout`` target: an Argo Rollout of the tuple's pods in the channel's canary steps,
judged by an AnalysisTemplate on vLLM's metrics; deterministic, valid for Argo Rollouts'
CRDs with unknown fields refused, and for Kubernetes where the objects are core."""

from __future__ import annotations

import re
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from k3artifacts.errors import ConfigError
from k3artifacts.policy.model import load_gate_policy
from k3artifacts.policy.rollout import TrafficPolicy
from k3artifacts.releases.binding import create_tuple
from k3artifacts.releases.tuples import ImageRef
from k3artifacts.serving.profiles import (
    FsxTarget,
    StorageTarget,
    load_profile,
    serving_spec,
)
from k3artifacts.serving.render import render
from tests.argo_rollouts import (
    CRDS_ENV,
    crds_dir,
    validate_structural,
    validate_upstream,
)
from tests.conftest import REPO_ROOT

IMAGE = ImageRef(repository="registry.example.com/vllm", digest="sha256:" + "1" * 64, tag="k3")
VERIFIER = "registry.example.com/k3a-worker@sha256:" + "2" * 64
K8S = "1.33.0"
FSX = FsxTarget(file_system_id="fs-0123456789abcdef0",
                dns_name="fs-0123.fsx.us-west-2.amazonaws.com", mount_name="abcdefgh",
                mounted_at="/")
POLICIES = REPO_ROOT / "policies"


def test_production_rolls_out_under_the_traffic_gate():
    production = load_gate_policy(POLICIES).channels["production"]
    assert "traffic" in production.gates and production.traffic is not None
    assert "infrastructure" in production.gates and production.infrastructure is not None


def production_traffic() -> TrafficPolicy:
    traffic = load_gate_policy(POLICIES).channels["production"].traffic
    assert traffic is not None
    return traffic


def make(published, profile="p6-b300-tp8"):
    spec = serving_spec(load_profile(profile), storage=StorageTarget(fsx=FSX),
                        verifier_image=VERIFIER)
    p = published
    return create_tuple(p.store, p.repo_id, p.commit, IMAGE, spec).release


def by_kind(docs):
    return {d["kind"]: d for d in docs}


def validate_all(docs):
    for doc in docs:
        if doc["apiVersion"].startswith("argoproj.io/"):
            validate_structural(doc)
            if doc["kind"] == "Rollout":
                kubernetes_validate.validate(
                    {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "rollout"},
                     "template": doc["spec"]["template"]}, K8S, strict=True)
        else:
            kubernetes_validate.validate(doc, K8S, strict=True)


def test_rollout_walks_the_channels_steps_with_analysis(published_revision):
    release = make(published_revision)
    traffic = production_traffic()
    docs = render(release, "eks-rollout", traffic=traffic).documents
    validate_all(docs)
    kinds = by_kind(docs)
    assert "Deployment" not in kinds
    rollout = kinds["Rollout"]
    template, against_stable = (d for d in docs if d["kind"] == "AnalysisTemplate")
    canary = rollout["spec"]["strategy"]["canary"]
    weights = [s["setWeight"] for s in canary["steps"] if "setWeight" in s]
    assert weights == [s.weight for s in traffic.steps] == [1, 5, 25, 100]
    # every weight is held, then analysed for this tuple before the next
    for i, step in enumerate(traffic.steps):
        set_weight, pause, analysis = canary["steps"][3 * i: 3 * i + 3]
        assert pause == {"pause": {"duration": step.pause}}
        templates = [template["metadata"]["name"]]
        args = [{"name": "tuple-id", "value": release.id}]
        # below 100% also against the stable ReplicaSet, whose hash the controller fills in
        if step.weight < 100:
            templates.append(against_stable["metadata"]["name"])
            args += [{"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}},
                     {"name": "stable-hash", "valueFrom": {"podTemplateHashValue": "Stable"}}]
        assert analysis["analysis"]["templates"] == [{"templateName": t} for t in templates]
        assert analysis["analysis"]["args"] == args
    # the pods are the eks target's: verified weights first, then vLLM of the tuple
    pod = rollout["spec"]["template"]["spec"]
    eks_pod = by_kind(render(release, "eks").documents)["Deployment"]["spec"]["template"]["spec"]
    assert pod == eks_pod
    assert pod["initContainers"][0]["name"] == "verify-weights"
    # traffic is split by the ALB between the two services the Rollout names
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert {canary["stableService"], canary["canaryService"]} == services
    assert canary["trafficRouting"]["alb"]["ingress"] == kinds["Ingress"]["metadata"]["name"]
    # the analysis asks for vLLM's own histograms and the request counters, against the bounds
    queries = {m["name"]: m for m in template["spec"]["metrics"]}
    assert set(queries) == {"requests", "e2e-latency", "time-to-first-token", "error-rate"}
    assert "vllm:e2e_request_latency_seconds_bucket" in queries["e2e-latency"][
        "provider"]["prometheus"]["query"]
    assert "vllm:time_to_first_token_seconds_bucket" in queries["time-to-first-token"][
        "provider"]["prometheus"]["query"]
    assert queries["e2e-latency"]["successCondition"].endswith(
        f"<= {traffic.thresholds.max_e2e_s!r}")
    assert all(m["failureLimit"] == 0 for m in queries.values())
    assert all('k3a_io_tuple_id="{{args.tuple-id}}"' in m["provider"]["prometheus"]["query"]
               for m in queries.values())
    # and compares the canary's quantiles with the stable pods' in the same window
    compared = {m["name"]: m for m in against_stable["spec"]["metrics"]}
    assert set(compared) == {"e2e-latency-against-stable", "time-to-first-token-against-stable"}
    for metric in compared.values():
        promql = metric["provider"]["prometheus"]["query"]
        assert 'rollouts_pod_template_hash="{{args.canary-hash}}"' in promql
        assert 'rollouts_pod_template_hash="{{args.stable-hash}}"' in promql
        # both sides over the same window
        assert set(re.findall(r"\[(\w+)\]", promql)) == {traffic.window}
        assert metric["successCondition"].endswith("result[0] <= 1.0")
        assert metric["failureLimit"] == 0


def test_without_against_stable_the_analysis_is_bounds_only(published_revision):
    traffic = production_traffic().model_copy(update={"against_stable": None})
    docs = render(make(published_revision), "eks-rollout", traffic=traffic).documents
    validate_all(docs)
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "AnalysisTemplate"] == [
        "kimi-k3-p6-b300-tp8-traffic"]
    steps = by_kind(docs)["Rollout"]["spec"]["strategy"]["canary"]["steps"]
    assert all(len(s["analysis"]["templates"]) == 1 for s in steps if "analysis" in s)


def test_unknown_fields_are_refused(published_revision):
    docs = render(make(published_revision), "eks-rollout", traffic=production_traffic()).documents
    kinds = by_kind(docs)
    bad_step = yaml.safe_load(yaml.safe_dump(kinds["Rollout"]))
    bad_step["spec"]["strategy"]["canary"]["steps"][0] = {"setWeigth": 1}
    bad_metric = yaml.safe_load(yaml.safe_dump(kinds["AnalysisTemplate"]))
    bad_metric["spec"]["metrics"][0]["provider"]["prometheus"]["querry"] = "up"
    bad_arg = yaml.safe_load(yaml.safe_dump(kinds["Rollout"]))
    bad_arg["spec"]["strategy"]["canary"]["steps"][2]["analysis"]["args"][1] = {"nam": "x"}
    for doc in (bad_step, bad_metric, bad_arg):
        with pytest.raises(jsonschema.ValidationError):
            validate_structural(doc)
        if crds_dir() is not None:
            with pytest.raises(jsonschema.ValidationError):
                validate_upstream(doc, crds_dir())


@pytest.mark.skipif(crds_dir() is None,
                    reason=f"set {CRDS_ENV} to a directory with Argo Rollouts' "
                    "rollout-crd.yaml and analysis-template-crd.yaml (manifests/crds/)")
def test_rollout_validates_against_the_upstream_crds(published_revision):
    docs = render(make(published_revision), "eks-rollout", traffic=production_traffic()).documents
    for doc in docs:
        if doc["apiVersion"].startswith("argoproj.io/"):
            validate_upstream(doc, crds_dir())


def test_rollout_needs_a_traffic_policy_and_one_node(published_revision):
    release = make(published_revision)
    with pytest.raises(ConfigError, match="traffic policy"):
        render(release, "eks-rollout")
    multi = make(published_revision, profile="b200x8-2node-tp8-pp2")
    with pytest.raises(ConfigError, match="LeaderWorkerSet") as refused:
        render(multi, "eks-rollout", traffic=production_traffic())
    assert "second endpoint" in refused.value.hint


def test_cli_rollout_render_is_byte_identical(published_revision, k3a_cmd, k3a_env):
    release = make(published_revision)
    argv = [*k3a_cmd, "render", release.id, "--target", "eks-rollout", "--rollout-channel",
            "production", "--store", f"file://{published_revision.store.root}"]
    runs = [subprocess.run(argv, env=k3a_env, capture_output=True, check=True, timeout=120).stdout
            for _ in range(2)]
    assert runs[0] == runs[1]
    validate_all([d for d in yaml.safe_load_all(runs[0]) if d])
    refused = subprocess.run([*argv[:7], "--store", argv[-1]],
                             env=k3a_env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 9, refused.stderr
    assert "--rollout-channel" in refused.stderr or "--channel" in refused.stderr
