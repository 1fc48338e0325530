"""The bucket under a store: what every part of the S3 store reads and deletes through.
"""

from __future__ import annotations

import re
from typing import Any, BinaryIO

import botocore.exceptions as bex

from k3artifacts.errors import ConfigError, NotFound, Unavailable
from k3artifacts.settings import load
from k3artifacts.stores import awsclients
from k3artifacts.stores.awsclients import aws_errors, error_code, http_status
from k3artifacts.stores.base import ObjectRecord, ProgressCallback, Store
from k3artifacts.stores.s3.transfers import PartBuffers, TransferCounters, TransferTuning

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")

#: The calls by which S3 makes an object from a copy or from uploaded parts. s3transfer's copies
#: go through them without a conditional header (its allowed arguments predate conditional
#: writes), and a bucket set up by `k3a bootstrap` refuses any object made without one.
CREATING_OPERATIONS = ("CopyObject", "CompleteMultipartUpload")


def _create_only(params: dict[str, Any], **_: Any) -> None:
    """Make a copy or a multipart completion that names no condition create-once: nothing
    this store makes that way may replace an object (docs/guides/s3-and-fsx.md, "A bucket
    nobody overwrites")."""
    if "IfMatch" not in params and "IfNoneMatch" not in params:
        params["IfNoneMatch"] = "*"


