"""Target ``eks-rollout``: the ``eks`` pods (verify-weights init container, vLLM) under an Argo
Rollouts ``Rollout`` that moves traffic to a new tuple in the channel's canary steps, through
the AWS Load Balancer Controller's weighted target groups, with an ``AnalysisTemplate`` judging
each step on vLLM's own metrics in Prometheus: the canary's bounds, and (with the channel's
``traffic.against_stable``) its latency quantiles against the stable pods' over the same window,
the two ReplicaSets told apart by the pod-template hash Argo Rollouts labels them with. A failed
analysis aborts the rollout: all traffic returns to the stable ReplicaSet (the previous tuple),
which was never scaled down.

Inputs: the tuple (what runs) and the channel's ``traffic`` policy (how it is rolled out);
nothing else, so the same pair renders byte-identical YAML.
"""

from __future__ import annotations

from typing import Any

from k3artifacts.errors import ConfigError
from k3artifacts.policy.rollout import TrafficPolicy
from k3artifacts.policy.signing_keys import VerifierTrust
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.serving.profiles import serving_resources
from k3artifacts.serving.render.common import ANNOTATION, annotations, labels, weights_volume
from k3artifacts.serving.render.eks import (
    _pod_spec,
    _vllm_container,
    _volume_objects,
    verifier_config_map,
)
from k3artifacts.traffic.queries import by_pod_hash, stable_queries, step_queries

ROLLOUTS_API = "argoproj.io/v1alpha1"
#: The AnalysisTemplate's argument the queries select the candidate's series by.
TUPLE_ARG = "tuple-id"
#: The comparison's arguments: the pod-template hashes of the canary's and the stable
#: ReplicaSet, filled in by the Rollout controller (``podTemplateHashValue``).
CANARY_HASH_ARG, STABLE_HASH_ARG = "canary-hash", "stable-hash"


def _arg(name: str) -> str:
    return "{{args." + name + "}}"


def analysis_template_name(name: str) -> str:
    return f"{name}-traffic"


def stable_template_name(name: str) -> str:
    return f"{name}-traffic-against-stable"


def _template(name: str, meta_base: dict, args: list[str], metrics: list[dict]) -> dict:
    return {
        "apiVersion": ROLLOUTS_API,
        "kind": "AnalysisTemplate",
        "metadata": {**meta_base, "name": name, "labels": {"app.kubernetes.io/managed-by": "k3a"}},
        "spec": {"args": [{"name": a} for a in args], "metrics": metrics},
    }


def _against_stable_template(name: str, meta_base: dict, traffic: TrafficPolicy) -> dict:
    assert traffic.against_stable is not None
    metrics = [{
        "name": f"{q.name.replace('_', '-')}-against-stable",
        # NaN (too few requests a side) is routed by the policy's `inconclusive` into the
        # condition itself: an Inconclusive run would pause the Rollout for a human instead.
        "successCondition": q.condition(),
        "failureLimit": 0,
        "provider": {"prometheus": {"address": traffic.prometheus, "query": q.promql}},
    } for q in stable_queries(by_pod_hash(_arg(CANARY_HASH_ARG)),
                              by_pod_hash(_arg(STABLE_HASH_ARG)), traffic.window,
                              traffic.thresholds.quantile, traffic.against_stable)]
    return _template(stable_template_name(name), meta_base, [CANARY_HASH_ARG, STABLE_HASH_ARG],
                     metrics)


def _analysis_template(name: str, meta_base: dict, traffic: TrafficPolicy) -> dict:
    metrics = []
    for q in step_queries(_arg(TUPLE_ARG), traffic.window, traffic.thresholds):
        metrics.append({
            "name": q.name.replace("_", "-"),
            # One measurement over the step's window, taken when the pause ends; a failed
            # one fails the run at once and the Rollout aborts.
            "successCondition": q.condition(),
            "failureLimit": 0,
            "provider": {"prometheus": {"address": traffic.prometheus, "query": q.promql}},
        })
    return _template(analysis_template_name(name), meta_base, [TUPLE_ARG], metrics)


def _steps(release: ReleaseTuple, name: str, traffic: TrafficPolicy) -> list[dict]:
    steps: list[dict[str, Any]] = []
    for index, step in enumerate(traffic.steps):
        run_labels = {f"{ANNOTATION}/step": str(index), f"{ANNOTATION}/weight": str(step.weight)}
        if step.cohort:
            run_labels[f"{ANNOTATION}/cohort"] = step.cohort
        templates = [{"templateName": analysis_template_name(name)}]
        args: list[dict[str, Any]] = [{"name": TUPLE_ARG, "value": release.id}]
        # At 100% the stable pods get no traffic in the window: nothing to compare with.
        if traffic.against_stable is not None and step.weight < 100:
            templates.append({"templateName": stable_template_name(name)})
            args += [{"name": CANARY_HASH_ARG, "valueFrom": {"podTemplateHashValue": "Latest"}},
                     {"name": STABLE_HASH_ARG, "valueFrom": {"podTemplateHashValue": "Stable"}}]
        steps += [
            {"setWeight": step.weight},
            {"pause": {"duration": step.pause}},
            {"analysis": {
                "templates": templates,
                "args": args,
                "analysisRunMetadata": {"labels": run_labels},
            }},
        ]
    return steps


