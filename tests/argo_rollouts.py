"""Validation of rendered Argo Rollouts objects (``Rollout``, ``AnalysisTemplate``) with unknown
fields refused.

No package on PyPI ships Argo Rollouts' CRDs or their OpenAPI schema, and fetched upstream
files are not committed here. Two checks, then:

* always: :data:`ROLLOUT` / :data:`ANALYSIS_TEMPLATE`, structural schemas written from the
  upstream CRDs (argoproj/argo-rollouts ``manifests/crds/rollout-crd.yaml`` and
  ``analysis-template-crd.yaml`` at commit 9f8d111d8f8e, v1.10.0-rc1+70, ``argoproj.io/v1alpha1``).
  Every object on the paths we render lists exactly the property names upstream declares
  there, with upstream's types and ``required``; subtrees we do not render are any object.
  The pod template is a core ``PodTemplateSpec``, checked by kubernetes-validate.
* when ``K3A_ARGO_ROLLOUTS_CRDS`` names a directory holding those two upstream files: the
  objects against the CRDs' own ``openAPIV3Schema``, every object schema closed
  (``additionalProperties: false`` unless upstream preserves unknown fields), as the API
  server's pruning would silently drop a field we misspelled.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS_ENV = "K3A_ARGO_ROLLOUTS_CRDS"
UPSTREAM = "argoproj/argo-rollouts@9f8d111d8f8e (v1.10.0-rc1+70)"

STR = {"type": "string"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}
INT_OR_STR = {"anyOf": [INT, STR]}
ANY_OBJECT = {"type": "object"}
STR_MAP = {"type": "object", "additionalProperties": STR}


def _closed(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def _upstream(names: str, **typed: Any) -> dict[str, Any]:
    """Every name upstream declares at one path: typed where we render it, else any value."""
    return {name: typed.get(name, {}) for name in names.split()}


METADATA = _closed(_upstream("name namespace labels annotations",
                             name=STR, namespace=STR, labels=STR_MAP, annotations=STR_MAP))
RUN_ARGS = {"type": "array", "items": _closed(
    _upstream("name value valueFrom", name=STR, value=STR, valueFrom=ANY_OBJECT), ["name"])}

STEP = _closed(_upstream(
    "analysis experiment pause plugin setCanaryScale setHeaderRoute setMirrorRoute setWeight",
    setWeight=INT,
    pause=_closed({"duration": INT_OR_STR}),
    analysis=_closed(_upstream(
        "analysisRunMetadata args dryRun measurementRetention templates",
        analysisRunMetadata=_closed({"annotations": STR_MAP, "labels": STR_MAP}),
        args=RUN_ARGS,
        templates={"type": "array", "items": _closed(
            {"clusterScope": BOOL, "templateName": STR})},
    )),
))

CANARY = _closed(_upstream(
    "abortScaleDownDelaySeconds analysis antiAffinity canaryMetadata canaryService "
    "dynamicStableScale maxSurge maxUnavailable minPodsPerReplicaSet pingPong "
    "replicaProgressThreshold scaleDownDelayRevisionLimit scaleDownDelaySeconds stableMetadata "
    "stableService steps trafficRouting",
    canaryService=STR, stableService=STR, maxSurge=INT_OR_STR, maxUnavailable=INT_OR_STR,
    steps={"type": "array", "items": STEP},
    trafficRouting=_closed(_upstream(
        "alb ambassador apisix appMesh istio managedRoutes maxTrafficWeight nginx plugins smi "
        "traefik",
        alb=_closed(_upstream(
            "annotationPrefix ingress ingresses rootService servicePort stickinessConfig",
            ingress=STR, servicePort=INT, rootService=STR), ["servicePort"]),
    )),
))

ROLLOUT = _closed({
    "apiVersion": {"const": "argoproj.io/v1alpha1"},
    "kind": {"const": "Rollout"},
    "metadata": METADATA,
    "spec": _closed(_upstream(
        "analysis minReadySeconds paused progressDeadlineAbort progressDeadlineSeconds replicas "
        "restartAt revisionHistoryLimit rollbackWindow selector strategy template workloadRef",
        replicas=INT, progressDeadlineSeconds=INT, progressDeadlineAbort=BOOL,
        selector=_closed({"matchExpressions": {"type": "array"}, "matchLabels": STR_MAP}),
        strategy=_closed({"blueGreen": ANY_OBJECT, "canary": CANARY}),
        # A core PodTemplateSpec: kubernetes-validate checks it.
        template=ANY_OBJECT,
    )),
}, ["apiVersion", "kind", "metadata", "spec"])

ANALYSIS_TEMPLATE = _closed({
    "apiVersion": {"const": "argoproj.io/v1alpha1"},
    "kind": {"const": "AnalysisTemplate"},
    "metadata": METADATA,
    "spec": _closed(_upstream(
        "args dryRun measurementRetention metrics templates",
        args={"type": "array", "items": _closed(
            _upstream("name value valueFrom", name=STR, value=STR), ["name"])},
        metrics={"type": "array", "minItems": 1, "items": _closed(_upstream(
            "consecutiveErrorLimit consecutiveSuccessLimit count failureCondition failureLimit "
            "inconclusiveLimit initialDelay interval name provider successCondition",
            name=STR, successCondition=STR, failureCondition=STR, failureLimit=INT_OR_STR,
            count=INT_OR_STR, interval=STR, initialDelay=STR,
            provider=_closed(_upstream(
                "cloudWatch datadog graphite influxdb job kayenta newRelic plugin prometheus "
                "skywalking wavefront web",
                prometheus=_closed(_upstream(
                    "address authentication headers insecure query rangeQuery timeout",
                    address=STR, query=STR, insecure=BOOL, timeout=INT)),
            )),
        ), ["name", "provider"])},
    )),
}, ["apiVersion", "kind", "metadata", "spec"])

STRUCTURAL = {"Rollout": ROLLOUT, "AnalysisTemplate": ANALYSIS_TEMPLATE}
CRD_FILES = {"Rollout": "rollout-crd.yaml", "AnalysisTemplate": "analysis-template-crd.yaml"}


def validate_structural(doc: dict) -> None:
    jsonschema.validate(doc, STRUCTURAL[doc["kind"]])


def crds_dir() -> Path | None:
    where = os.environ.get(CRDS_ENV)
    if not where:
        return None
    path = Path(where)
    return path if all((path / f).is_file() for f in CRD_FILES.values()) else None


def close(schema: Any) -> Any:
    """The schema with every object that declares properties refusing others."""
    if isinstance(schema, dict):
        out = {k: close(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [close(v) for v in schema]
    return schema


def crd_schema(directory: Path, kind: str) -> dict:
    crd = yaml.safe_load((directory / CRD_FILES[kind]).read_text())
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = close(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    # metadata is `type: object` upstream (the API server's ObjectMeta): closed as ours.
    schema["properties"]["metadata"] = METADATA
    return schema


def validate_upstream(doc: dict, directory: Path) -> None:
    jsonschema.validate(doc, crd_schema(directory, doc["kind"]))
