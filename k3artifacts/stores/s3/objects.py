"""What an object of a revision carries and what S3 reports for it: our metadata keys, the
checksum we hand S3, receipts, and the one pass that computes CRC64NVME with sha256.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from awscrt import checksums as crt_checksums

from k3artifacts.stores.base import PutReceipt
from k3artifacts.stores.s3.transfers import MiB

META_SHA256 = "k3a-sha256"
META_XXH3 = "k3a-xxh3-128"
CHECKSUM_ALGORITHM = "CRC64NVME"
READ_BLOCK = 8 * MiB

#: What S3 answers when a copy source (or the version pinned) does not exist.
GONE = {"NoSuchKey", "NoSuchVersion", "404", "InvalidArgument"}
#: What S3 answers a create-once write (``If-None-Match: *``) whose key holds an object (412),
#: or that races another conditional write of the key (409).
TAKEN = (409, 412)
#: What S3 answers when the bytes it received do not match the checksum sent with them.
DIGEST_ERRORS = {"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch"}


@dataclass(frozen=True)


class ObjectReceipt(PutReceipt):
    """What S3 reported for one object of a revision after it was put, copied or found."""

    key: str
    etag: str
    version_id: str | None
    checksum_crc64nvme: str | None
    checksum_type: str | None
    copied_from: str | None = None
    #: The published revision whose object this file reads by reference (``key`` is then
    #: outside this revision's prefix until :meth:`S3Store.materialize` copies it in).
    referenced_from: str | None = None


def crc64nvme_and_sha256(path: Path) -> tuple[str, str, int]:
    """One pass over ``path``: (base64 CRC64NVME as S3 writes it, sha256 hex, size)."""
    crc = 0
    sha = hashlib.sha256()
    size = 0
    buf = bytearray(READ_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            chunk = view[:n]
            crc = crt_checksums.crc64nvme(chunk, crc)
            sha.update(chunk)
            size += n
    return base64.b64encode(crc.to_bytes(8, "big")).decode("ascii"), sha.hexdigest(), size


def etag(resp: dict[str, Any]) -> str:
    return str(resp["ETag"])
