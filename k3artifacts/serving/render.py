"""Serving manifests rendered from a release tuple alone.

The tuple is the only input that decides what runs: weights location, image digest, argv, env
and the profile's resources. The same tuple (and the same naming options) gives byte-identical
YAML on any machine, so a rendered file can be diffed, reviewed and committed; rolling back is
rendering the previous tuple and applying it. Targets:

* ``hyperpod``: one ``InferenceEndpointConfig`` (``inference.sagemaker.aws.amazon.com/v1``),
  the model source being the tuple's S3 prefix or its FSx path.
* ``eks``: the weights volume (PV + PVC), a Deployment (single node) or a LeaderWorkerSet
  (multi-node, vLLM over Ray), a Service and a PodDisruptionBudget. Every pod runs
  ``k3a verify`` of the bound revision on the mounted weights, under a timeout, before vLLM.

Probes, for a server whose cold start reads ~1.5 TB: a startup probe on ``/health`` with a
budget of the profile's ``startup_seconds`` (liveness does not run until it passes, so a slow
load is not killed); readiness asks for a real one-token completion, so a pod whose HTTP server
is up but whose engine cannot generate receives no traffic; liveness on ``/health`` restarts a
dead engine.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote, urlparse

import yaml

from k3artifacts.errors import ConfigError
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.revisions.manifest import revision_prefix
from k3artifacts.serving.profiles import ServingResources, serving_resources

Target = Literal["hyperpod", "eks"]
TARGETS: tuple[Target, ...] = ("hyperpod", "eks")
CHANNEL_PREFIX = "releases/channels/"
ANNOTATION = "k3a.io"
VOLUME = "model-weights"
STORE_MOUNT = "/k3a-store"
VLLM_COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
HYPERPOD_API = "inference.sagemaker.aws.amazon.com/v1"
LWS_API = "leaderworkerset.x-k8s.io/v1"
RAY_PORT = 6379


# ---- which tuple ----------------------------------------------------------------------------


# ---- where the weights are ------------------------------------------------------------------


@dataclass(frozen=True)
class WeightsVolume:
    """How a pod sees the tuple's weights: one volume whose root is ``volume_root``."""

    kind: Literal["s3", "fsx", "host"]
    #: Path of the store root inside the volume ("" when the volume root is the store root).
    store_subpath: str
    #: Path of the revision inside the volume.
    model_subpath: str
    bucket: str | None = None
    s3_prefix: str = ""
    region: str | None = None
    host_path: str | None = None
    details: dict[str, str] = field(default_factory=dict)


def weights_volume(release: ReleaseTuple, res: ServingResources) -> WeightsVolume:
    weights = release.binding.weights
    suffix = revision_prefix(weights.repo_id, weights.commit)
    location = weights.location.rstrip("/")
    if not location.endswith("/" + suffix):
        raise ConfigError(
            f"tuple {release.id}: weights location {location} does not end in {suffix}"
        )
    store_root = location[: -len(suffix) - 1]
    parsed = urlparse(store_root)
    if parsed.scheme == "s3":
        if not res.storage.s3_region:
            raise ConfigError(
                f"tuple {release.id}: weights are in S3 but the tuple records no region",
                hint="re-create the tuple with --s3-region REGION",
            )
        prefix = parsed.path.strip("/")
        return WeightsVolume(
            kind="s3",
            store_subpath="",
            model_subpath=suffix,
            bucket=parsed.netloc,
            s3_prefix=prefix,
            region=res.storage.s3_region,
        )
    if parsed.scheme != "file":
        raise ConfigError(f"tuple {release.id}: unsupported weights location {location}")
    root_path = posixpath.normpath(unquote(parsed.path))
    fsx = res.storage.fsx
    if fsx is None:
        return WeightsVolume(
            kind="host", store_subpath="", model_subpath=suffix, host_path=root_path
        )
    rel = posixpath.relpath(root_path, fsx.mounted_at)
    if rel == ".." or rel.startswith("../"):
        raise ConfigError(
            f"tuple {release.id}: store {root_path} is not under the FSx mount {fsx.mounted_at}",
            hint="re-create the tuple with the --fsx-mounted-at the store lives under",
        )
    rel = "" if rel == "." else rel
    return WeightsVolume(
        kind="fsx",
        store_subpath=rel,
        model_subpath=posixpath.join(rel, suffix) if rel else suffix,
        details={
            "fileSystemId": fsx.file_system_id,
            "dnsName": fsx.dns_name,
            "mountName": fsx.mount_name,
        },
    )


