"""Small records on S3: conditional writes, reads, listings.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import botocore.exceptions as bex

from k3artifacts.errors import AlreadyExists, Conflict
from k3artifacts.stores.awsclients import aws_errors, error_code, http_status
from k3artifacts.stores.base import Versioned
from k3artifacts.stores.capabilities import ensure_conditional_writes
from k3artifacts.stores.records import MAX_RECORD_BYTES, oversized
from k3artifacts.stores.s3.bucket import S3Bucket
from k3artifacts.stores.s3.objects import CHECKSUM_ALGORITHM, etag


class S3Records(S3Bucket):
    """The record store on S3: create-once records (``If-None-Match: *``) and
    compare-and-swap pointers (``If-Match`` on the ETag), after the bucket was probed for
    honouring both (:mod:`k3artifacts.stores.capabilities`). Every record write carries one of
    the two headers: a bucket set up by `k3a bootstrap` refuses any that does not."""

    #: Rounds of read-then-swap :meth:`rewrite` tries against other writers of the same key.
    rewrite_attempts = 5

    def read(self, key: str) -> Versioned | None:
        with aws_errors(f"reading {self.s3_url(key)}"):
            try:
                resp = self.client.get_object(Bucket=self.bucket, Key=self.key(key))
            except bex.ClientError as exc:
                if error_code(exc) == "NoSuchKey":
                    return None
                raise
            with resp["Body"] as body:
                if resp.get("ContentLength", 0) > MAX_RECORD_BYTES:
                    raise oversized(key, resp["ContentLength"])
                data = body.read(MAX_RECORD_BYTES + 1)
                if len(data) > MAX_RECORD_BYTES:
                    raise oversized(key, len(data))
                return Versioned(data, etag(resp))

    def _put_small(self, key: str, data: bytes, condition: dict[str, str]) -> dict[str, Any]:
        if key.startswith("releases/"):
            # Release records (tuples, reviews, history, pointers) are conditional writes:
            # refuse a server that would ignore the condition, before the first one. (Staging's
            # manifests are too, but its role may not write where the probe does.)
            ensure_conditional_writes(self.client, self.client.meta.endpoint_url, self.bucket,
                                      self.prefix)
        return self.client.put_object(
            Bucket=self.bucket,
            Key=self.key(key),
            Body=data,
            ContentType="application/json",
            ChecksumAlgorithm=CHECKSUM_ALGORITHM,
            **condition,
        )

    def create(self, key: str, data: bytes) -> None:
        with aws_errors(f"creating {self.s3_url(key)}"):
            try:
                self._put_small(key, data, {"IfNoneMatch": "*"})
            except bex.ClientError as exc:
                if http_status(exc) == 412:
                    raise AlreadyExists(key) from None
                if http_status(exc) == 409:  # another conditional write to this key in flight
                    raise Conflict(
                        f"{key}: a concurrent write to the same key is in progress",
                        hint="re-read and retry",
                    ) from None
                raise

    def replace(self, key: str, data: bytes, expected: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        with aws_errors(f"replacing {self.s3_url(key)}"):
            try:
                return etag(self._put_small(key, data, condition))
            except bex.ClientError as exc:
                # 412: the ETag moved (or the key appeared); 409: a racing conditional write;
                # 404 on If-Match: the key we expected is gone.
                if http_status(exc) in (409, 412) or (
                    expected is not None and error_code(exc) == "NoSuchKey"
                ):
                    raise Conflict(
                        f"{key} changed under us (expected version {expected})",
                        hint="re-read the current value and decide again",
                    ) from None
                raise

    def rewrite(self, key: str, data: bytes) -> None:
        """Make ``key`` hold ``data`` whatever it held, by compare-and-swap on what was just
        read: for the records a revision keeps beside its manifest (object records,
        provenance), which a re-run of a revision not yet published writes again."""
        for _ in range(self.rewrite_attempts):
            found = self.read(key)
            if found is not None and found.data == data:
                return
            try:
                self.replace(key, data, None if found is None else found.token)
                return
            except Conflict:
                continue  # another writer of the revision wrote it meanwhile: read again
        raise Conflict(
            f"{key} kept changing under {self.rewrite_attempts} writes",
            hint="another run is staging the same revision; re-run once it has finished",
        )

    def list_keys(self, prefix: str) -> list[str]:
        return sorted(self.object_sizes(prefix))

    def delete(self, key: str) -> None:
        with aws_errors(f"deleting {self.s3_url(key)}"):
            self.client.delete_object(Bucket=self.bucket, Key=self.key(key))

    def modified_at(self, key: str) -> datetime | None:
        found = self.head(key)
        return None if found is None else found["LastModified"]
