"""Published revisions and release tuples written straight into a store, without the Hub:
what the tests and the benchmarks use to exercise channels, gates and serving on small data.

Revisions go through the store's real :class:`~k3artifacts.stores.base.RevisionWriter`, so they
are published exactly as staging publishes them; only the download is skipped.
"""

from __future__ import annotations

import hashlib
import json
import struct
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import safetensors.numpy
import xxhash

from k3artifacts.releases.tuples import (
    ImageRef,
    ReleaseTuple,
    TupleBinding,
    TupleStore,
    WeightsRef,
)
from k3artifacts.revisions.manifest import (
    FileRecord,
    LicenseRecord,
    RemoteCodeEntry,
    SafetensorsSummary,
    ShardManifest,
)
from k3artifacts.serving.profiles import FsxTarget, StorageTarget, load_profile, serving_spec
from k3artifacts.stores.base import Store

REPO_ID = "moonshotai/Kimi-K3"
IMAGE_DIGEST = "sha256:" + "ab" * 32
PROFILE = "p6-b300-tp8"
VERIFIER_IMAGE = "registry.example/k3a-worker@sha256:" + "cd" * 32
MIT = "MIT License\n\nPermission is hereby granted, free of charge...\n"


def _safetensors_bytes(seed: int) -> tuple[bytes, SafetensorsSummary]:
    data = safetensors.numpy.save({"w": np.full(4, seed, dtype=np.float32)})
    (header_len,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + header_len]
    summary = SafetensorsSummary(
        header_len=header_len,
        tensor_count=len([k for k in json.loads(header) if k != "__metadata__"]),
        dtypes=["F32"],
        header_sha256=hashlib.sha256(header).hexdigest(),
        data_bytes=len(data) - 8 - header_len,
    )
    return data, summary


def _kind(path: str) -> str:
    if path.endswith(".safetensors"):
        return "weights"
    if path.endswith(".py"):
        return "code"
    if path == "LICENSE":
        return "license"
    return "config" if path.endswith(".json") else "other"


class Releases:
    """Publishes small revisions and makes tuples of them, the way staging would."""

    def __init__(self, store: Store, scratch: Path):
        self.store = store
        self.scratch = scratch
        self.count = 0

    def publish(
        self,
        *,
        license_text: str | None = MIT,
        code: dict[str, bytes] | None = None,
        shards: int = 2,
        extra: dict[str, bytes] | None = None,
    ) -> ShardManifest:
        self.count += 1
        commit = hashlib.sha1(f"commit-{self.count}".encode()).hexdigest()
        contents: dict[str, bytes] = {"config.json": json.dumps({"n": self.count}).encode()}
        summaries: dict[str, SafetensorsSummary] = {}
        for i in range(shards):
            name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            contents[name], summaries[name] = _safetensors_bytes(self.count * 100 + i)
        if license_text is not None:
            contents["LICENSE"] = license_text.encode()
        contents.update(code or {})
        contents.update(extra or {})
        workdir = self.scratch / commit
        workdir.mkdir(parents=True)
        records = []
        writer = self.store.begin_revision(REPO_ID, commit)
        for path, body in sorted(contents.items()):
            local = workdir / path.replace("/", "_")
            local.write_bytes(body)
            record = FileRecord(
                path=path,
                size=len(body),
                kind=_kind(path),
                sha256=hashlib.sha256(body).hexdigest(),
                xxh3_128=xxhash.xxh3_128_hexdigest(body),
                safetensors=summaries.get(path),
            )
            writer.put_file(record, local)
            records.append(record)
        manifest = ShardManifest(
            repo_id=REPO_ID,
            commit=commit,
            files=records,
            license=LicenseRecord(
                path=None if license_text is None else "LICENSE",
                sha256=None
                if license_text is None
                else hashlib.sha256(license_text.encode()).hexdigest(),
                text=license_text,
                card_license="other",
                card_license_name="modified-mit",
            ),
            remote_code=[
                RemoteCodeEntry(path=p, sha256=hashlib.sha256(b).hexdigest())
                for p, b in sorted((code or {}).items())
            ],
            total_bytes=sum(len(b) for b in contents.values()),
        )
        writer.commit(manifest)
        return manifest

    def site_storage(self) -> StorageTarget:
        """Where a cluster sees this store: S3 in a region, or the file store as the root of
        an FSx file system (so the tuple renders for HyperPod as well as EKS)."""
        if self.store.regional:
            return StorageTarget(s3_region="us-east-1")
        root = str(self.store.local_root)
        return StorageTarget(
            fsx=FsxTarget(
                file_system_id="fs-0123456789abcdef0",
                dns_name="fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
                mount_name="sandbox",
                mounted_at=root,
            )
        )

    def tuple_for(
        self,
        manifest: ShardManifest,
        *,
        manifest_digest: str | None = None,
        profile: str = PROFILE,
        site: bool = True,
        verifier_image: str | None = VERIFIER_IMAGE,
    ) -> ReleaseTuple:
        """A tuple of ``manifest`` with a real profile's serving spec. ``site``: bind where the
        cluster sees the store (:meth:`site_storage`); without it a file-store tuple renders
        for EKS only (a host path), as a tuple made without ``--fsx-*`` does."""
        # As binding a tuple does (releases/binding.py): its location must hold every file.
        self.store.materialize(manifest.repo_id, manifest.commit)
        serving = serving_spec(
            load_profile(profile),
            storage=self.site_storage() if site else None,
            verifier_image=verifier_image,
        )
        binding = TupleBinding(
            weights=WeightsRef(
                repo_id=manifest.repo_id,
                commit=manifest.commit,
                manifest_digest=manifest_digest or manifest.digest(),
                location=self.store.location(manifest.repo_id, manifest.commit),
            ),
            image=ImageRef(repository="registry.example/vllm", digest=IMAGE_DIGEST, tag="v1"),
            serving=serving,
            license_sha256=manifest.license.sha256,
        )
        release = ReleaseTuple.make(
            binding, created_at=datetime(2025, 1, 1, tzinfo=UTC), created_by="fixture"
        )
        TupleStore(self.store).put(release)
        return release

    def release(self, **publish_args: object) -> ReleaseTuple:
        return self.tuple_for(self.publish(**publish_args))  # type: ignore[arg-type]