# ---- shared pieces --------------------------------------------------------------------------


def slug(text: str) -> str:
    value = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return value[:63].rstrip("-") or "model"


def served_name(release: ReleaseTuple) -> str:
    for arg in release.binding.serving.args:
        if arg.startswith("--served-model-name="):
            return arg.split("=", 1)[1]
    return release.binding.serving.model_path


def default_name(release: ReleaseTuple) -> str:
    """A stable object name: the same for every tuple of a model and profile, so applying a new
    tuple's render updates the endpoint in place and rollback is applying the old render."""
    return slug(f"{served_name(release)}-{release.binding.serving.profile}")


def annotations(release: ReleaseTuple) -> dict[str, str]:
    b = release.binding
    return {
        f"{ANNOTATION}/tuple-id": release.id,
        f"{ANNOTATION}/revision": f"{b.weights.repo_id}@{b.weights.commit}",
        f"{ANNOTATION}/manifest-digest": b.weights.manifest_digest,
        f"{ANNOTATION}/weights": b.weights.location,
        f"{ANNOTATION}/image": b.image.reference,
        f"{ANNOTATION}/profile": b.serving.profile,
        f"{ANNOTATION}/license-sha256": b.license_sha256 or "none",
    }


def labels(release: ReleaseTuple, name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/managed-by": "k3a",
        f"{ANNOTATION}/tuple-id": release.id,
    }


def completion_check(release: ReleaseTuple) -> list[str]:
    """An exec probe that asks the server for one token (python3 is in every vLLM image)."""
    port = release.binding.serving.port
    body = json.dumps(
        {"model": served_name(release), "prompt": "ping", "max_tokens": 1}, sort_keys=True
    )
    script = (
        "import sys, urllib.request as u; "
        f"u.urlopen(u.Request('http://127.0.0.1:{port}/v1/completions', data={body!r}.encode(), "
        "headers={'Content-Type': 'application/json'}), timeout=25); sys.exit(0)"
    )  # urlopen raises on any non-2xx answer or timeout: the probe fails
    return ["python3", "-c", script]


def probes(release: ReleaseTuple, res: ServingResources) -> dict[str, Any]:
    port = release.binding.serving.port
    period = 10
    return {
        "startupProbe": {
            "httpGet": {"path": "/health", "port": port},
            "periodSeconds": period,
            "timeoutSeconds": 5,
            "failureThreshold": max(1, res.startup_seconds // period),
        },
        "readinessProbe": {
            "exec": {"command": completion_check(release)},
            "periodSeconds": 30,
            "timeoutSeconds": 30,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": port},
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 5,
        },
    }


def env_list(release: ReleaseTuple) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in sorted(release.binding.serving.env.items())]


def gpu_resources(res: ServingResources) -> dict[str, dict[str, Any]]:
    gpus = str(res.gpus_per_node)
    return {
        "requests": {"cpu": res.pod.cpu, "memory": res.pod.memory, "nvidia.com/gpu": gpus},
        "limits": {"memory": res.pod.memory, "nvidia.com/gpu": gpus},
    }


# ---- HyperPod -------------------------------------------------------------------------------


