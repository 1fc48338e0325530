"""Target ``eks``: the weights volume (PV + PVC), a Deployment (single node) or a LeaderWorkerSet
(multi-node, vLLM over Ray), a Service and a PodDisruptionBudget. Every pod runs ``k3a verify``
of the bound revision on the mounted weights, under a timeout, before vLLM starts; rendered
with signatures checked (``--verify-signature``), that check starts with the tuple's and the
revision's signatures, by the keys the store's signed policy in force trusts, verified under
the root this client pins: a ConfigMap carries that pin (for the store as the pod mounts it)
and, for the record, the release identities in force as rendered."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from k3artifacts.errors import ConfigError
from k3artifacts.policy.signing_keys import VerifierTrust
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.serving.profiles import ServingResources, serving_resources
from k3artifacts.serving.render.common import (
    LWS_API,
    RAY_PORT,
    STORE_MOUNT,
    VLLM_COMMAND,
    VOLUME,
    WeightsVolume,
    annotations,
    env_list,
    gpu_resources,
    labels,
    loads_verified,
    probes,
    serving_args,
    slug,
    weights_volume,
)


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


#: The init container's ``XDG_CONFIG_HOME``: where it finds the pinned root (ConfigMap).
VERIFIER_CONFIG = "/etc/k3a/config"
VERIFIER_VOLUME = "verifier-trust"


@dataclass(frozen=True)
class VerifierMap:
    """The rendered ConfigMap the verifier mounts, and its keys holding the pin and heads."""

    document: dict[str, Any]
    #: The keys holding the pin and the heads its render saw.
    trust_keys: tuple[str, ...]
    #: The store's URL as the pod reaches it, the one the pin names.
    store: str = f"file://{STORE_MOUNT}"

    @property
    def name(self) -> str:
        return str(self.document["metadata"]["name"])


def verifier_config_map(name: str, namespace: str | None, trust: VerifierTrust,
                        store: str = f"file://{STORE_MOUNT}") -> VerifierMap:
    """The verifier's ConfigMap: this client's root pinned for the store as the pod reaches
    it (``store``: mounted, by default), the heads of its histories this client verified (the
    pod refuses a store set back behind them), and the release identities
    and channel rules in force (``release-identities.yaml``) as rendered."""
    pin = trust.pin_for(store)
    meta: dict[str, Any] = {"name": f"{name}-{VERIFIER_VOLUME}"}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = {"app.kubernetes.io/managed-by": "k3a"}
    document = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                "data": {**trust.signing, **pin}}
    return VerifierMap(document, tuple(pin), store)


def verify_container(
    release: ReleaseTuple, res: ServingResources, vol: WeightsVolume, *, signed: bool = False
) -> dict[str, Any]:
    if not res.verifier_image:
        raise ConfigError(
            f"tuple {release.id} names no verifier image; the EKS pod verifies the weights "
            "with k3a before vLLM starts",
            hint="re-create the tuple with --verifier-image <pipeline worker image>",
        )
    w = release.binding.weights
    # coreutils timeout: an init container that hangs on a sick mount must fail, not wait
    # forever (KServe #5611); the pod then restarts and the Deployment reports it.
    # With signatures: the tuple's signature (its record is in the store beside the weights),
    # then the revision's, then every byte against the signed manifest, by the keys of the
    # store's policy in force, verified under the root pinned in the rendered ConfigMap.
    target = [release.id, "--signature"] if signed else [f"{w.repo_id}@{w.commit}"]
    command = [
        "timeout", "--kill-after=30", str(res.verify_timeout_seconds),
        "k3a", "verify", *target, "--store", f"file://{STORE_MOUNT}",
        # The manifest on the volume must be the one the tuple bound, not merely consistent
        # with the files beside it.
        "--expect-digest", w.manifest_digest,
    ]  # fmt: skip
    mounts = [_mount(STORE_MOUNT, vol.store_subpath)]
    env: dict[str, Any] = {}
    if signed:
        mounts.append({"name": VERIFIER_VOLUME, "mountPath": VERIFIER_CONFIG, "readOnly": True})
        env["env"] = [{"name": "XDG_CONFIG_HOME", "value": VERIFIER_CONFIG}]
    return {
        "name": "verify-weights",
        "image": res.verifier_image,
        "command": command,
        **env,
        "resources": {
            "requests": {"cpu": "4", "memory": "8Gi"},
            "limits": {"memory": "8Gi"},
        },
        "volumeMounts": mounts,
    }


def _pod_spec(
    release: ReleaseTuple,
    res: ServingResources,
    vol: WeightsVolume,
    volume: dict,
    container: dict,
    verifier: VerifierMap | None = None,
) -> dict:
    volumes = [
        volume,
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": res.pod.shm_size}},
    ]
    if verifier is not None:  # only the pin is mounted: the pod reads keys from the store
        volumes.append({"name": VERIFIER_VOLUME, "configMap": {
            "name": verifier.name,
            "items": [{"key": key, "path": f"k3artifacts/trust/{key}"}
                      for key in verifier.trust_keys],
        }})
    if loads_verified(release):  # vLLM verifies as it reads: no pass over the weights before
        _load_verified(release, vol, container, verifier)
        init = {}
    else:
        init = {"initContainers": [
            verify_container(release, res, vol, signed=verifier is not None)]}
    return {
        **init,
        "containers": [container],
        "volumes": volumes,
        "nodeSelector": {"node.kubernetes.io/instance-type": res.node_instance_type},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 120,
    }


def _load_verified(release: ReleaseTuple, vol: WeightsVolume, container: dict,
                   verifier: VerifierMap | None) -> None:
    """vLLM with ``--load-format k3a``: told the tuple and the store (mounted read-only, as
    the verifier would see it), with the pinned root where ``k3a verify --signature`` finds it.
    Every rank loads, so the worker containers of a multi-node group get the same mounts."""
    if verifier is None:
        raise ConfigError(
            f"tuple {release.id} loads with --load-format k3a, which checks the tuple's "
            "signatures under the root this client pins: the pod needs that pin",
            hint="render with --verify-signature",
        )
    if "args" in container:
        extra = {"tuple": release.id, "store": verifier.store}
        container["args"] = [*container["args"], "--model-loader-extra-config",
                             json.dumps(extra, sort_keys=True, separators=(",", ":"))]
    container["env"] = [*container["env"], {"name": "XDG_CONFIG_HOME", "value": VERIFIER_CONFIG}]
    container["volumeMounts"] = [
        *container["volumeMounts"], _mount(STORE_MOUNT, vol.store_subpath),
        {"name": VERIFIER_VOLUME, "mountPath": VERIFIER_CONFIG, "readOnly": True}]


def _vllm_container(
    release: ReleaseTuple, res: ServingResources, vol: WeightsVolume, **extra
) -> dict:
    b = release.binding
    container = {
        "name": "vllm",
        "image": b.image.reference,
        "command": VLLM_COMMAND,
        "args": serving_args(release),
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


def render_eks(
    release: ReleaseTuple,
    *,
    name: str,
    namespace: str | None,
    verifier: VerifierTrust | None = None,
    pod_store: str = f"file://{STORE_MOUNT}",
) -> list[dict]:
    """``verifier``: the store's root and release identities as this client trusts them
    (:func:`k3artifacts.policy.signing_keys.verifier_trust`); given, the init container checks
    the tuple's and the revision's signatures first (with ``--load-format k3a``, vLLM does).
    ``pod_store``: the store's URL as the pods reach it, which the pin names."""
    b = release.binding
    res = serving_resources(b.serving, f"tuple {release.id}")
    vol = weights_volume(release, res)
    cluster_objects, volume = _volume_objects(release, vol, name, namespace)
    signing_map = None
    if verifier is not None:
        signing_map = verifier_config_map(name, namespace, verifier, pod_store)
        cluster_objects.append(signing_map.document)
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
                        release, res, vol, volume, _vllm_container(release, res, vol),
                        signing_map,
                    ),
                },
            },
        }
        service_selector = selector
    else:
        workload = _leader_worker_set(release, res, vol, volume, meta, pod_meta, signing_map)
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
    signing_map: VerifierMap | None = None,
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
                    "spec": _pod_spec(release, res, vol, volume, leader, signing_map),
                },
                "workerTemplate": {
                    "metadata": {**pod_meta, "labels": {**pod_meta["labels"], "role": "worker"}},
                    "spec": _pod_spec(release, res, vol, volume, worker, signing_map),
                },
            },
        },
    }
