"""Store URLs: one scheme, one store class, found here.

A new store is a module under :mod:`k3artifacts.stores` with a :class:`~.base.Store` subclass
that has a ``from_url`` classmethod, and one line in :data:`SCHEMES` (and one in :data:`SETUPS`
when ``k3a bootstrap`` sets it up). Classes are imported only when their scheme is used, so a
file-store command never loads botocore. What a URL's scheme decides is answered here or by the
store class: nothing outside :mod:`k3artifacts.stores` reads a scheme.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlparse

from k3artifacts.errors import ConfigError
from k3artifacts.revisions.manifest import revision_prefix
from k3artifacts.stores.base import Placement, Store

#: URL scheme -> "module:Class". A plain path has the empty scheme.
SCHEMES: dict[str, str] = {
    "": "k3artifacts.stores.file:FileStore",
    "file": "k3artifacts.stores.file:FileStore",
    "s3": "k3artifacts.stores.s3:S3Store",
}

#: URL scheme -> how ``k3a bootstrap`` sets a store of that kind up, once: ``bucket`` (an S3
#: bucket's settings and IAM policies, :mod:`.bootstrap`) or ``group`` (a file tree shared by a
#: Unix group, :mod:`.file_bootstrap`). A kind with nothing to set up has no line.
SETUPS: dict[str, str] = {
    "file": "group",
    "s3": "bucket",
}


def setup_named(arg: str) -> str | None:
    """How the store a command-line argument names is set up (:data:`SETUPS`); None when the
    argument is no store URL with a scheme (an option's value, an ARN, a plain path)."""
    try:
        scheme = urlparse(arg).scheme
    except ValueError:  # not a URL at all (an unbalanced "[" in an option's value)
        return None
    return SETUPS.get(scheme)


def _store_class(url: str) -> type[Store]:
    target = SCHEMES.get(urlparse(url).scheme)
    if target is None:
        raise ConfigError(
            f"unsupported store URL {url!r}", hint="use file:///path or s3://bucket/prefix"
        )
    module, _, name = target.partition(":")
    store_class: type[Store] = getattr(importlib.import_module(module), name)
    return store_class


def open_store(url: str) -> Store:
    """``file:///abs/path``, a plain path, or ``s3://bucket/prefix``."""
    return _store_class(url).from_url(url)  # type: ignore[attr-defined]


def weights_placement(location: str, repo_id: str, commit: str) -> Placement:
    """Where a tuple's weights live, from the location its binding recorded
    (:meth:`Store.location`): the store it is in and how a server mounts it."""
    location = location.rstrip("/")
    suffix = revision_prefix(repo_id, commit)
    if not location.endswith("/" + suffix):
        raise ConfigError(f"weights location {location} does not end in {suffix}")
    store_url = location[: -len(suffix) - 1]
    if not urlparse(store_url).scheme:
        raise ConfigError(f"unsupported weights location {location}")
    return _store_class(store_url).placement_at(store_url, suffix)


def weights_store(location: str, repo_id: str, commit: str, *, beside: Store) -> Store:
    """The store a tuple's weights are in (from the location its binding recorded): ``beside``,
    the store that holds the tuple, when it is that one, else opened from the location."""
    url = weights_placement(location, repo_id, commit).store_url
    return beside if url.rstrip("/") == beside.url.rstrip("/") else open_store(url)
