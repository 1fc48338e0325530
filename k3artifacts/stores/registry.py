"""Store URLs: one scheme, one store class, found here.

A new store is a module under :mod:`k3artifacts.stores` with a :class:`~.base.Store` subclass
that has a ``from_url`` classmethod, and one line in :data:`SCHEMES`. Classes are imported
only when their scheme is used, so a file-store command never loads boto3.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlparse

from k3artifacts.errors import ConfigError
from k3artifacts.stores.base import Store

#: URL scheme -> "module:Class". A plain path has the empty scheme.
SCHEMES: dict[str, str] = {
    "": "k3artifacts.stores.file:FileStore",
    "file": "k3artifacts.stores.file:FileStore",
    "s3": "k3artifacts.stores.s3:S3Store",
}


def open_store(url: str) -> Store:
    """``file:///abs/path``, a plain path, or ``s3://bucket/prefix``."""
    target = SCHEMES.get(urlparse(url).scheme)
    if target is None:
        raise ConfigError(
            f"unsupported store URL {url!r}", hint="use file:///path or s3://bucket/prefix"
        )
    module, _, name = target.partition(":")
    store_class: type[Store] = getattr(importlib.import_module(module), name)
    return store_class.from_url(url)  # type: ignore[attr-defined]
