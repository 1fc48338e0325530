"""Serving profiles: how a pinned revision is served (vLLM args/env, hardware, limits), as data.

A profile is a YAML file under ``manifests/profiles/``. Loading it checks every vLLM flag against
``manifests/vllm-flags.txt``, so ``--tensor-paralel-size`` fails when the tuple is made, naming
the file, instead of as a crash loop on a GPU node. The model argument is never in a profile: it
is the staged mount path, added when the profile is bound into a tuple (:func:`serving_spec`).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from k3artifacts.bundled import MANIFESTS
from k3artifacts.errors import ConfigError, NotFound, plain_validation_errors
from k3artifacts.releases.tuples import DIGEST, ServingSpec
from k3artifacts.settings import load

MANIFESTS_DIR = MANIFESTS
FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*$")
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
#: Set from the tuple, never from a profile: they would point the server somewhere else.
RESERVED_FLAGS = {
    "--model": "the model argument is the staged mount path (the profile's model_mount)",
    "--port": "the port is the profile's `port` field",
    "--host": "the server listens on all interfaces of its pod",
    "--revision": "weights are a pinned, staged revision, never fetched",
    "--tokenizer": "the tokenizer is read from the staged revision",
    "--tokenizer-revision": "weights are a pinned, staged revision, never fetched",
    "--code-revision": "remote code is the staged, reviewed revision",
    "--download-dir": "the server must not download weights",
    "--hf-token": "the server must not reach the Hub",
}
#: The server never reaches the Hub: every byte it loads was staged and verified.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def profiles_dir() -> Path:
    return load().profiles_dir or MANIFESTS_DIR / "profiles"


def known_flags(path: Path | None = None) -> frozenset[str]:
    path = path or MANIFESTS_DIR / "vllm-flags.txt"
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the known vLLM flags: {exc}") from None
    return frozenset(s for line in lines if (s := line.split("#", 1)[0].strip()))


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RequestLimits(_Frozen):
    """What the HyperPod operator enforces in front of the server (and EKS documents)."""

    max_concurrent_requests: int = Field(ge=1)
    max_queue_size: int = Field(ge=0)
    overflow_status_code: int = Field(default=429, ge=400, le=599)


class PodResources(_Frozen):
    cpu: str
    memory: str
    #: vLLM's workers share tensors through /dev/shm; the default 64 MiB kills multi-GPU serving.
    shm_size: str = "64Gi"


class FsxTarget(_Frozen):
    """An FSx for Lustre file system that holds a file store."""

    file_system_id: str = Field(pattern=r"^fs-[0-9a-f]{8,17}$")
    dns_name: str
    mount_name: str
    #: Where the file system's root is mounted on the host that writes the store (``/fsx``):
    #: a store location under it maps to a path inside the file system.
    mounted_at: str

    @field_validator("mounted_at")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("mounted_at must be an absolute path")
        return value.rstrip("/") or "/"


class StorageTarget(_Frozen):
    fsx: FsxTarget | None = None
    s3_region: str | None = None


class ServingResources(_Frozen):
    """Profile data bound into the tuple (``ServingSpec.resources``) that renderers need."""

    nodes: int = Field(ge=1)
    instance_type: str = Field(pattern=r"^ml\.[a-z0-9]+(-[a-z0-9]+)*\.[a-z0-9]+$")
    gpus_per_node: int = Field(ge=1)
    pod: PodResources
    request_limits: RequestLimits
    #: How long a cold start may take: loading ~1.5 TB from FSx at a few GB/s plus compilation.
    startup_seconds: int = Field(ge=60)
    verify_timeout_seconds: int = Field(ge=60)
    storage: StorageTarget = StorageTarget()
    #: The pipeline worker image (contains k3a) for the verify init container, by digest.
    verifier_image: str | None = None
    replicas: int = Field(default=1, ge=1)

    @field_validator("verifier_image")
    @classmethod
    def _by_digest(cls, value: str | None) -> str | None:
        if value is not None and not DIGEST.match(value.rpartition("@")[2]):
            raise ValueError("verifier_image must be pinned: repository@sha256:<64 hex>")
        return value

    @property
    def node_instance_type(self) -> str:
        """The EC2 instance type a Kubernetes node reports (``ml.`` is SageMaker's prefix)."""
        return self.instance_type.removeprefix("ml.")


class Profile(_Frozen):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str
    port: int = Field(default=8000, ge=1, le=65535)
    #: Where the pod sees the staged revision; vLLM's model argument.
    model_mount: str = "/opt/ml/model"
    #: vLLM flags in ``--flag`` or ``--flag=value`` form, in the order they are passed.
    args: list[str]
    env: dict[str, str] = {}
    serving: ServingResources

    @field_validator("model_mount")
    @classmethod
    def _mount(cls, value: str) -> str:
        path = PurePosixPath(value)
        if not path.is_absolute() or ".." in path.parts:
            raise ValueError("model_mount must be an absolute path without '..'")
        return str(path)


def check_profile(profile: Profile, source: str, flags: frozenset[str]) -> None:
    """Refuse unknown, reserved or repeated flags and bad env names, naming ``source``."""
    problems = []
    seen: set[str] = set()
    for arg in profile.args:
        flag = arg.split("=", 1)[0]
        if not FLAG.match(flag):
            problems.append(f"{arg!r} is not a --flag or --flag=value")
        elif flag in RESERVED_FLAGS:
            problems.append(f"{flag} is not allowed in a profile: {RESERVED_FLAGS[flag]}")
        elif flag not in flags:
            problems.append(f"{flag} is not a known vLLM flag (manifests/vllm-flags.txt)")
        else:
            # --x and --no-x set one option: both in one profile is a contradiction.
            option = flag.removeprefix("--").removeprefix("no-")
            if option in seen:
                problems.append(f"{flag} is given twice (with or without --no-)")
            seen.add(option)
    for name, value in profile.env.items():
        if not ENV_NAME.match(name):
            problems.append(f"env {name!r} is not a valid variable name")
        if name in OFFLINE_ENV and value != OFFLINE_ENV[name]:
            problems.append(
                f"env {name}={value}: the server must stay offline ({OFFLINE_ENV[name]})"
            )
    if problems:
        raise ConfigError(
            f"profile {source}: " + "; ".join(problems),
            hint="fix the profile; `--flag=value` spellings are listed in manifests/vllm-flags.txt",
        )


def load_profile(name_or_path: str, *, flags_file: Path | None = None) -> Profile:
    """A profile by name (``manifests/profiles/<name>.yaml``) or by path to a YAML file."""
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        path = Path(name_or_path)
    else:
        path = profiles_dir() / f"{name_or_path}.yaml"
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        available = sorted(p.stem for p in profiles_dir().glob("*.yaml"))
        raise NotFound(
            f"no serving profile {name_or_path!r} ({path})",
            hint=f"profiles: {', '.join(available) or 'none'}; or pass a path to a YAML file",
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"profile {path}: not valid YAML: {exc}") from None
    try:
        profile = Profile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(
            f"profile {path}: {plain_validation_errors(exc)}", hint="see manifests/profiles/*.yaml"
        ) from None
    if profile.name != path.stem:
        raise ConfigError(f"profile {path}: name {profile.name!r} differs from the file name")
    check_profile(profile, str(path), known_flags(flags_file))
    return profile


def serving_spec(
    profile: Profile,
    *,
    storage: StorageTarget | None = None,
    verifier_image: str | None = None,
) -> ServingSpec:
    """Bind ``profile`` into the tuple's serving spec: the complete vLLM argv and env.

    ``storage`` and ``verifier_image`` (site facts: which FSx, which region, which worker image)
    override the profile's, because they describe where this release runs, not how it serves.
    """
    resources = profile.serving
    updates: dict[str, object] = {}
    if storage is not None:
        updates["storage"] = storage
    if verifier_image is not None:
        updates["verifier_image"] = verifier_image
    if updates:
        resources = ServingResources.model_validate({**resources.model_dump(), **updates})
    args = [f"--model={profile.model_mount}", "--host=0.0.0.0", f"--port={profile.port}"]
    return ServingSpec(
        profile=profile.name,
        model_path=profile.model_mount,
        args=args + list(profile.args),
        env={**profile.env, **OFFLINE_ENV},
        port=profile.port,
        resources=resources.model_dump(mode="json"),
    )


def serving_resources(spec: ServingSpec, where: str) -> ServingResources:
    """The renderers' view of a tuple's ``resources``; refuses a tuple that lacks them."""
    try:
        return ServingResources.model_validate(spec.resources)
    except ValidationError as exc:
        raise ConfigError(
            f"{where}: serving resources are incomplete: {exc.errors()[0]['msg']}",
            hint="make the tuple with `k3a tuple create ... --profile NAME`",
        ) from None
