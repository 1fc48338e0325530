"""Stream one file from a URL into a partial file, hashing bytes as they arrive.

Resumes within a process (Range from the current offset after a dropped connection, with the
hash state kept in memory) and across processes (the partial file on disk is re-hashed once,
then the transfer continues with a Range request). Memory is one reused buffer per transfer.
"""

from __future__ import annotations

import email.utils
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import urllib3
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import NewConnectionError, ProxyError, SSLError
from urllib3.util import parse_url

from k3artifacts.errors import Unavailable
from k3artifacts.revisions.hashing import MultiHasher, feed_file

log = logging.getLogger(__name__)

NET_CHUNK = 1 << 20
RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    backoff: float = 1.0
    max_backoff: float = 60.0
    connect_timeout: float = 10.0
    read_timeout: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_backoff)
        return min(self.backoff * 2**attempt, self.max_backoff) * (0.5 + random.random() / 2)


class TransientError(Exception):
    """One attempt failed in a way that a retry may fix.

    ``first_contact``: no connection could be made (DNS, refused, TLS) to a host that never
    answered this process: retried once, quickly, not by the policy."""

    def __init__(self, message: str, retry_after: float | None = None, *,
                 first_contact: bool = False):
        super().__init__(message)
        self.retry_after = retry_after
        self.first_contact = first_contact


#: Before a host ever answered, a failure to connect is retried once, this soon.
FIRST_CONTACT_RETRY_S = 0.5
#: host:port of every server that answered a download in this process.
_answered: set[str] = set()
_answered_lock = threading.Lock()


def _host(url: str) -> str:
    parsed = parse_url(url)
    return f"{parsed.host}:{parsed.port or (443 if parsed.scheme == 'https' else 80)}"


class PermanentError(Exception):
    """An answer that no retry will change (404, 403...)."""


class RangeIgnored(Exception):
    """The server answered a Range request with the whole body."""


_pool: urllib3.PoolManager | None = None


def pool() -> urllib3.PoolManager:
    global _pool
    if _pool is None:
        # Authorization is dropped on cross-host redirects (urllib3's default), which is what
        # the Hub's redirects to its CDN need.
        _pool = urllib3.PoolManager(num_pools=8, maxsize=16, retries=False)
    return _pool


def retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value)
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def _attempt(
    url: str,
    headers: dict[str, str],
    fh,
    hasher: MultiHasher,
    size: int,
    policy: RetryPolicy,
    on_bytes: Callable[[int], None] | None,
) -> None:
    offset = hasher.size
    req_headers = dict(headers)
    if offset:
        req_headers["Range"] = f"bytes={offset}-"
    timeout = urllib3.Timeout(connect=policy.connect_timeout, read=policy.read_timeout)
    try:
        resp = pool().request(
            "GET", url, headers=req_headers, preload_content=False, redirect=True, timeout=timeout
        )
    except Urllib3Error as exc:
        with _answered_lock:
            known = _host(url) in _answered
        unreachable = isinstance(exc, (NewConnectionError, SSLError, ProxyError))
        raise TransientError(
            f"connection failed: {exc}", first_contact=unreachable and not known
        ) from None
    with _answered_lock:
        _answered.add(_host(url))
    try:
        if resp.status in RETRY_STATUS:
            raise TransientError(
                f"HTTP {resp.status}", retry_after(resp.headers.get("Retry-After"))
            )
        if offset and resp.status == 200:
            # The server ignored Range: start over rather than append a second copy.
            raise RangeIgnored()
        if resp.status not in (200, 206):
            raise PermanentError(f"HTTP {resp.status}")
        while hasher.size < size:
            try:
                # read1 returns what has arrived instead of waiting for a full chunk, so a
                # dropped connection loses no byte already received: resume starts there.
                data = resp.read1(min(NET_CHUNK, size - hasher.size))
            except Urllib3Error as exc:
                raise TransientError(f"connection lost at byte {hasher.size}: {exc}") from None
            if not data:
                raise TransientError(f"body ended at byte {hasher.size} of {size}")
            fh.write(data)
            hasher.update(data)
            if on_bytes is not None:
                on_bytes(len(data))
        if resp.read(1):
            raise PermanentError(f"server sent more than the listed {size} bytes")
    except BaseException:
        # An unread or broken body must not go back to the pool for the next request.
        resp.close()
        raise
    finally:
        resp.release_conn()


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
) -> MultiHasher:
    """Complete ``part`` to ``size`` bytes from ``url``; return the hasher over the whole file.

    ``on_bytes`` sees bytes received from the network, ``on_resumed`` bytes re-read from a
    partial file left by an earlier process. Raises :class:`Unavailable` when attempts that
    make no progress are exhausted and :class:`PermanentError` when the server's answer cannot
    become right by retrying. ``durable=False`` skips the fsync (the caller makes the bytes
    durable some other way, or re-checks them after a crash).
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
    attempt = 0
    with open(part, "r+b" if part.exists() else "wb") as fh:
        while True:
            fh.seek(hasher.size)
            fh.truncate()
            before = hasher.size
            try:
                _attempt(url, headers, fh, hasher, size, policy, on_bytes)
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
                            f"{label or url}: cannot reach {_host(url)} (it never answered): "
                            f"{exc}",
                            hint="check the endpoint (--endpoint / HF_ENDPOINT) and the route, "
                            "DNS and proxy to it; partial files are kept for the re-run",
                        ) from None
                    time.sleep(FIRST_CONTACT_RETRY_S)
                    continue
                # A flaky link that still moves bytes is not a dead one: only attempts that
                # made no progress count towards giving up.
                attempt = 1 if hasher.size > before else attempt + 1
                if attempt >= policy.attempts:
                    raise Unavailable(
                        f"{label or url}: gave up after {attempt} attempts: {exc}",
                        hint="the partial file is kept; re-run the same command to resume",
                    ) from None
                delay = policy.delay(attempt - 1, exc.retry_after)
                log.warning(
                    "%s: %s; attempt %d of %d without progress, retrying in %.1fs from byte %d",
                    label or url, exc, attempt, policy.attempts, delay, hasher.size,
                )
                time.sleep(delay)
