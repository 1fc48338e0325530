"""Stream one file from the Hub into a partial file, hashing bytes as they arrive.

What it follows, as the official ``huggingface_hub`` client does (``file_download.py``,
``utils/_http.py``):

- **Redirects**, at most :attr:`RetryPolicy.max_redirects` of them (301, 302, 303, 307, 308;
  http and https only). huggingface.co answers ``/resolve/`` for every LFS file with a 302 to
  its CDN on another origin. The ``X-Repo-Commit``, ``X-Linked-Etag`` and ``X-Linked-Size`` of
  the Hub's own (first, pre-redirect) answer are checked against what the caller expects.
- **Authorization stays with the Hub's origin** (scheme, host, port): it is dropped on every
  hop to another origin, as a presigned CDN URL refuses it.
- **Resume against the final URL**: after a dropped connection the next attempt asks the CDN
  URL it was redirected to for ``Range: bytes=<received>-``; if that URL no longer answers
  (an expired signature: 403/410), it goes back to the Hub once for a fresh one. Across
  processes the partial file on disk is re-hashed once, then the rest is fetched.
- **429 and 5xx** are retried after ``Retry-After`` (capped at ``max_retry_after``) or an
  exponential backoff; only attempts that moved no byte count towards giving up.
- **Timeouts**: every request has a connect and a read timeout; a transfer that delivers no
  byte for ``read_timeout`` is cut and resumed. A transfer slower than ``min_rate`` bytes/s
  over ``rate_window`` seconds is cut too, and ``slow_attempts`` such cuts in a row end with
  :class:`Unavailable` (exit 8) naming the server that trickled.

Memory is one reused buffer per transfer.
"""

from __future__ import annotations

import email.utils
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
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

from k3artifacts.errors import Unavailable
from k3artifacts.revisions.hashing import MultiHasher, feed_file

log = logging.getLogger(__name__)

NET_CHUNK = 1 << 20
RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}
REDIRECT_STATUS = {301, 302, 303, 307, 308}
#: A presigned URL that expired between attempts: ask the Hub for a fresh one.
EXPIRED_STATUS = {401, 403, 410}
#: Hub headers on the ``/resolve/`` answer (huggingface_hub.constants spells them the same).
HEADER_COMMIT = "X-Repo-Commit"
HEADER_LINKED_ETAG = "X-Linked-Etag"
HEADER_LINKED_SIZE = "X-Linked-Size"


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try, and how long to wait, for one Hub call or transfer.

    The defaults suit huggingface.co: its API answers in well under a second and its CDN
    delivers megabytes a second, so 60 s without a byte or under 64 KiB/s for a minute means
    a stuck connection, worth cutting and resuming rather than waiting on."""

    attempts: int = 8
    backoff: float = 1.0
    max_backoff: float = 60.0
    #: The longest ``Retry-After`` obeyed; a longer one is waited this long, then retried.
    max_retry_after: float = 300.0
    connect_timeout: float = 10.0
    #: No byte for this long cuts the request (headers or body): a stall.
    read_timeout: float = 60.0
    max_redirects: int = 5
    #: A transfer slower than this many bytes/s over ``rate_window`` seconds is a trickle.
    min_rate: float = 64 * 1024
    rate_window: float = 60.0
    #: Trickles in a row before giving up (each one is cut and resumed from its last byte).
    slow_attempts: int = 3

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        return min(self.backoff * 2**attempt, self.max_backoff) * (0.5 + random.random() / 2)

    def timeout(self) -> urllib3.Timeout:
        return urllib3.Timeout(connect=self.connect_timeout, read=self.read_timeout)


class TransientError(Exception):
    """One attempt failed in a way that a retry may fix.

    ``first_contact``: no connection could be made (DNS, refused, TLS) to a host that never
    answered this process: retried once, quickly, not by the policy. ``slow``: the server
    answered but trickled below the rate floor. ``stale_url``: the redirect target refused
    (an expired presigned URL); the next attempt starts at the Hub again."""

    def __init__(self, message: str, retry_after: float | None = None, *,
                 first_contact: bool = False, slow: bool = False, stale_url: bool = False,
                 host: str = ""):
        super().__init__(message)
        self.retry_after = retry_after
        self.first_contact = first_contact
        self.slow = slow
        self.stale_url = stale_url
        self.host = host


#: Before a host ever answered, a failure to connect is retried once, this soon.
FIRST_CONTACT_RETRY_S = 0.5
#: host:port of every server that answered a download in this process.
_answered: set[str] = set()
_answered_lock = threading.Lock()


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) with the scheme's default port: what Authorization is scoped to."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


def host_of(url: str) -> str:
    _, host, port = origin(url)
    return f"{host}:{port}"


def headers_for(url: str, headers: Mapping[str, str], hub_url: str) -> dict[str, str]:
    """``headers`` for a request to ``url``, without Authorization unless ``url`` is on the
    Hub's own origin (that of ``hub_url``)."""
    if origin(url) == origin(hub_url):
        return dict(headers)
    return {k: v for k, v in headers.items() if k.lower() != "authorization"}