def render_hyperpod(release: ReleaseTuple, *, name: str, namespace: str | None) -> list[dict]:
    b = release.binding
    res = serving_resources(b.serving, f"tuple {release.id}")
    if res.nodes != 1:
        raise ConfigError(
            f"tuple {release.id}: profile {b.serving.profile} spans {res.nodes} nodes; an "
            "InferenceEndpointConfig runs one pod per replica",
            hint="render it with --target eks (a LeaderWorkerSet), or use a single-node profile",
        )
    vol = weights_volume(release, res)
    if vol.kind == "s3":
        source: dict[str, Any] = {
            "modelSourceType": "s3",
            "s3Storage": {"bucketName": vol.bucket, "region": vol.region},
            "modelLocation": "/".join(p for p in (vol.s3_prefix, vol.model_subpath) if p),
        }
    elif vol.kind == "fsx":
        source = {
            "modelSourceType": "fsx",
            "fsxStorage": vol.details,
            "modelLocation": vol.model_subpath,
        }
    else:
        raise ConfigError(
            f"tuple {release.id}: weights are on a local path ({vol.host_path}) that HyperPod "
            "cannot mount",
            hint="stage to S3 or FSx, or re-create the tuple with --fsx-id/--fsx-dns-name/"
            "--fsx-mount-name/--fsx-mounted-at",
        )
    source["prefetchEnabled"] = False  # 1.5 TB does not fit in host RAM ahead of the GPUs
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = labels(release, name)
    metadata["annotations"] = annotations(release)
    doc = {
        "apiVersion": HYPERPOD_API,
        "kind": "InferenceEndpointConfig",
        "metadata": metadata,
        "spec": {
            "modelName": name,
            "endpointName": name,
            "instanceType": res.instance_type,
            "replicas": res.replicas,
            "invocationEndpoint": "v1/chat/completions",
            "maxDeployTimeInSeconds": res.startup_seconds + 600,
            "tags": [{"name": f"{ANNOTATION}/tuple-id", "value": release.id}],
            "modelSourceConfig": source,
            "worker": {
                "image": b.image.reference,
                "command": VLLM_COMMAND,
                "args": list(b.serving.args),
                "environmentVariables": env_list(release),
                "modelInvocationPort": {"containerPort": b.serving.port, "name": "http"},
                "modelVolumeMount": {"name": VOLUME, "mountPath": b.serving.model_path},
                "resources": gpu_resources(res),
                "probes": probes(release, res),
                "requestLimits": {
                    "maxConcurrentRequests": res.request_limits.max_concurrent_requests,
                    "maxQueueSize": res.request_limits.max_queue_size,
                    "overflowStatusCode": res.request_limits.overflow_status_code,
                },
            },
        },
    }
    return [doc]


# ---- EKS ------------------------------------------------------------------------------------


def _volume_objects(release: ReleaseTuple, vol: WeightsVolume, name: str, namespace: str | None):
    """(cluster objects to create, the pod's volume entry) for the weights."""
    if vol.kind == "host":
        # A node-local tree (e.g. a copy on instance NVMe): no PV, the node must hold it.
        return [], {"name": VOLUME, "hostPath": {"path": vol.host_path, "type": "Directory"}}
    claim_name = f"{name}-weights"
    # A PV binds one claim only: one PV per claim, named after its namespace and claim.
    pv_name = slug(f"{namespace or 'default'}-{claim_name}")
    if vol.kind == "fsx":
        csi = {
            "driver": "fsx.csi.aws.com",
            "volumeHandle": vol.details["fileSystemId"],
            "volumeAttributes": {
                "dnsname": vol.details["dnsName"],
                "mountname": vol.details["mountName"],
            },
        }
        mount_options = ["flock"]
    else:
        # Mountpoint for S3: read-only, the volume root is the store's prefix.
        csi = {
            "driver": "s3.csi.aws.com",
            "volumeHandle": pv_name,
            "volumeAttributes": {"bucketName": vol.bucket},
        }
        mount_options = [f"region {vol.region}", "read-only"]
        if vol.s3_prefix:
            mount_options.append(f"prefix {vol.s3_prefix}/")
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "labels": {"app.kubernetes.io/managed-by": "k3a"}},
        "spec": {
            "capacity": {"storage": "2400Gi"},
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "mountOptions": mount_options,
            "csi": csi,
        },
    }
    claim_meta: dict[str, Any] = {"name": claim_name}
    if namespace:
        claim_meta["namespace"] = namespace
    claim_meta["labels"] = {"app.kubernetes.io/managed-by": "k3a"}
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": claim_meta,
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "2400Gi"}},
        },
    }
    volume = {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim_name, "readOnly": True}}
    return [pv, pvc], volume


