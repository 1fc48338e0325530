"""The httpx client the ``openai`` package is given (its ``http_client`` option), so an
endpoint's answers obey the same rules as every other peer's: the settings' CA bundle, and a
total deadline over an answer's headers on top of httpx's connect and read timeouts.

httpx reads through httpcore's network streams, one ``read(max_bytes, timeout)`` per socket
read; the streams here shorten each read's timeout to the time left before the deadline
(:mod:`.deadline`), which the transport sets around sending a request and reading its
headers. A streamed answer's body is then read with the read timeout alone: a completion
streams for as long as it generates.
"""

from __future__ import annotations

import ssl
from typing import Any

import httpcore
import httpx

from k3artifacts.net import deadline
from k3artifacts.settings import load


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            bounded, by_deadline = deadline.bound(timeout)
        except deadline.DeadlinePassed as exc:
            raise httpcore.ReadTimeout(str(exc)) from None
        try:
            return self._inner.read(max_bytes, bounded)
        except httpcore.ReadTimeout:
            deadline.timed_out(by_deadline)
            raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_tcp(host, port, timeout, local_address,
                                               socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Transport(httpx.HTTPTransport):
    def __init__(self, ssl_context: ssl.SSLContext, limits: httpx.Limits,
                 headers_deadline: float):
        super().__init__(verify=ssl_context, limits=limits)
        self._headers_deadline = headers_deadline
        # httpx's own transport, but its connection pool reads through our streams (httpx
        # has no option for a network backend; httpcore's pool takes one).
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context, max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry, network_backend=_Backend())

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with deadline.within(self._headers_deadline):
            try:
                return super().handle_request(request)
            except httpx.ReadTimeout as exc:
                if not deadline.expired():
                    raise
                raise httpx.ReadTimeout(
                    f"no complete headers within {self._headers_deadline:g}s",
                    request=request) from exc


def endpoint_client(*, connect: float, read: float, headers_deadline: float) -> httpx.Client:
    """An httpx client for an OpenAI-compatible endpoint: ``connect`` and ``read`` timeouts,
    the answer's headers within ``headers_deadline``, TLS checked against ``K3A_CA_BUNDLE``
    (else the system's trust store)."""
    bundle = load().ca_bundle
    context = ssl.create_default_context(cafile=None if bundle is None else str(bundle))
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)
    return httpx.Client(transport=_Transport(context, limits, headers_deadline),
                        timeout=httpx.Timeout(read, connect=connect))