class PermanentError(Exception):
    """An answer that no retry will change (404, 403...)."""


class RangeIgnored(Exception):
    """The server answered a Range request with the whole body."""


_pool: urllib3.PoolManager | None = None


def pool() -> urllib3.PoolManager:
    global _pool
    if _pool is None:
        # Redirects are followed by :func:`open_following` (never by urllib3), so each hop's
        # headers are chosen for its origin and the Hub's own answer is seen.
        _pool = urllib3.PoolManager(num_pools=8, maxsize=16, retries=False)
    return _pool


def retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def request(method: str, url: str, headers: Mapping[str, str], policy: RetryPolicy,
            **kw) -> urllib3.BaseHTTPResponse:
    """One request, no redirect followed, connect and read timeouts from ``policy``.

    Raises :class:`TransientError` when no answer came (refused, reset, timed out)."""
    try:
        resp = pool().request(method, url, headers=dict(headers), redirect=False, retries=False,
                              timeout=policy.timeout(), **kw)
    except Urllib3Error as exc:
        with _answered_lock:
            known = host_of(url) in _answered
        unreachable = isinstance(exc, (NewConnectionError, SSLError, ProxyError))
        raise TransientError(
            f"{host_of(url)}: {_reason(exc)}",
            first_contact=unreachable and not known, host=host_of(url),
        ) from None
    with _answered_lock:
        _answered.add(host_of(url))
    return resp


def _reason(exc: BaseException) -> str:
    """What went wrong, in the words an operator searches for."""
    while isinstance(exc, Urllib3Error) and getattr(exc, "reason", None) is not None:
        exc = exc.reason  # MaxRetryError and ProxyError wrap the cause
    if isinstance(exc, NameResolutionError):
        return f"the host name does not resolve ({exc})"
    if isinstance(exc, NewConnectionError) and "refused" in str(exc).lower():
        return f"connection refused ({exc})"
    if isinstance(exc, ConnectTimeoutError):  # NewConnectionError's base class, so after it
        return f"connect timed out ({exc})"
    if isinstance(exc, ReadTimeoutError):
        return f"no answer, read timed out ({exc})"
    if isinstance(exc, SSLError):
        return f"TLS handshake failed ({exc})"
    return f"connection failed: {exc}"


@dataclass
class Opened:
    """An answer with a body to read, after the redirects that led to it."""

    response: urllib3.BaseHTTPResponse
    url: str
    #: Headers of the first answer (the Hub's own, before any redirect).
    first_headers: Mapping[str, str]


def open_following(url: str, headers: Mapping[str, str], policy: RetryPolicy, *,
                   hub_url: str, method: str = "GET") -> Opened:
    """``method url``, following up to ``policy.max_redirects`` redirects; Authorization only
    ever goes to ``hub_url``'s origin."""
    current = url
    first: Mapping[str, str] | None = None
    for _ in range(policy.max_redirects + 1):
        resp = request(method, current, headers_for(current, headers, hub_url), policy,
                       preload_content=False)
        if first is None:
            first = resp.headers
        location = resp.headers.get("Location")
        if resp.status not in REDIRECT_STATUS or not location:
            return Opened(resp, current, first)
        _discard(resp)
        target = urljoin(current, location)
        if urlsplit(target).scheme.lower() not in ("http", "https"):
            raise PermanentError(f"{host_of(current)} redirected to a non-HTTP URL: {target!r}")
        current = target
    raise PermanentError(
        f"more than {policy.max_redirects} redirects from {host_of(url)} (last: {host_of(current)})"
    )