def _mount(path: str, subpath: str) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": VOLUME, "mountPath": path, "readOnly": True}
    if subpath:
        mount["subPath"] = subpath
    return mount


def verify_container(release: ReleaseTuple, res: ServingResources, vol: WeightsVolume) -> dict:
    if not res.verifier_image:
        raise ConfigError(
            f"tuple {release.id} names no verifier image; the EKS pod verifies the weights "
            "with k3a before vLLM starts",
            hint="re-create the tuple with --verifier-image <pipeline worker image>",
        )
    w = release.binding.weights
    # coreutils timeout: an init container that hangs on a sick mount must fail, not wait
    # forever (KServe #5611); the pod then restarts and the Deployment reports it.
    command = [
        "timeout", "--kill-after=30", str(res.verify_timeout_seconds),
        "k3a", "verify", f"{w.repo_id}@{w.commit}", "--store", f"file://{STORE_MOUNT}",
        # The manifest on the volume must be the one the tuple bound, not merely consistent
        # with the files beside it.
        "--expect-digest", w.manifest_digest,
    ]  # fmt: skip
    return {
        "name": "verify-weights",
        "image": res.verifier_image,
        "command": command,
        "resources": {
            "requests": {"cpu": "4", "memory": "8Gi"},
            "limits": {"memory": "8Gi"},
        },
        "volumeMounts": [_mount(STORE_MOUNT, vol.store_subpath)],
    }


def _pod_spec(
    release: ReleaseTuple,
    res: ServingResources,
    vol: WeightsVolume,
    volume: dict,
    container: dict,
) -> dict:
    return {
        "initContainers": [verify_container(release, res, vol)],
        "containers": [container],
        "volumes": [
            volume,
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": res.pod.shm_size}},
        ],
        "nodeSelector": {"node.kubernetes.io/instance-type": res.node_instance_type},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 120,
    }


def _vllm_container(
    release: ReleaseTuple, res: ServingResources, vol: WeightsVolume, **extra
) -> dict:
    b = release.binding
    container = {
        "name": "vllm",
        "image": b.image.reference,
        "command": VLLM_COMMAND,
        "args": list(b.serving.args),
        "env": env_list(release),
        "ports": [{"name": "http", "containerPort": b.serving.port}],
        "resources": gpu_resources(res),
        "volumeMounts": [
            _mount(b.serving.model_path, vol.model_subpath),
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        **probes(release, res),
    }
    container.update(extra)
    return container


def render_eks(release: ReleaseTuple, *, name: str, namespace: str | None) -> list[dict]:
    b = release.binding
    res = serving_resources(b.serving, f"tuple {release.id}")
    vol = weights_volume(release, res)
    cluster_objects, volume = _volume_objects(release, vol, name, namespace)
    meta_base: dict[str, Any] = {"name": name}
    if namespace:
        meta_base["namespace"] = namespace
    selector = {"app.kubernetes.io/name": name}
    pod_meta = {"labels": labels(release, name), "annotations": annotations(release)}
    meta = {**meta_base, "labels": labels(release, name), "annotations": annotations(release)}
    if res.nodes == 1:
        workload = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": res.replicas,
                "selector": {"matchLabels": selector},
                # Never take a serving pod down before its replacement can generate: a
                # rollback or upgrade needs one spare GPU node while it runs.
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
                },
                "progressDeadlineSeconds": res.startup_seconds + res.verify_timeout_seconds + 600,
                "template": {
                    "metadata": pod_meta,
                    "spec": _pod_spec(
                        release, res, vol, volume, _vllm_container(release, res, vol)
                    ),
                },
            },
        }
        service_selector = selector
    else:
        workload = _leader_worker_set(release, res, vol, volume, meta, pod_meta)
        service_selector = {**selector, "role": "leader"}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            **meta_base,
            "labels": labels(release, name),
            "annotations": annotations(release),
        },
        "spec": {
            "type": "ClusterIP",
            "selector": service_selector,
            "ports": [{"name": "http", "port": b.serving.port, "targetPort": "http"}],
        },
    }
    # One replica: a drain must not take the only server down (scale up first); several:
    # one at a time.
    budget = {"minAvailable": 1} if res.replicas == 1 else {"maxUnavailable": 1}
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {**meta_base, "labels": labels(release, name)},
        "spec": {**budget, "selector": {"matchLabels": selector}},
    }
    return [*cluster_objects, workload, service, pdb]


