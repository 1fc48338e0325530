"""Target ``hyperpod``: one ``InferenceEndpointConfig`` (``inference.sagemaker.aws.amazon.com/v1``)
whose model source is the tuple's S3 prefix or its FSx path.

Warm start: the HyperPod inference operator owns the pod it runs (one worker container, the
model volume it mounts from ``modelSourceConfig``, no init containers or extra volumes of
ours), so nothing here can verify a warm-start artifact before vLLM imports it. The render
therefore sets no cache variable and vLLM compiles into the container's own cache: a
HyperPod endpoint starts cold. What would be safe there is the same gate as on EKS
(``k3a warm use``: policy, tuple, GPU, layout, signature, every file's digest) running in a
container the operator lets us add; until it allows one, use the EKS node-cache target where
start-up time matters (docs/guides/warm-start.md)."""

from __future__ import annotations

from typing import Any

from k3artifacts.errors import ConfigError
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.serving.profiles import serving_resources
from k3artifacts.serving.render.common import (
    ANNOTATION,
    HYPERPOD_API,
    VLLM_COMMAND,
    VOLUME,
    annotations,
    env_list,
    gpu_resources,
    labels,
    probes,
    serving_args,
    weights_volume,
)


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
                "args": serving_args(release),
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