def _discard(resp: urllib3.BaseHTTPResponse) -> None:
    try:
        resp.drain_conn()
    finally:
        resp.release_conn()


@dataclass(frozen=True)
class Expected:
    """What the Hub's own answer must say about the file, where it says anything."""

    commit: str | None = None
    sha256: str | None = None


def check_hub_headers(first: Mapping[str, str], size: int, expected: Expected) -> None:
    commit = first.get(HEADER_COMMIT)
    if expected.commit and commit and commit != expected.commit:
        raise PermanentError(f"the hub served commit {commit}, not the listed {expected.commit}")
    etag = (first.get(HEADER_LINKED_ETAG) or "").strip().removeprefix("W/").strip('"')
    if expected.sha256 and etag and etag != expected.sha256:
        raise PermanentError(
            f"the hub's X-Linked-Etag {etag} differs from the listed sha256 {expected.sha256}"
        )
    linked = first.get(HEADER_LINKED_SIZE)
    if linked is not None and linked.strip() != str(size):
        raise PermanentError(f"the hub's X-Linked-Size {linked!r} differs from the listed {size}")


class _Transfer:
    """The state of one file's download across attempts: the URL to resume from."""

    def __init__(self, url: str, headers: Mapping[str, str], size: int, expected: Expected,
                 policy: RetryPolicy):
        self.hub_url = url
        self.headers = headers
        self.size = size
        self.expected = expected
        self.policy = policy
        #: Where the bytes came from last time (the CDN, after the Hub's redirect).
        self.resume_url: str | None = None

    def attempt(self, fh, hasher: MultiHasher, on_bytes: Callable[[int], None] | None) -> None:
        offset = hasher.size
        req = dict(self.headers)
        if offset:
            req["Range"] = f"bytes={offset}-"
        start = self.resume_url or self.hub_url
        opened = open_following(start, req, self.policy, hub_url=self.hub_url)
        resp = opened.response
        try:
            if start == self.hub_url:
                check_hub_headers(opened.first_headers, self.size, self.expected)
            if resp.status in RETRY_STATUS:
                raise TransientError(f"HTTP {resp.status} from {host_of(opened.url)}",
                                     retry_after(resp.headers.get("Retry-After")),
                                     host=host_of(opened.url))
            if self.resume_url is not None and resp.status in EXPIRED_STATUS:
                self.resume_url = None
                raise TransientError(f"HTTP {resp.status} from {host_of(opened.url)} on resume",
                                     0.0, stale_url=True, host=host_of(opened.url))
            if offset and resp.status == 200:
                # The server ignored Range: start over rather than append a second copy.
                raise RangeIgnored()
            if resp.status not in (200, 206):
                raise PermanentError(f"HTTP {resp.status} from {host_of(opened.url)}")
            self.resume_url = opened.url if opened.url != self.hub_url else None
            self._body(resp, opened.url, fh, hasher, on_bytes)
        except BaseException:
            # An unread or broken body must not go back to the pool for the next request.
            resp.close()
            raise
        finally:
            resp.release_conn()

    def _body(self, resp, url: str, fh, hasher: MultiHasher,
              on_bytes: Callable[[int], None] | None) -> None:
        size, policy = self.size, self.policy
        window_start, window_bytes = time.monotonic(), 0
        while hasher.size < size:
            try:
                # read1 returns what has arrived instead of waiting for a full chunk, so a
                # dropped connection loses no byte already received: resume starts there.
                data = resp.read1(min(NET_CHUNK, size - hasher.size))
            except Urllib3Error as exc:
                raise TransientError(
                    f"connection to {host_of(url)} lost at byte {hasher.size}: {exc}",
                    host=host_of(url),
                ) from None
            if not data:
                raise TransientError(f"body from {host_of(url)} ended at byte {hasher.size} "
                                     f"of {size}", host=host_of(url))
            fh.write(data)
            hasher.update(data)
            if on_bytes is not None:
                on_bytes(len(data))
            window_bytes += len(data)
            elapsed = time.monotonic() - window_start
            if elapsed >= policy.rate_window and hasher.size < size:
                rate = window_bytes / elapsed
                if rate < policy.min_rate:
                    raise TransientError(
                        f"{host_of(url)} sent {rate:.0f} B/s over {elapsed:.1f}s, below the "
                        f"floor of {policy.min_rate:.0f} B/s", slow=True, host=host_of(url),
                    )
                window_start, window_bytes = time.monotonic(), 0
        if resp.read(1):
            raise PermanentError(f"{host_of(url)} sent more than the listed {size} bytes")


