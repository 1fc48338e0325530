"""What a warm-start artifact is: its manifest, where it lives in a store, and the names that
key it (the tuple id, the GPU model as ``nvidia-smi`` names it, the parallel layout).

Store layout (relative to the store root, beside ``releases/``)::

    warm/blobs/<sha256[:2]>/<sha256>                      each distinct file once, create-once
    warm/artifacts/<tuple-id>/<gpu-slug>/<layout>.json    the manifest, create-once
    warm/artifacts/<tuple-id>/<gpu-slug>/<layout>.sig     its signature (as a tuple's), create-once

A manifest is written once; a new capture for the same key is refused (the first one stands)
and a different one needs a new tuple, GPU or layout. The one exception: a standing artifact
the channel would not use (unsigned where signatures are required, say) is replaced by a
capture signed by a key the channel trusts (:mod:`.claim`), so it cannot squat the key.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from k3artifacts.canonical import canonical_digest, canonical_json
from k3artifacts.errors import UsageError
from k3artifacts.releases.tuples import TUPLE_ID, ReleaseTuple

SCHEMA = 1
WARM_PREFIX = "warm/"
BLOB_PREFIX = "warm/blobs/"
ARTIFACT_PREFIX = "warm/artifacts/"

#: The cache directories a warm artifact may hold, by name, and the variable each program
#: reads its directory from. FlashInfer appends ``.cache/flashinfer/<arch>/`` to its
#: workspace base (flashinfer/jit/env.py), so the base is what is captured and set.
CACHE_ROOTS: dict[str, str] = {
    "vllm": "VLLM_CACHE_ROOT",
    "triton": "TRITON_CACHE_DIR",
    "inductor": "TORCHINDUCTOR_CACHE_DIR",
    "flashinfer": "FLASHINFER_WORKSPACE_BASE",
    "deepgemm": "DG_JIT_CACHE_DIR",
}
#: The in-toto predicate type of a warm manifest's signature.
PREDICATE_TYPE = "urn:k3artifacts:warm-start:v1"
ROOT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WarmFile(_Frozen):
    #: The cache directory it belongs to (a key of :data:`CACHE_ROOTS`).
    root: str
    #: Relative path under that directory, ``/``-separated, never ``..`` or absolute.
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256.pattern)
    xxh3_128: str = Field(pattern=r"^[0-9a-f]{32}$")
    #: The owner-execute bit as captured (a few caches keep executables, e.g. helpers).
    executable: bool = False

    @field_validator("path")
    @classmethod
    def _safe(cls, value: str) -> str:
        check_relative(value)
        return value

    @property
    def blob_key(self) -> str:
        return blob_key(self.sha256)


class WarmManifest(_Frozen):
    schema_version: int = SCHEMA
    tuple_id: str = Field(pattern=TUPLE_ID.pattern)
    #: Repeated from the tuple so a reader sees what compiled it without the tuple at hand.
    image_digest: str
    serving_args: list[str]
    gpu: str
    tensor_parallel: int = Field(ge=1)
    pipeline_parallel: int = Field(default=1, ge=1)
    roots: list[str]
    files: list[WarmFile]
    total_bytes: int
    captured_at: datetime
    captured_by: str

    @field_validator("roots")
    @classmethod
    def _known_roots(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in CACHE_ROOTS:
                raise ValueError(f"unknown cache root {name!r}")
        return value

    def digest(self) -> str:
        return canonical_digest(self)

    def to_bytes(self) -> bytes:
        return canonical_json(self)

    @property
    def layout(self) -> str:
        return layout_name(self.tensor_parallel, self.pipeline_parallel)

    @property
    def key(self) -> str:
        return artifact_key(self.tuple_id, self.gpu, self.layout)


#: A cached file's path nests at most this deep (real caches: 2 to 8 parts). The node cache
#: walks, and removes, at most 64 levels (``nodecache/safefs.py``); a deeper path would leave
#: a directory behind that nothing removes, so it is refused before anything is made.
MAX_PATH_PARTS = 32
#: ... with parts of at most NAME_MAX bytes, and all of it well within PATH_MAX once under the
#: node cache root.
MAX_PART_BYTES = 255
MAX_PATH_BYTES = 1024


def predicate(manifest: WarmManifest) -> dict[str, object]:
    """What the signature says, in the terms a reviewer reads."""
    return {"tuple_id": manifest.tuple_id, "gpu": manifest.gpu, "layout": manifest.layout,
            "image_digest": manifest.image_digest, "files": len(manifest.files),
            "total_bytes": manifest.total_bytes}


def check_relative(rel: str) -> list[str]:
    """The parts of a safe relative path; :class:`ValueError`, naming it, for anything escaping
    a root or nesting deeper or longer than a node can hold."""
    parts = rel.split("/")
    shown = rel if len(rel) <= 160 else f"{rel[:160]}... ({len(rel)} characters)"
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) \
            or "\0" in rel or "\\" in rel:
        raise ValueError(f"{shown!r} is not a safe relative path")
    if len(parts) > MAX_PATH_PARTS:
        raise ValueError(f"{shown!r} nests {len(parts)} deep, more than {MAX_PATH_PARTS}")
    if len(rel.encode()) > MAX_PATH_BYTES or any(len(p.encode()) > MAX_PART_BYTES for p in parts):
        raise ValueError(f"{shown!r} is longer than a node cache path may be "
                         f"({MAX_PATH_BYTES} bytes, {MAX_PART_BYTES} per name)")
    return parts


def blob_key(sha256: str) -> str:
    return f"{BLOB_PREFIX}{sha256[:2]}/{sha256}"


def gpu_slug(gpu: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``: a key part and a file name."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.strip().lower()).strip("-")
    if not slug:
        raise UsageError(f"{gpu!r} is not a GPU model name",
                         hint="pass --gpu as nvidia-smi --query-gpu=name prints it")
    return slug


def layout_name(tp: int, pp: int = 1) -> str:
    return f"tp{tp}" + (f"-pp{pp}" if pp > 1 else "")


def artifact_prefix(tuple_id: str) -> str:
    return f"{ARTIFACT_PREFIX}{tuple_id}/"


def artifact_key(tuple_id: str, gpu: str, layout: str) -> str:
    return f"{artifact_prefix(tuple_id)}{gpu_slug(gpu)}/{layout}.json"


def signature_key(manifest_key: str) -> str:
    return manifest_key.removesuffix(".json") + ".sig"


def _arg(args: list[str], *names: str) -> int | None:
    for i, arg in enumerate(args):
        for name in names:
            if arg.startswith(name + "="):
                return int(arg.split("=", 1)[1])
            if arg == name and i + 1 < len(args):
                return int(args[i + 1])
    return None


def tuple_layout(release: ReleaseTuple) -> tuple[int, int]:
    """(tensor parallel, pipeline parallel) of the tuple's vLLM arguments (1 when absent)."""
    args = release.binding.serving.args
    tp = _arg(args, "--tensor-parallel-size", "-tp") or 1
    pp = _arg(args, "--pipeline-parallel-size", "-pp") or 1
    return tp, pp


def detect_gpu() -> str | None:
    """The first GPU's model as ``nvidia-smi --query-gpu=name`` prints it; None without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names[0] if names else None


#: GPU model per EC2 instance type, as nvidia-smi names it: what a render passes to a pod
#: that holds no GPU (the pre-warm DaemonSet). A pod that holds one detects it instead.
INSTANCE_GPUS: dict[str, str] = {
    "p4d.24xlarge": "NVIDIA A100-SXM4-40GB",
    "p4de.24xlarge": "NVIDIA A100-SXM4-80GB",
    "p5.48xlarge": "NVIDIA H100 80GB HBM3",
    "p5e.48xlarge": "NVIDIA H200",
    "p5en.48xlarge": "NVIDIA H200",
    "p6-b200.48xlarge": "NVIDIA B200",
    "p6-b300.48xlarge": "NVIDIA B300 SXM6 AC",
}
