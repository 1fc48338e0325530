"""The urllib3 pools every k3a client sends through: TLS checked against the settings' CA
bundle (or a peer's own CA, for the Kubernetes API), nothing retried or redirected by urllib3
(:mod:`.attempt` and :mod:`.calls` do both, by the one policy), and every answer read through
the deadline (:class:`~.deadline.BoundedResponse`)."""

from __future__ import annotations

import threading
from pathlib import Path

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from k3artifacts.net.deadline import BoundedResponse
from k3artifacts.settings import load


class _Connection(HTTPConnection):
    response_class = BoundedResponse


class _TLSConnection(HTTPSConnection):
    response_class = BoundedResponse


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


class _Manager(urllib3.PoolManager):
    def __init__(self, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}


def make_pool(*, ca_certs: str | Path | None = None, cert_file: str | None = None,
              key_file: str | None = None, verify: bool = True,
              server_hostname: str | None = None, maxsize: int = 10) -> urllib3.PoolManager:
    """A pool of connections to peers that need their own TLS material (the Kubernetes API's
    CA and client certificate); ``ca_certs`` defaults to ``K3A_CA_BUNDLE``."""
    ca = ca_certs if ca_certs is not None else load().ca_bundle
    tls: dict[str, object] = {"cert_reqs": "CERT_REQUIRED" if verify else "CERT_NONE"}
    if ca is not None:
        tls["ca_certs"] = str(ca)
    if cert_file:
        tls["cert_file"] = cert_file
    if key_file:
        tls["key_file"] = key_file
    if server_hostname:
        tls["server_hostname"] = server_hostname
    # num_pools: hosts kept at once; maxsize: connections kept per host. Up to 8 files at
    # once, each over several streams, to one CDN host: a pool smaller than that opens and
    # throws away a connection per range.
    return _Manager(num_pools=16, maxsize=maxsize, retries=False, **tls)


_shared: dict[str | None, urllib3.PoolManager] = {}
_shared_lock = threading.Lock()


def shared_pool() -> urllib3.PoolManager:
    """The process's pool for every peer checked against the default trust (one per CA
    bundle setting, so a test that changes ``K3A_CA_BUNDLE`` gets a pool that uses it)."""
    ca = load().ca_bundle
    key = None if ca is None else str(ca)
    with _shared_lock:
        if key not in _shared:
            _shared[key] = make_pool(ca_certs=ca, maxsize=64)
        return _shared[key]