def fetch(
    url: str,
    headers: dict[str, str],
    part: Path,
    size: int,
    hasher_factory: Callable[[], MultiHasher],
    *,
    policy: RetryPolicy = RetryPolicy(),
    on_bytes: Callable[[int], None] | None = None,
    on_resumed: Callable[[int], None] | None = None,
    label: str = "",
    durable: bool = True,
    expected: Expected = Expected(),
) -> MultiHasher:
    """Complete ``part`` to ``size`` bytes from ``url``; return the hasher over the whole file.

    ``on_bytes`` sees bytes received from the network, ``on_resumed`` bytes re-read from a
    partial file left by an earlier process. Raises :class:`Unavailable` when attempts that
    make no progress (or trickles) are exhausted and :class:`PermanentError` when the server's
    answer cannot become right by retrying. ``durable=False`` skips the fsync (the caller makes
    the bytes durable some other way, or re-checks them after a crash).
    """
    hasher = hasher_factory()
    if part.exists():
        existing = part.stat().st_size
        if existing > size:
            part.unlink()
        elif existing:
            # Cross-process resume: the old process's hash state is gone; rebuild it from the
            # bytes already on disk (read once), then fetch only the rest.
            feed_file(hasher, part, limit=existing, on_bytes=on_resumed)
            if existing == size:
                # The old process received every byte and died before checking them. Asking
                # for the rest would be a Range past the end, which servers answer with 416.
                return hasher
    transfer = _Transfer(url, headers, size, expected, policy)
    attempt = slow = 0
    name = label or url
    with open(part, "r+b" if part.exists() else "wb") as fh:
        while True:
            fh.seek(hasher.size)
            fh.truncate()
            before = hasher.size
            try:
                transfer.attempt(fh, hasher, on_bytes)
                fh.flush()
                if durable:
                    os.fsync(fh.fileno())
                return hasher
            except RangeIgnored:
                hasher = hasher_factory()
            except TransientError as exc:
                if exc.first_contact:
                    attempt += 1
                    if attempt >= 2:
                        raise Unavailable(
                            f"{name}: cannot reach {exc.host or host_of(url)} (it never "
                            f"answered): {exc}",
                            hint="check the endpoint (--endpoint / HF_ENDPOINT) and the route, "
                            "DNS and proxy to it; partial files are kept for the re-run",
                        ) from None
                    time.sleep(FIRST_CONTACT_RETRY_S)
                    continue
                if exc.slow:
                    slow += 1
                    if slow >= policy.slow_attempts:
                        raise Unavailable(
                            f"{name}: {exc.host} too slow, {slow} transfers in a row: {exc}",
                            hint="the partial file is kept; re-run later or from a better "
                            "connected host, or lower the floor with --min-rate",
                        ) from None
                else:
                    slow = 0
                # A flaky link that still moves bytes is not a dead one: only attempts that
                # made no progress count towards giving up.
                attempt = 1 if hasher.size > before else attempt + 1
                if attempt >= policy.attempts:
                    raise Unavailable(
                        f"{name}: gave up after {attempt} attempts: {exc}",
                        hint="the partial file is kept; re-run the same command to resume",
                    ) from None
                delay = policy.delay(attempt - 1, exc.retry_after)
                log.warning(
                    "%s: %s; attempt %d of %d without progress, retrying in %.1fs from byte %d",
                    name, exc, attempt, policy.attempts, delay, hasher.size,
                )
                time.sleep(delay)
