"""Warm start in the node-cache pods (``eks-node-cache``) and the pre-warm DaemonSet.

The serving pod gets one more init container, ``warm-start``: ``k3a warm use`` (it holds the
GPUs the server will hold, so ``nvidia-smi`` names the model) re-reads the tuple's warm
manifest from the store, holds it to the channel's policy, pulls the artifact into the node
cache if the pre-warm DaemonSet has not, and copies it, re-verified, into a per-tuple working
directory on the node; a miss leaves that directory empty and the pod starts cold. vLLM
mounts that directory read-write and reads its caches through ``VLLM_CACHE_ROOT``,
``TRITON_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR``, ``FLASHINFER_WORKSPACE_BASE`` and
``DG_JIT_CACHE_DIR``.

The capture Job runs ``k3a warm capture --if-absent`` on a node serving the tuple (pod
affinity to the endpoint), once the endpoint answers ``/health``, over that same working
directory (mounted read-only): the first node to serve a tuple makes its artifact.
"""

from __future__ import annotations

import copy
from typing import Any

from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.serving.profiles import ServingResources
from k3artifacts.warm.model import CACHE_ROOTS, INSTANCE_GPUS

WORK_MOUNT = "/k3a-warm"


def work_subpath(release: ReleaseTuple) -> str:
    return f"warm-work/{release.id}"


def cache_env() -> list[dict[str, str]]:
    return [{"name": var, "value": f"{WORK_MOUNT}/{name}"} for name, var in CACHE_ROOTS.items()]


def instance_gpu(res: ServingResources) -> str | None:
    return INSTANCE_GPUS.get(res.node_instance_type)


def use_container(release: ReleaseTuple, res: ServingResources, store_url: str,
                  store_mounts: list[dict], env: list[dict], cache_volume: str,
                  cache_mount: str, gpu_resources: dict) -> dict:
    container: dict[str, Any] = {
        "name": "warm-start",
        "image": res.verifier_image,
        "command": [
            "timeout", "--kill-after=30", "1800",
            "k3a", "warm", "use", release.id, "--store", store_url, "--to", cache_mount,
            "--into", WORK_MOUNT,
        ],  # fmt: skip
        # The server's GPUs (init containers run before it, so this costs none): the GPU
        # model the artifact must have been captured on is the one nvidia-smi sees here.
        "resources": copy.deepcopy(gpu_resources),
        "volumeMounts": [{"name": cache_volume, "mountPath": cache_mount},
                         {"name": cache_volume, "mountPath": WORK_MOUNT,
                          "subPath": work_subpath(release)}, *store_mounts],
    }
    if env:
        container["env"] = list(env)
    return container


def serve_warm(container: dict, release: ReleaseTuple, cache_volume: str) -> None:
    """vLLM reads (and adds to) its caches in the pod's working directory."""
    container["env"] = [*container.get("env", []), *cache_env()]
    container["volumeMounts"] = [*container["volumeMounts"],
                                 {"name": cache_volume, "mountPath": WORK_MOUNT,
                                  "subPath": work_subpath(release)}]


def prewarm_container(release: ReleaseTuple, res: ServingResources, store_url: str,
                      store_mounts: list[dict], env: list[dict], cache_volume: str,
                      cache_mount: str) -> dict | None:
    """Pulls the warm artifact for the instance type's GPU (a DaemonSet pod holds no GPU)."""
    gpu = instance_gpu(res)
    if gpu is None:
        return None
    container: dict[str, Any] = {
        "name": "pull-warm",
        "image": res.verifier_image,
        "command": ["k3a", "warm", "pull", release.id, "--gpu", gpu, "--store", store_url,
                    "--to", cache_mount],
        "resources": {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
        "volumeMounts": [{"name": cache_volume, "mountPath": cache_mount}, *store_mounts],
    }
    if env:
        container["env"] = list(env)
    return container


def _writable(volume: dict) -> dict:
    volume = copy.deepcopy(volume)
    if "persistentVolumeClaim" in volume:
        volume["persistentVolumeClaim"].pop("readOnly", None)
    return volume


def capture_job(release: ReleaseTuple, res: ServingResources, *, name: str,
                namespace: str | None, labels: dict, store_url: str, store_mounts: list[dict],
                store_volumes: list[dict], env: list[dict], cache_volume: dict,
                cache_mount: str) -> dict:
    """A Job on a node serving ``release`` that captures its caches once the endpoint
    answers (``--if-absent``: an artifact already captured by another node stands)."""
    port = release.binding.serving.port
    wait = ("import sys, time, urllib.request\n"
            "while True:\n"
            "    try:\n"
            f"        urllib.request.urlopen('http://{name}:{port}/health', timeout=10)\n"
            "        sys.exit(0)\n"
            "    except Exception:\n"
            "        time.sleep(30)\n")
    dirs = [f"{n}={WORK_MOUNT}/{n}" for n in CACHE_ROOTS]
    # The capture writes to the store (S3: the service account's role; a file store: its
    # mount, read-write here only; an FSx PV bound ReadOnlyMany needs a writable one).
    store_mounts = [{k: v for k, v in m.items() if k != "readOnly"} for m in store_mounts]
    store_volumes = [_writable(v) for v in store_volumes]
    meta: dict[str, Any] = {"name": f"{name}-warm-capture"[:63]}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = {"app.kubernetes.io/managed-by": "k3a"}
    gpu = ["--gpu", instance_gpu(res)] if instance_gpu(res) else []
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 3,
            "activeDeadlineSeconds": res.startup_seconds + res.verify_timeout_seconds + 3600,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/managed-by": "k3a"}},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": dict(labels)},
                         "topologyKey": "kubernetes.io/hostname"}]}},
                    "initContainers": [{
                        "name": "wait-for-endpoint",
                        "image": res.verifier_image,
                        "command": ["python3", "-c", wait],
                        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"},
                                      "limits": {"memory": "128Mi"}},
                    }],
                    "containers": [{
                        "name": "capture",
                        "image": res.verifier_image,
                        "command": ["k3a", "warm", "capture", release.id, *dirs, *gpu,
                                    "--store", store_url, "--if-absent"],
                        "resources": {"requests": {"cpu": "2", "memory": "2Gi"},
                                      "limits": {"memory": "4Gi"}},
                        "volumeMounts": [{"name": cache_volume["name"], "mountPath": WORK_MOUNT,
                                          "subPath": work_subpath(release), "readOnly": True},
                                         *store_mounts],
                        **({"env": list(env)} if env else {}),
                    }],
                    "volumes": [cache_volume, *store_volumes],
                    "nodeSelector": {"node.kubernetes.io/instance-type": res.node_instance_type},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                     "effect": "NoSchedule"}],
                },
            },
        },
    }