def _leader_worker_set(
    release: ReleaseTuple,
    res: ServingResources,
    vol: WeightsVolume,
    volume: dict,
    meta: dict,
    pod_meta: dict,
) -> dict:
    """vLLM multi-node: a Ray head plus the API server in the leader, Ray workers elsewhere.
    The leader waits until the whole group has joined before vLLM places its stages."""
    leader_script = (
        f"ray start --head --port={RAY_PORT} && "
        'until [ "$(python3 -c \'import ray; ray.init(address="auto", logging_level="ERROR"); '
        'print(sum(n["Alive"] for n in ray.nodes()))\')" -ge "$LWS_GROUP_SIZE" ]; '
        'do sleep 5; done && exec "$@"'
    )
    worker_script = f'exec ray start --address="$LWS_LEADER_ADDRESS:{RAY_PORT}" --block'
    leader = _vllm_container(
        release,
        res,
        vol,
        command=["sh", "-c", leader_script, "vllm-leader", *VLLM_COMMAND],
    )
    leader["ports"] = [*leader["ports"], {"name": "ray", "containerPort": RAY_PORT}]
    worker = {
        key: value
        for key, value in _vllm_container(release, res, vol).items()
        if key not in ("args", "ports", "startupProbe", "readinessProbe", "livenessProbe")
    }
    worker["command"] = ["sh", "-c", worker_script]
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": meta,
        "spec": {
            "replicas": res.replicas,
            "leaderWorkerTemplate": {
                "size": res.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {**pod_meta, "labels": {**pod_meta["labels"], "role": "leader"}},
                    "spec": _pod_spec(release, res, vol, volume, leader),
                },
                "workerTemplate": {
                    "metadata": {**pod_meta, "labels": {**pod_meta["labels"], "role": "worker"}},
                    "spec": _pod_spec(release, res, vol, volume, worker),
                },
            },
        },
    }


# ---- output ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    target: Target
    tuple_id: str
    name: str
    documents: list[dict]

    @property
    def filename(self) -> str:
        return f"{self.name}.{self.target}.yaml"

    def text(self) -> str:
        header = (
            f"# Rendered by k3a from release tuple {self.tuple_id} (target {self.target}).\n"
            "# Do not edit: change the tuple (k3a tuple create) and render again.\n"
        )
        body = "---\n".join(
            yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)
            for doc in self.documents
        )
        return header + "---\n" + body


def render(
    release: ReleaseTuple, target: str, *, name: str | None = None, namespace: str | None = None
) -> Rendered:
    name = slug(name) if name else default_name(release)
    if target == "hyperpod":
        docs = render_hyperpod(release, name=name, namespace=namespace)
    elif target == "eks":
        docs = render_eks(release, name=name, namespace=namespace)
    else:
        raise ConfigError(f"unknown render target {target!r}", hint="use hyperpod or eks")
    return Rendered(target=target, tuple_id=release.id, name=name, documents=docs)
