"""Pieces every serving target shares: where the tuple's weights are, names, labels,
annotations, probes, env and GPU resources. A target module builds its objects from these."""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from k3artifacts.errors import ConfigError
from k3artifacts.loading.vllm_plugin import LOAD_FORMAT
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.serving.profiles import ServingResources
from k3artifacts.stores.registry import weights_placement

ANNOTATION = "k3a.io"
VOLUME = "model-weights"
STORE_MOUNT = "/k3a-store"
VLLM_COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
HYPERPOD_API = "inference.sagemaker.aws.amazon.com/v1"
LWS_API = "leaderworkerset.x-k8s.io/v1"
RAY_PORT = 6379


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
    #: The store's URL as the tuple recorded it (what `k3a pull` in a pod opens, for S3).
    store_url: str = ""


def weights_volume(release: ReleaseTuple, res: ServingResources) -> WeightsVolume:
    weights = release.binding.weights
    try:
        placed = weights_placement(weights.location, weights.repo_id, weights.commit)
    except ConfigError as exc:
        raise ConfigError(f"tuple {release.id}: {exc}", hint=exc.hint) from None
    suffix = placed.revision_path
    if placed.bucket is not None:
        if not res.storage.s3_region:
            raise ConfigError(
                f"tuple {release.id}: weights are in S3 but the tuple records no region",
                hint="re-create the tuple with --s3-region REGION",
            )
        return WeightsVolume(
            kind="s3",
            store_subpath="",
            model_subpath=suffix,
            bucket=placed.bucket,
            s3_prefix=placed.s3_prefix,
            region=res.storage.s3_region,
            store_url=placed.store_url,
        )
    if placed.root_path is None:
        raise ConfigError(f"tuple {release.id}: unsupported weights location {weights.location}")
    root_path = placed.root_path
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


def loads_verified(release: ReleaseTuple) -> bool:
    """Whether the tuple's vLLM loads with ``--load-format k3a`` (its image carries k3a's
    plugin, :mod:`k3artifacts.loading`): the weights are verified as vLLM reads them, and the
    pod runs no verify container before it."""
    args = release.binding.serving.args
    return f"--load-format={LOAD_FORMAT}" in args or any(
        a == "--load-format" and b == LOAD_FORMAT for a, b in zip(args, args[1:], strict=False))


def slug(text: str) -> str:
    value = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return value[:63].rstrip("-") or "model"


def served_name(release: ReleaseTuple) -> str:
    args = release.binding.serving.args
    for i, arg in enumerate(args):
        if arg.startswith("--served-model-name="):
            return arg.split("=", 1)[1]
        if arg == "--served-model-name" and i + 1 < len(args):
            return args[i + 1]
    return release.binding.serving.model_path


def served_names(release: ReleaseTuple) -> list[str]:
    """Every name the rendered server answers to: the profile's served model name (clients
    keep using it across tuples) and the tuple id, which readiness asks for so that an endpoint
    started from another tuple is told apart. vLLM lists each in ``/v1/models``."""
    return [served_name(release), release.id]


def serving_args(release: ReleaseTuple) -> list[str]:
    """The tuple's vLLM args as rendered: its served model name joined by the tuple id."""
    args, skipping = [], False
    for arg in release.binding.serving.args:
        if arg == "--served-model-name":  # the separate form takes values up to the next flag
            skipping = True
            continue
        if skipping and not arg.startswith("-"):
            continue
        skipping = False
        if not arg.startswith("--served-model-name="):
            args.append(arg)
    return [*args, "--served-model-name", *served_names(release)]


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
