"""Can this S3 server keep our rules? Probed once per process before the first record write.

Tuples, reviews and history entries are create-once (``If-None-Match: *``) and channel pointers
move by compare-and-swap (``If-Match: <etag>``). A server that ignores those headers (some
gateways, older MinIO/Ceph releases, test servers) answers 200 to every racer: two promotions
both "win", a tuple body can be replaced. So before the first such write, and in
``k3a bootstrap``, the store writes a scratch key (under ``releases/probes/``) twice with
``If-None-Match: *`` (the second must be refused with 412) and once with ``If-Match`` on a
wrong ETag (refused with 412), then deletes it. A server that lets either through is refused
for good (exit 9), naming the missing capability. A ``501 NotImplemented`` is a configuration
answer, never an outage to retry.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import botocore.exceptions as bex

from k3artifacts.errors import ConfigError
from k3artifacts.stores.awsclients import aws_errors, http_status

#: Under releases/, where every record writer may write; the promoter may delete here too
#: (policies/iam/promoter.json), unlike under the records themselves.
PROBE_DIR = "releases/probes"
WRONG_ETAG = '"00000000000000000000000000000000"'


class MissingCapability(ConfigError):
    """The store ignores a condition our records rely on."""


_lock = threading.Lock()
#: (endpoint, bucket) -> None (honoured) or the error to raise again: one probe per process.
_probed: dict[tuple[str, str], MissingCapability | None] = {}


def _refused(call: Any) -> bool:
    """True if the conditional write was refused with 412, False if it went through."""
    try:
        call()
    except bex.ClientError as exc:
        if http_status(exc) == 412:
            return True
        raise
    return False


def probe(client: Any, bucket: str, prefix: str) -> None:
    """Raise :class:`MissingCapability` unless ``bucket`` honours conditional writes."""
    key = "/".join(p for p in (prefix, PROBE_DIR, uuid.uuid4().hex) if p)
    where = f"s3://{bucket}/{key}"
    missing = []

    def put(**conditions: str) -> Any:
        return client.put_object(Bucket=bucket, Key=key, Body=b"probe", **conditions)

    with aws_errors(f"probing conditional writes at {where}"):
        try:
            put(IfNoneMatch="*")
            if not _refused(lambda: put(IfNoneMatch="*")):
                missing.append("If-None-Match: * (create-once: tuples, reviews, history)")
            if not _refused(lambda: put(IfMatch=WRONG_ETAG)):
                missing.append("If-Match (compare-and-swap: channel pointers)")
        finally:
            # The current version; noncurrent ones expire by the bucket's lifecycle rule.
            client.delete_object(Bucket=bucket, Key=key)
    if missing:
        raise MissingCapability(
            f"the S3 server behind s3://{bucket} ignores conditional writes: a second write was "
            f"accepted where 412 Precondition Failed was due for {'; '.join(missing)}. "
            "Racing promotions would all 'win' and create-once records could be replaced",
            hint="use a server that honours If-None-Match/If-Match on PutObject (AWS S3, "
            "current MinIO, SeaweedFS), or a file store; nothing was written",
        )


def ensure_conditional_writes(client: Any, endpoint: str, bucket: str, prefix: str) -> None:
    """:func:`probe`, once per process per (endpoint, bucket)."""
    token = (endpoint, bucket)
    with _lock:
        if token not in _probed:
            try:
                probe(client, bucket, prefix)
                _probed[token] = None
            except MissingCapability as exc:
                _probed[token] = exc
        failure = _probed[token]
    if failure is not None:
        raise failure