def render_eks_rollout(
    release: ReleaseTuple,
    *,
    name: str,
    namespace: str | None,
    traffic: TrafficPolicy | None = None,
    verifier: VerifierTrust | None = None,
) -> list[dict]:
    if traffic is None:
        raise ConfigError(
            "target eks-rollout needs a channel's traffic policy (its canary steps and bounds)",
            hint="render with --rollout-channel CHANNEL, whose policy has `traffic:`",
        )
    b = release.binding
    res = serving_resources(b.serving, f"tuple {release.id}")
    if res.nodes != 1:
        raise ConfigError(
            f"tuple {release.id}: profile {b.serving.profile} spans {res.nodes} nodes; an Argo "
            "Rollout manages ReplicaSets of single pods, not LeaderWorkerSet groups",
            hint="render the candidate as a second endpoint (--name NAME-canary) and shift "
            "traffic at the load balancer (docs/guides/rollout.md)",
        )
    vol = weights_volume(release, res)
    cluster_objects, volume = _volume_objects(release, vol, name, namespace)
    signing_map = None
    if verifier is not None:
        signing_map = verifier_config_map(name, namespace, verifier)
        cluster_objects.append(signing_map.document)
    meta_base: dict[str, Any] = {"name": name}
    if namespace:
        meta_base["namespace"] = namespace
    selector = {"app.kubernetes.io/name": name}
    port = b.serving.port
    canary_service = f"{name}-canary"
    rollout = {
        "apiVersion": ROLLOUTS_API,
        "kind": "Rollout",
        "metadata": {**meta_base, "labels": labels(release, name),
                     "annotations": annotations(release)},
        "spec": {
            "replicas": res.replicas,
            "selector": {"matchLabels": selector},
            "progressDeadlineSeconds": res.startup_seconds + res.verify_timeout_seconds + 600,
            # A candidate that never becomes ready is aborted, not left holding the canary.
            "progressDeadlineAbort": True,
            "template": {
                "metadata": {"labels": labels(release, name), "annotations": annotations(release)},
                "spec": _pod_spec(release, res, vol, volume, _vllm_container(release, res, vol),
                                  signing_map),
            },
            "strategy": {"canary": {
                "stableService": name,
                "canaryService": canary_service,
                # Never fewer serving pods than asked for while the candidate loads.
                "maxSurge": 1,
                "maxUnavailable": 0,
                "trafficRouting": {"alb": {"ingress": name, "servicePort": port}},
                "steps": _steps(release, name, traffic),
            }},
        },
    }

    def service(service_name: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {**meta_base, "name": service_name,
                         "labels": {"app.kubernetes.io/name": name,
                                    "app.kubernetes.io/managed-by": "k3a"}},
            # Argo Rollouts adds the ReplicaSet's pod-template hash to each selector.
            "spec": {"type": "ClusterIP", "selector": selector,
                     "ports": [{"name": "http", "port": port, "targetPort": "http"}]},
        }

    ingress = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {**meta_base, "labels": {"app.kubernetes.io/name": name,
                                             "app.kubernetes.io/managed-by": "k3a"},
                     "annotations": {
                         "alb.ingress.kubernetes.io/scheme": "internal",
                         "alb.ingress.kubernetes.io/target-type": "ip",
                         "alb.ingress.kubernetes.io/healthcheck-path": "/health",
                     }},
        "spec": {
            "ingressClassName": "alb",
            # The controller rewrites the "use-annotation" action with the weighted
            # stable/canary target groups of the current step.
            "rules": [{"http": {"paths": [{
                "path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": name, "port": {"name": "use-annotation"}}},
            }]}}],
        },
    }
    budget = {"minAvailable": 1} if res.replicas == 1 else {"maxUnavailable": 1}
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {**meta_base, "labels": labels(release, name)},
        "spec": {**budget, "selector": {"matchLabels": selector}},
    }
    compared = ([] if traffic.against_stable is None
                else [_against_stable_template(name, meta_base, traffic)])
    return [*cluster_objects, _analysis_template(name, meta_base, traffic), *compared, rollout,
            service(name), service(canary_service), ingress, pdb]
