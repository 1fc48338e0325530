"""Small revisions written straight into a store (tests and benchmarks): real files, real
hashes, a real ShardManifest."""

from __future__ import annotations

import hashlib
from pathlib import Path

import xxhash

from k3artifacts.revisions.manifest import FileRecord, LicenseRecord, ShardManifest

REPO = "moonshotai/Kimi-K3-test"


def record_for(path: Path, rel: str, kind: str = "other") -> FileRecord:
    data = path.read_bytes()
    return FileRecord(
        path=rel, size=len(data), kind=kind,  # type: ignore[arg-type]
        sha256=hashlib.sha256(data).hexdigest(), xxh3_128=xxhash.xxh3_128_hexdigest(data),
    )


def write_revision(root: Path, files: dict[str, bytes]) -> dict[str, tuple[FileRecord, Path]]:
    """Write ``files`` under ``root``; returns path -> (record, local file)."""
    out = {}
    for rel, data in files.items():
        local = root / rel
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)
        out[rel] = (record_for(local, rel), local)
    return out


def manifest_for(commit: str, files: dict[str, tuple[FileRecord, Path]]) -> ShardManifest:
    records = [rec for rec, _ in files.values()]
    return ShardManifest(
        repo_id=REPO, commit=commit, files=sorted(records, key=lambda r: r.path),
        license=LicenseRecord(path=None, sha256=None, text=None), remote_code=[],
        total_bytes=sum(r.size for r in records),
    )


def publish(store, commit: str, files: dict[str, tuple[FileRecord, Path]]):
    writer = store.begin_revision(REPO, commit)
    for rec, local in files.values():
        writer.put_file(rec, local)
    manifest = manifest_for(commit, files)
    writer.commit(manifest)
    return writer, manifest
