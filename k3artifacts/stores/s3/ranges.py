"""Ranged reads of a published revision's objects, at their recorded versions: a pull's byte
source.
"""

from __future__ import annotations

import http.client
from collections.abc import Callable
from typing import Any

import botocore.exceptions as bex

from k3artifacts.errors import Unavailable
from k3artifacts.stores import awsclients
from k3artifacts.stores.base import ObjectRecord, RangeReader, ShortRead, Sink
from k3artifacts.stores.s3.bucket import S3Bucket


class S3Ranges(RangeReader):
    """Ranged ``GetObject`` on a client whose pool has a connection per worker, each response
    read straight into the caller's buffer. Each object is read at the version its revision
    recorded, so an overwrite in the middle of a pull cannot mix two objects' bytes; the
    CRC64NVME recorded there is offered for checking too."""

    def __init__(self, store: S3Bucket, prefix: str, records: dict[str, ObjectRecord],
                 connections: int):
        self.store = store
        self.prefix = prefix
        self.records = records
        self.client = store.companion_client(connections)
        self.checksums = {p: {"crc64nvme": r.crc64nvme} for p, r in records.items()
                          if r.crc64nvme}

    def read_range(self, path: str, offset: int, length: int, buf: memoryview,
                   sink: Sink) -> None:
        record = self.records.get(path)
        key = record.key if record is not None else f"{self.prefix}/{path}"
        args = {"Bucket": self.store.bucket, "Key": self.store.key(key),
                "Range": f"bytes={offset}-{offset + length - 1}"}
        if record is not None and record.version_id:
            args["VersionId"] = record.version_id
        try:
            resp = self.client.get_object(**args)
            body = resp["Body"]
            raw = getattr(body, "_raw_stream", None)
            read_into = _socket_reader(raw)
            done = 0
            with body:
                while done < length:
                    want = buf[: min(len(buf), length - done)]
                    if read_into is not None:
                        n = read_into(want)
                    else:
                        chunk = body.read(len(want))
                        n = len(chunk)
                        want[:n] = chunk
                    if not n:
                        raise ShortRead(f"{path}: response ended at {offset + done}")
                    sink(buf[:n])
                    done += n
                if read_into is not None and raw._fp.isclosed():
                    # Read to its end behind urllib3's back: hand the connection back to the
                    # pool ourselves, or closing the body would close it.
                    raw.release_conn()
        except (bex.BotoCoreError, bex.ClientError) as exc:
            raise awsclients.translate(exc, f"reading {self.store.s3_url(key)}") from exc
        except (OSError, ValueError, http.client.HTTPException) as exc:
            # urllib3 protocol errors surface as OSError/ValueError; a connection cut while
            # reading through http.client as IncompleteRead.
            raise Unavailable(f"reading {path}: {exc}") from exc


def _socket_reader(raw: Any) -> Callable[[memoryview], int] | None:
    """``readinto`` of the http.client response under urllib3's, where the body is sent as is.

    urllib3's own ``readinto`` reads into a new bytes object and copies it into the buffer: per
    MiB a fresh allocation (an mmap, 256 page faults, an munmap) and a copy. http.client's
    reads from the socket straight into our buffer and stops at Content-Length. Where the
    body is content-encoded (urllib3 would decode it) or the private attribute is gone, None:
    the caller reads through botocore."""
    fp = getattr(raw, "_fp", None)
    headers = getattr(raw, "headers", None)
    if not isinstance(fp, http.client.HTTPResponse) or headers is None:
        return None
    if headers.get("Content-Encoding", "identity").lower() != "identity":
        return None
    return fp.readinto
