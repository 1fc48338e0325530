"""One attempt at a request: no retry here, just what happened and whether a retry may help.

- **Redirects** are followed by :func:`open_following` (never by urllib3), at most
  :attr:`~.policy.RetryPolicy.max_redirects` of them, http and https only, so each hop's
  headers are chosen for its origin and the first answer's headers are kept (the Hub's own,
  before its CDN).
- **Credentials stay with their origin** (scheme, host, port): ``Authorization`` is dropped
  on every hop to another origin (a presigned CDN URL refuses it; another host must not see it).
- **First contact**: until a host has answered this process once, a failure to connect, or no
  headers within the connect timeout, is :attr:`TransientError.first_contact`: a wrong
  endpoint, no route or no DNS, which retrying for minutes will not change.
- Every URL in a message is redacted (:mod:`.redact`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    NameResolutionError,
    NewConnectionError,
    ProxyError,
    ReadTimeoutError,
    SSLError,
)
from urllib3.exceptions import HTTPError as Urllib3Error

from k3artifacts.net import deadline
from k3artifacts.net.policy import RetryPolicy
from k3artifacts.net.pool import shared_pool
from k3artifacts.net.redact import redact_url

REDIRECT_STATUS = frozenset({301, 302, 303, 307, 308})


class TransientError(Exception):
    """One attempt failed in a way that a retry may fix.

    ``first_contact``: the host never answered this process (see the module's docstring).
    ``slow``: the peer answered but trickled below the rate floor. ``stale_url``: a redirect
    target refused (an expired presigned URL); the next attempt starts at the origin again.
    ``wait``: what the server asked us to wait, if anything. ``answered``: an HTTP status
    came back (as opposed to no answer at all)."""

    def __init__(self, message: str, wait: float | None = None, *,
                 first_contact: bool = False, slow: bool = False, stale_url: bool = False,
                 answered: bool = False, host: str = ""):
        super().__init__(message)
        self.wait = wait
        self.first_contact = first_contact
        self.slow = slow
        self.stale_url = stale_url
        self.answered = answered
        self.host = host


class PermanentError(Exception):
    """An answer that no retry will change (a redirect loop, an answer too large...)."""


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) with the scheme's default port: what a credential is scoped to."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


def host_of(url: str) -> str:
    _, host, port = origin(url)
    return f"{host}:{port}"


def headers_for(url: str, headers: Mapping[str, str], auth_origin: str) -> dict[str, str]:
    """``headers`` for a request to ``url``, without Authorization unless ``url`` is on the
    origin of ``auth_origin``."""
    if origin(url) == origin(auth_origin):
        return dict(headers)
    return {k: v for k, v in headers.items() if k.lower() != "authorization"}


#: host:port of every server that answered in this process.
_answered: set[str] = set()
_answered_lock = threading.Lock()


def has_answered(url: str) -> bool:
    with _answered_lock:
        return host_of(url) in _answered


def send(method: str, url: str, headers: Mapping[str, str], policy: RetryPolicy, *,
         body: bytes | None = None,
         pool: urllib3.PoolManager | None = None) -> urllib3.BaseHTTPResponse:
    """One request, no redirect followed; returns once the headers are in (the body is left
    to read). Its headers come within the policy's deadline (the connect timeout, for a host
    that never answered), every read within the read timeout.

    Raises :class:`TransientError` when no answer came (refused, reset, timed out)."""
    host = host_of(url)
    first = not has_answered(url)
    try:
        with deadline.within(policy.headers_deadline(first_contact=first)):
            resp = (pool or shared_pool()).urlopen(
                method, url, body=body, headers=dict(headers), redirect=False, retries=False,
                timeout=policy.timeout(first_contact=first), preload_content=False)
    except Urllib3Error as exc:
        late = deadline.expired() and isinstance(exc, ReadTimeoutError)
        reason = (f"no complete headers within {policy.headers_deadline(first_contact=first):g}s"
                  if late else _reason(exc))
        raise TransientError(f"{host}: {reason}", first_contact=first, host=host) from None
    with _answered_lock:
        _answered.add(host)
    return resp


def _reason(exc: BaseException) -> str:
    """What went wrong, in the words an operator searches for."""
    while isinstance(exc, Urllib3Error) and getattr(exc, "reason", None) is not None:
        exc = exc.reason  # MaxRetryError and ProxyError wrap the cause
    if isinstance(exc, NameResolutionError):
        return f"the host name does not resolve ({redact_url(str(exc))})"
    if isinstance(exc, NewConnectionError) and "refused" in str(exc).lower():
        return "connection refused"
    if isinstance(exc, ConnectTimeoutError):  # NewConnectionError's base class, so after it
        return "connect timed out"
    if isinstance(exc, ReadTimeoutError):
        return "no answer, read timed out"
    if isinstance(exc, SSLError):
        return f"TLS handshake failed ({exc})"
    if isinstance(exc, ProxyError):
        return f"the proxy failed ({exc})"
    return f"connection failed: {exc}"


@dataclass
class Opened:
    """An answer with a body to read, after the redirects that led to it."""

    response: urllib3.BaseHTTPResponse
    url: str
    #: Headers of the first answer (before any redirect: the Hub's own).
    first_headers: Mapping[str, str]


def open_following(url: str, headers: Mapping[str, str], policy: RetryPolicy, *,
                   auth_origin: str, method: str = "GET", body: bytes | None = None,
                   pool: urllib3.PoolManager | None = None) -> Opened:
    """``method url``, following up to ``policy.max_redirects`` redirects; Authorization only
    ever goes to ``auth_origin``'s origin."""
    current = url
    first: Mapping[str, str] | None = None
    for _ in range(policy.max_redirects + 1):
        resp = send(method, current, headers_for(current, headers, auth_origin), policy,
                    body=body, pool=pool)
        if first is None:
            first = resp.headers
        location = resp.headers.get("Location")
        if resp.status not in REDIRECT_STATUS or not location:
            return Opened(resp, current, first)
        discard(resp)
        target = urljoin(current, location)
        if urlsplit(target).scheme.lower() not in ("http", "https"):
            raise PermanentError(f"{host_of(current)} redirected to a non-HTTP URL: "
                                 f"{redact_url(target)[:200]!r}")
        current = target
    raise PermanentError(
        f"more than {policy.max_redirects} redirects from {host_of(url)} (last: {host_of(current)})"
    )


def discard(resp: urllib3.BaseHTTPResponse) -> None:
    """Read what is left of a small answer we do not need, so its connection can be reused."""
    try:
        resp.drain_conn()
    finally:
        resp.release_conn()


def read_body(resp: urllib3.BaseHTTPResponse, limit: int, host: str) -> bytes:
    """The whole body of a small answer, at most ``limit`` bytes; always releases the answer.
    Read within whatever deadline the caller set (:func:`.deadline.within`)."""
    chunks: list[bytes] = []
    total = 0
    try:
        while True:
            try:
                data = resp.read1(1 << 16)
            except Urllib3Error as exc:
                why = "not complete within its deadline" if deadline.expired() else str(exc)
                raise TransientError(f"{host}: reading the answer failed: {why}",
                                     answered=True, host=host) from None
            if not data:
                return b"".join(chunks)
            total += len(data)
            if total > limit:
                raise PermanentError(f"{host}: answer larger than {limit} bytes")
            chunks.append(data)
    except BaseException:
        resp.close()  # a half-read answer must not go back to the pool
        raise
    finally:
        resp.release_conn()