class S3Bucket(Store):
    """One bucket and key prefix through botocore: store keys to S3 keys, HEAD and GET of
    objects, listings, batched deletes, multipart cleanup, and a client per transfer.

    ``counters`` sum every writer's transfers; ``progress`` is handed to each new writer.
    """

    #: Keys per ListObjectsV2 page (S3 returns at most 1000).
    list_page_size = 1000

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: Any = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        region: str | None = None,
        tuning: TransferTuning | None = None,
        progress: ProgressCallback | None = None,
    ):
        if not _BUCKET_RE.match(bucket):
            raise ConfigError(
                f"{bucket!r} is not a valid S3 bucket name",
                hint="bucket names are 3-63 characters of a-z, 0-9, '.' and '-'; "
                "write the store as s3://bucket/prefix",
            )
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.client = client or awsclients.s3_client(endpoint_url, profile, region)
        awsclients.fail_fast_until_connected(self.client)
        for operation in CREATING_OPERATIONS:
            self.client.meta.events.register(f"before-parameter-build.s3.{operation}",
                                             _create_only)
        self.tuning = tuning or TransferTuning.from_env()
        #: Part buffers of every upload through this store (one budget a process).
        self.part_buffers = PartBuffers(self.tuning.buffer_bytes, self.tuning.stream_part_size)
        self.progress = progress
        self.counters = TransferCounters()

    def region(self) -> str | None:
        # The client's region already follows AWS_REGION / AWS_DEFAULT_REGION and the profile.
        settings = load()
        return (self.client.meta.region_name or settings.aws_region
                or settings.aws_default_region)

    def watch_transfers(self, progress: ProgressCallback | None) -> None:
        self.progress = progress

    def exists(self) -> bool:
        """The bucket exists and holds something under ``models/`` or ``releases/``.

        Those two listings, not HeadBucket or a listing of the whole prefix, because they are
        what every k3a role may list (policies/iam/*.json scope ListBucket by prefix); a
        listing that is denied says nothing, and the store is then taken to be there."""
        denied = False
        for sub in ("models/", "releases/"):
            s3_prefix = f"{self.prefix}/{sub}" if self.prefix else sub
            with aws_errors(f"looking for the store {self.url}"):
                try:
                    resp = self.client.list_objects_v2(
                        Bucket=self.bucket, Prefix=s3_prefix, MaxKeys=1
                    )
                except bex.ClientError as exc:
                    if error_code(exc) == "NoSuchBucket":
                        return False
                    if http_status(exc) == 403:
                        denied = True
                        continue
                    raise
            if resp.get("KeyCount", len(resp.get("Contents", []))):
                return True
        return denied

    # ---- keys ----------------------------------------------------------------------------
    def key(self, key: str) -> str:
        """The S3 object key of store key ``key``."""
        parts = key.split("/")
        if key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ConfigError(f"invalid store key {key!r}")
        return f"{self.prefix}/{key}" if self.prefix else key

    def unkey(self, s3_key: str) -> str:
        return s3_key[len(self.prefix) + 1 :] if self.prefix else s3_key

    def s3_url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.key(key)}"

    # ---- objects -------------------------------------------------------------------------
    def head(self, key: str, version_id: str | None = None) -> dict[str, Any] | None:
        """HEAD of store key ``key`` (at ``version_id``) with its checksum, or None when
        absent."""
        version = {"VersionId": version_id} if version_id and version_id != "null" else {}
        with aws_errors(f"inspecting {self.s3_url(key)}"):
            try:
                return self.client.head_object(
                    Bucket=self.bucket, Key=self.key(key), ChecksumMode="ENABLED", **version
                )
            except bex.ClientError as exc:
                # 400: a version id this bucket never issued (S3 answers so for a malformed
                # one); 404/405: absent, or a delete marker.
                if http_status(exc) in (404, 405) or (version and http_status(exc) == 400):
                    return None
                raise

    def open_object(self, record: ObjectRecord) -> BinaryIO:
        """A streaming reader of the object ``record`` names, at its recorded version."""
        return self.open_version(record.key, record.version_id)

    def open_version(self, key: str, version_id: str | None = None) -> BinaryIO:
        """A streaming reader of the object at store key ``key`` (at ``version_id``)."""
        body: BinaryIO = self._get(key, version_id)["Body"]
        return body

    def read_range(self, key: str, version_id: str | None, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` of the object at store key ``key`` (at
        ``version_id``; fewer at its end), in one ranged GET: nothing else of it is sent."""
        if length <= 0:
            return b""
        resp = self._get(key, version_id, f"bytes={offset}-{offset + length - 1}")
        if resp is None:
            return b""  # the range starts past the object's end
        served = resp.get("ContentRange") or ""
        with resp["Body"] as body:
            if not served.startswith(f"bytes {offset}-") and offset:
                raise Unavailable(
                    f"reading {self.s3_url(key)}: the server ignored the byte range "
                    f"{offset}-{offset + length - 1} (answered {served or 'the whole object'})")
            # A server that ignores Range from byte 0 sends the whole object: take what was
            # asked and drop the connection with the rest.
            data: bytes = body.read(length)
        return data

    def _get(self, key: str, version_id: str | None, byte_range: str | None = None) -> Any:
        """GetObject of store key ``key`` (at ``version_id``, of ``byte_range``); None when
        the range starts past the object's end."""
        args = {"VersionId": version_id} if version_id else {}
        if byte_range is not None:
            args["Range"] = byte_range
        with aws_errors(f"reading {self.s3_url(key)}"):
            try:
                return self.client.get_object(Bucket=self.bucket, Key=self.key(key), **args)
            except bex.ClientError as exc:
                if byte_range is not None and (http_status(exc) == 416
                                               or error_code(exc) == "InvalidRange"):
                    return None
                if error_code(exc) in ("NoSuchKey", "NoSuchVersion") or http_status(exc) == 404:
                    raise NotFound(f"{key} is not in {self.url}") from None
                raise

    def open_read(self, key: str) -> BinaryIO:
        return self.open_version(key)

    def object_sizes(self, prefix: str) -> dict[str, int]:
        s3_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        sizes: dict[str, int] = {}
        with aws_errors(f"listing s3://{self.bucket}/{s3_prefix}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=s3_prefix,
                PaginationConfig={"PageSize": self.list_page_size},
            )
            for page in pages:
                sizes.update((self.unkey(o["Key"]), o["Size"]) for o in page.get("Contents", []))
        return sizes

    def companion_client(self, connections: int, *, sign_payload: bool | None = None) -> Any:
        """A client on the store's endpoint and region with ``connections`` in its pool, for
        a transfer that runs that many requests at once: the store's own where its pool is
        that large and the payload signing is its own (a pull's ranged reads), since making
        a client is a sizeable part of a short command's start."""
        if sign_payload is None and connections <= self.client.meta.config.max_pool_connections:
            return self.client
        endpoint = self.client.meta.endpoint_url
        if "amazonaws.com" in (endpoint or ""):
            endpoint = None
        return awsclients.client("s3", endpoint_url=endpoint,
                                 region=self.client.meta.region_name,
                                 max_pool_connections=connections, sign_payload=sign_payload)

    def delete_keys(self, keys: list[str]) -> list[str]:
        """Delete store keys in batches; returns those S3 refused (e.g. by bucket policy)."""
        refused: list[str] = []
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            with aws_errors(f"deleting {len(batch)} objects under {self.url}"):
                resp = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": self.key(k)} for k in batch], "Quiet": True},
                )
            refused.extend(self.unkey(err["Key"]) for err in resp.get("Errors", []))
        return refused

    def abort_multipart_uploads(self, prefix: str) -> int:
        """Abort every in-progress multipart upload under store prefix ``prefix``."""
        s3_prefix = self.key(prefix.rstrip("/")) + "/"
        aborted = 0
        with aws_errors(f"cleaning multipart uploads under s3://{self.bucket}/{s3_prefix}"):
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=s3_prefix
            )
            for page in pages:
                for upload in page.get("Uploads", []):
                    try:
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                    except bex.ClientError as exc:
                        if error_code(exc) != "NoSuchUpload":  # finished or aborted meanwhile
                            raise
                    aborted += 1
        return aborted
