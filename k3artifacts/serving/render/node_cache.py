"""Targets ``eks-node-cache`` and ``eks-prewarm``: EKS pods that serve from the node's local
cache (``k3a pull``), and the DaemonSet that fills it ahead of a promotion.

``eks-node-cache`` (``k3a render --target eks --weights node-cache``) takes the EKS render
(:func:`.eks.render_eks`) and changes where the
weights come from: the first init container runs ``k3a pull <tuple>`` from the tuple's store
(S3 directly; FSx or a host tree through the same volume the store render uses) into a
hostPath on the node's instance-store NVMe, the second runs ``k3a verify --expect-digest`` on
the pulled revision directory, and vLLM mounts exactly that directory read-only. Where vLLM
loads with ``--load-format k3a`` (which hashes every byte as it reads it) there is no second
container and the pull runs with ``--verified-by-loader``: it fetches and hashes only what the
node lacks, and files the loader refused, which the loader records in the one directory of
the cache it may write (``.k3a-cache/refused``, mounted at ``/k3a-refused``): a node's copy is
read once from pull to first token. vLLM runs
under ``flock -s <lease file>`` (util-linux, in every vLLM image): a shared lock the node
cache's eviction honours, released by the kernel when the server dies.

``eks-prewarm`` renders a DaemonSet that pulls (and verifies, and leases while it
runs) a candidate tuple onto every GPU node of the profile's instance type, so promoting or
rolling back to it finds the weights already local.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from k3artifacts.errors import ConfigError
from k3artifacts.policy.signing_keys import VerifierTrust
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.serving.profiles import ServingResources, serving_resources
from k3artifacts.serving.render.common import (
    STORE_MOUNT,
    VOLUME,
    WeightsVolume,
    annotations,
    labels,
    loads_verified,
    slug,
    weights_volume,
)
from k3artifacts.serving.render.eks import _mount, _volume_objects, render_eks
from k3artifacts.serving.render.warm import (
    capture_job,
    prewarm_container,
    serve_warm,
    use_container,
)

#: The instance-store RAID0 that EKS AL2023 GPU nodes mount with nodeadm's
#: ``localStorage: {strategy: RAID0}`` (p5, p6: 8 NVMe drives, ~30 TB).
NODE_CACHE_HOST_PATH = "/mnt/k8s-disks/0/k3a"
CACHE_MOUNT = "/k3a-cache"
CACHE_VOLUME = "node-cache"
#: Where the verified load records a file it refused, for the next pull to fetch again.
REFUSALS_MOUNT = "/k3a-refused"
REFUSALS_SUBPATH = ".k3a-cache/refused"
#: Revisions a node keeps: the one serving, a candidate, the previous one for a rollback.
KEEP = 3
PULL_RESOURCES = {"requests": {"cpu": "4", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}


def _revision_dir(release: ReleaseTuple) -> str:
    w = release.binding.weights
    return f"models/{w.repo_id}/{w.commit}"


def _lease_path(release: ReleaseTuple) -> str:
    w = release.binding.weights
    return f"{CACHE_MOUNT}/.k3a-cache/leases/{w.repo_id.replace('/', '+')}+{w.commit}.lease"


def _store_access(vol: WeightsVolume) -> tuple[str, list[dict], list[dict]]:
    """(store URL as the pull container sees it, its volume mounts, its env)."""
    if vol.kind == "s3":
        url = vol.store_url
        # Credentials come from the pod's service account (IRSA / Pod Identity).
        return url, [], [{"name": "AWS_REGION", "value": vol.region}]
    return f"file://{STORE_MOUNT}", [_mount(STORE_MOUNT, vol.store_subpath)], []


def _cache_volume() -> dict[str, Any]:
    return {"name": CACHE_VOLUME,
            "hostPath": {"path": NODE_CACHE_HOST_PATH, "type": "DirectoryOrCreate"}}


def _init_containers(release: ReleaseTuple, res: ServingResources,
                     vol: WeightsVolume) -> list[dict]:
    """``k3a pull``, then ``k3a verify`` of the pulled copy unless vLLM loads it with
    ``--load-format k3a``, which hashes every byte as it reads it."""
    _need_verifier(release, res)
    w = release.binding.weights
    store_url, store_mounts, env = _store_access(vol)
    pull = {
        "name": "pull-weights",
        "image": res.verifier_image,
        "command": [
            "timeout", "--kill-after=30", str(res.startup_seconds),
            "k3a", "pull", release.id, "--store", store_url, "--to", CACHE_MOUNT,
            "--keep", str(KEEP), *(["--verified-by-loader"] if loads_verified(release) else []),
        ],  # fmt: skip
        "resources": copy.deepcopy(PULL_RESOURCES),
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT}, *store_mounts],
    }
    if env:
        pull["env"] = env
    verify = {
        "name": "verify-weights",
        "image": res.verifier_image,
        "command": [
            "timeout", "--kill-after=30", str(res.verify_timeout_seconds),
            "k3a", "verify", f"{CACHE_MOUNT}/{_revision_dir(release)}",
            "--expect-digest", w.manifest_digest,
        ],  # fmt: skip
        "resources": {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "8Gi"}},
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT, "readOnly": True}],
    }
    return [pull] if loads_verified(release) else [pull, verify]


def _need_verifier(release: ReleaseTuple, res: ServingResources) -> None:
    if not res.verifier_image:
        raise ConfigError(
            f"tuple {release.id} names no verifier image; pulling to the node cache runs k3a "
            "in an init container",
            hint="re-create the tuple with --verifier-image <pipeline worker image>",
        )


def _serve_from_cache(pod: dict, release: ReleaseTuple, res: ServingResources,
                      vol: WeightsVolume) -> None:
    model_path = release.binding.serving.model_path
    store_url, store_mounts, env = _store_access(vol)
    # The verified load reads the tuple's records from the store: S3 itself (no volume), or
    # the store volume it keeps mounted.
    keep = {STORE_MOUNT} if loads_verified(release) and vol.kind != "s3" else set()
    pod["initContainers"] = [
        *_init_containers(release, res, vol),
        use_container(release, res, store_url, store_mounts, env, CACHE_VOLUME, CACHE_MOUNT,
                      pod["containers"][0]["resources"]),
    ]
    for container in pod["containers"]:
        serve_warm(container, release, CACHE_VOLUME)
        container["volumeMounts"] = [
            {"name": CACHE_VOLUME, "mountPath": model_path, "subPath": _revision_dir(release),
             "readOnly": True}
            if m["name"] == VOLUME and m["mountPath"] == model_path else m
            for m in container["volumeMounts"]
            if m["name"] != VOLUME or m["mountPath"] in keep | {model_path}
        ] + [{"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT, "readOnly": True}]
        if loads_verified(release):
            container["env"] = [*container["env"], *env]
            _record_refusals(container)
        container["command"] = ["flock", "-s", _lease_path(release), *container["command"]]
    volumes = [v for v in pod["volumes"] if v["name"] != VOLUME or vol.kind != "s3"]
    pod["volumes"] = [_cache_volume(), *volumes]


def _record_refusals(container: dict) -> None:
    """The verified load records a file it refuses where the next pull looks: the loader is
    told the directory, mounted writable (the rest of the cache stays read-only to it)."""
    args = container.get("args", [])
    if "--model-loader-extra-config" not in args:
        return
    at = args.index("--model-loader-extra-config") + 1
    extra = {**json.loads(args[at]), "refusals": REFUSALS_MOUNT}
    args[at] = json.dumps(extra, sort_keys=True, separators=(",", ":"))
    container["volumeMounts"].append(
        {"name": CACHE_VOLUME, "mountPath": REFUSALS_MOUNT, "subPath": REFUSALS_SUBPATH})


def render_eks_node_cache(release: ReleaseTuple, *, name: str, namespace: str | None,
                          verifier: VerifierTrust | None = None) -> list[dict]:
    """``verifier`` (the pinned root and signing policy): only for a tuple that loads with
    ``--load-format k3a``, the one way these pods check signatures (vLLM does, as it loads)."""
    res = serving_resources(release.binding.serving, f"tuple {release.id}")
    vol = weights_volume(release, res)
    if verifier is not None and not loads_verified(release):
        raise ConfigError(
            f"target eks-node-cache checks signatures in the pod only with --load-format k3a; "
            f"tuple {release.id}'s profile loads otherwise",
            hint="render without --verify-signature, or use a profile with --load-format=k3a")
    docs = copy.deepcopy(render_eks(release, name=name, namespace=namespace, verifier=verifier,
                                    pod_store=_store_access(vol)[0]))
    if vol.kind == "s3":  # vLLM no longer mounts the bucket; the pull reads S3 itself
        docs = [d for d in docs if d["kind"] not in ("PersistentVolume", "PersistentVolumeClaim")]
    for doc in docs:
        for template in _pod_templates(doc):
            template["metadata"]["annotations"][f"{CACHE_VOLUME}.k3a.io/host-path"] = \
                NODE_CACHE_HOST_PATH
            _serve_from_cache(template["spec"], release, res, vol)
    store_url, store_mounts, env = _store_access(vol)
    store_volumes = [v for v in _first_pod(docs)["volumes"] if v["name"] == VOLUME]
    docs.append(capture_job(release, res, name=name, namespace=namespace,
                            labels=_first_template(docs)["metadata"]["labels"],
                            store_url=store_url, store_mounts=store_mounts,
                            store_volumes=store_volumes, env=env, cache_volume=_cache_volume(),
                            cache_mount=CACHE_MOUNT))
    return docs


def _first_template(docs: list[dict]) -> dict:
    return next(t for d in docs for t in _pod_templates(d))


def _first_pod(docs: list[dict]) -> dict:
    return _first_template(docs)["spec"]


def _pod_templates(doc: dict) -> list[dict]:
    if doc["kind"] == "Deployment":
        return [doc["spec"]["template"]]
    if doc["kind"] == "LeaderWorkerSet":
        lwt = doc["spec"]["leaderWorkerTemplate"]
        return [lwt["leaderTemplate"], lwt["workerTemplate"]]
    return []


def _prewarm_init(release: ReleaseTuple, res: ServingResources,
                  vol: WeightsVolume) -> list[dict]:
    store_url, store_mounts, env = _store_access(vol)
    warm = prewarm_container(release, res, store_url, store_mounts, env, CACHE_VOLUME,
                             CACHE_MOUNT)
    return [*_init_containers(release, res, vol), *([warm] if warm else [])]


def render_prewarm(release: ReleaseTuple, *, name: str, namespace: str | None) -> list[dict]:
    """A DaemonSet that pulls ``release`` onto every node of its profile's instance type and
    holds a lease on it while the DaemonSet exists (re-render for the next candidate)."""
    res = serving_resources(release.binding.serving, f"tuple {release.id}")
    _need_verifier(release, res)
    vol = weights_volume(release, res)
    ds_name = slug(f"{name}-prewarm")
    cluster_objects, store_volume = ([], None) if vol.kind == "s3" else \
        _volume_objects(release, vol, ds_name, namespace)
    w = release.binding.weights
    meta: dict[str, Any] = {"name": ds_name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = labels(release, ds_name)
    meta["annotations"] = annotations(release)
    hold = {
        "name": "hold-lease",
        "image": res.verifier_image,
        # Keeps the pre-warmed revision leased (never evicted) until the DaemonSet moves on.
        "command": ["k3a", "cache", "lease", f"{w.repo_id}@{w.commit}", "--root", CACHE_MOUNT,
                    "--", "sleep", "infinity"],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"},
                      "limits": {"memory": "256Mi"}},
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT}],
    }
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": ds_name}},
            # A quarter of the nodes at a time: the store (FSx above all) is shared.
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": "25%"}},
            "template": {
                "metadata": {"labels": labels(release, ds_name),
                             "annotations": annotations(release)},
                "spec": {
                    "initContainers": _prewarm_init(release, res, vol),
                    "containers": [hold],
                    "volumes": [_cache_volume(), *([store_volume] if store_volume else [])],
                    "nodeSelector": {"node.kubernetes.io/instance-type": res.node_instance_type},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                     "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 10,
                },
            },
        },
    }
    return [*cluster_objects, daemonset]

