"""Positioned reads of a published revision's files: the byte sources of a pull.

* :class:`FileSource`: a file store (local tree or FSx mount): ``os.preadv`` straight into the
  caller's buffer, any number of threads on one descriptor.
* :class:`S3Source`: ranged ``GetObject`` on a client whose pool has a connection per worker,
  each response read straight into the caller's buffer. Parts of one object are pinned to the
  version staging recorded (``.k3a/s3-objects.json``), so an overwrite in the middle of a pull
  cannot mix two objects' bytes; the CRC64NVME recorded there is checked too.
"""

from __future__ import annotations

import json
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from k3artifacts.errors import NotFound, Unavailable
from k3artifacts.revisions.manifest import META_DIR, revision_prefix
from k3artifacts.stores.base import Store


class ShortRead(Exception):
    """The source gave fewer bytes than asked for: retried, then reported."""


#: ``sink(view)``: the next bytes of the range, in order; ``view`` is reused after it returns.
Sink = Callable[[memoryview], None]


class Source(ABC):
    #: Extra whole-file checksums the source recorded (path -> {"crc64nvme": base64}).
    checksums: dict[str, dict[str, str]]

    @abstractmethod
    def read_range(self, path: str, offset: int, length: int, buf: memoryview,
                   sink: Sink) -> None:
        """Pass the ``length`` bytes of ``path`` at ``offset`` to ``sink`` in order, through
        ``buf`` (the caller's reusable chunk buffer), or raise."""

    def close(self) -> None:
        return None


class FileSource(Source):
    def __init__(self, root: Path):
        self.root = root
        self.checksums = {}
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fd(self, path: str) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                try:
                    fd = os.open(self.root.joinpath(*path.split("/")), os.O_RDONLY)
                except FileNotFoundError:
                    raise NotFound(f"{path} is missing from {self.root}") from None
                self._fds[path] = fd
            return fd

    def read_range(self, path: str, offset: int, length: int, buf: memoryview,
                   sink: Sink) -> None:
        fd = self._fd(path)
        done = 0
        while done < length:
            n = os.preadv(fd, [buf[: min(len(buf), length - done)]], offset + done)
            if n == 0:
                raise ShortRead(f"{path}: end of file at {offset + done}")
            sink(buf[:n])
            done += n

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


class S3Source(Source):
    def __init__(self, store: Any, prefix: str, connections: int):
        from k3artifacts.stores import awsclients

        self.store = store
        self.prefix = prefix
        # Same endpoint and region as the store's own client, a bigger connection pool.
        endpoint = store.client.meta.endpoint_url
        if "amazonaws.com" in (endpoint or ""):
            endpoint = None
        self.client = awsclients.client(
            "s3", endpoint_url=endpoint, region=store.client.meta.region_name,
            max_pool_connections=connections,
        )
        self.versions: dict[str, str] = {}
        self.checksums = {}
        self._load_receipts()

    def _load_receipts(self) -> None:
        from k3artifacts.stores.s3 import OBJECTS_NAME

        found = self.store.read(f"{self.prefix}/{META_DIR}/{OBJECTS_NAME}")
        if found is None:
            return
        for obj in json.loads(found.data).get("objects", []):
            if obj.get("version_id") and obj["version_id"] != "null":
                self.versions[obj["path"]] = obj["version_id"]
            if obj.get("checksum_crc64nvme") and obj.get("checksum_type") in (None, "FULL_OBJECT"):
                self.checksums[obj["path"]] = {"crc64nvme": obj["checksum_crc64nvme"]}

    def read_range(self, path: str, offset: int, length: int, buf: memoryview,
                   sink: Sink) -> None:
        import botocore.exceptions as bex

        from k3artifacts.stores.awsclients import translate

        args = {"Bucket": self.store.bucket, "Key": self.store.key(f"{self.prefix}/{path}"),
                "Range": f"bytes={offset}-{offset + length - 1}"}
        if path in self.versions:
            args["VersionId"] = self.versions[path]
        try:
            resp = self.client.get_object(**args)
            body = resp["Body"]
            # The urllib3 response under botocore's StreamingBody reads into our buffer with
            # no intermediate bytes object (the copy that costs at several GB/s).
            raw = getattr(body, "_raw_stream", None)
            done = 0
            with body:
                while done < length:
                    want = buf[: min(len(buf), length - done)]
                    if raw is not None and hasattr(raw, "readinto"):
                        n = raw.readinto(want)
                    else:
                        chunk = body.read(len(want))
                        n = len(chunk)
                        want[:n] = chunk
                    if not n:
                        raise ShortRead(f"{path}: response ended at {offset + done}")
                    sink(buf[:n])
                    done += n
        except (bex.BotoCoreError, bex.ClientError) as exc:
            raise translate(exc, f"reading {self.store.s3_url(self.prefix + '/' + path)}") from exc
        except (OSError, ValueError) as exc:  # urllib3 protocol errors surface as these
            raise Unavailable(f"reading {path}: {exc}") from exc


def open_source(store: Store, repo_id: str, commit: str, connections: int) -> Source:
    prefix = revision_prefix(repo_id, commit)
    local = store.local_path(prefix)
    if local is not None:
        return FileSource(local)
    return S3Source(store, prefix, connections)
