"""Files the verified load (``--load-format k3a``) refused, recorded for the next pull.

Where the server loads with ``--load-format k3a``, ``k3a pull --verified-by-loader`` does not
hash the files the node already holds: the loader hashes every byte as it reads it, against
the signed manifest, and refuses the load on a mismatch. The repair loop closes here: the
loader writes one record per refused file into ``ROOT/.k3a-cache/refused/`` (the render
mounts that directory, alone, writable into the server's container; the pull makes it 0700,
so only the account the pod runs as writes there), and the next pull of that manifest fetches
exactly those files again, hashing them as they are written, then removes the records.

A record is a request to do more work, never a reason to do less: a forged one costs a fetch,
a deleted one leaves the loader refusing the copy (the pod never becomes ready), and nothing
here is taken as evidence that a file is good.
"""

from __future__ import annotations

import os
from pathlib import Path

import xxhash
from pydantic import BaseModel, ConfigDict, ValidationError

from k3artifacts.nodecache.layout import STATE_DIR, CacheLayout
from k3artifacts.nodecache.safefs import Dir

KIND = "refused"
#: Records a pull reads at most: a directory flooded by a hostile writer costs nothing more.
MAX_RECORDS = 4096
MAX_RECORD_BYTES = 64 << 10


class LoadRefusal(BaseModel):
    """``<manifest digest>.<xxh3-64 of path>.json``: one file the loader refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    manifest_digest: str
    path: str
    #: Why, as the loader said it (the digests, or the size).
    reason: str


def _name(manifest_digest: str, path: str) -> str:
    return f"{manifest_digest}.{xxhash.xxh3_64_hexdigest(path.encode())}.json"


def record(directory: Path, manifest_digest: str, path: str, reason: str) -> Path:
    """Write the loader's refusal of ``path`` into ``directory`` (the mounted refusals
    directory: not reached through a link, written whole then renamed)."""
    name = _name(manifest_digest, path)
    with Dir(os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), directory) as d:
        d.write_file(name, LoadRefusal(manifest_digest=manifest_digest, path=path,
                                       reason=reason).model_dump_json().encode(), mode=0o600)
    return directory / name


def refusals_dir(layout: CacheLayout) -> Dir:
    """``ROOT/.k3a-cache/refused``, made 0700 (this account's) where missing."""
    with layout.open_root() as root:
        state = root.walk([STATE_DIR], create=True)
    with state:
        d = state.sub(KIND, create=True, mode=0o700)
    return d


def refused(layout: CacheLayout, manifest_digest: str) -> dict[str, str]:
    """path -> reason of every file the loader refused under ``manifest_digest``."""
    out: dict[str, str] = {}
    with refusals_dir(layout) as d:
        names = sorted(n for n, _ in d.entries() if n.startswith(f"{manifest_digest}."))
        for name in names[:MAX_RECORDS]:
            raw = d.read_bytes(name)
            if raw is None or len(raw) > MAX_RECORD_BYTES:
                continue
            try:
                rec = LoadRefusal.model_validate_json(raw)
            except ValidationError:
                continue
            if rec.manifest_digest == manifest_digest and name == _name(manifest_digest,
                                                                        rec.path):
                out[rec.path] = rec.reason
    return out


def clear(layout: CacheLayout, manifest_digest: str, paths: set[str]) -> None:
    """Drop the records of ``paths`` (fetched again and verified by this pull)."""
    with refusals_dir(layout) as d:
        for path in paths:
            d.unlink(_name(manifest_digest, path))
