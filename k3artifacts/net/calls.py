"""A small call with the whole policy: the Hub's API, a registry, Prometheus, the Kubernetes
API, a vLLM ``/metrics`` page.

The answer's headers and its whole body arrive within the policy's deadline, at most
``limit`` bytes, and the call, retries and the waits between them included, within its
``call_deadline``. An idempotent call is retried after a failed connection, a timeout, 408/425/
429 or a 5xx, waiting what the server asked (capped) or a backoff, each retry logged with the
peer named; a host that never answered gets one quick second chance. What is left is an
:class:`~k3artifacts.errors.Unavailable` (exit 8) naming the peer by its redacted URL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

import urllib3

from k3artifacts.errors import BadAnswer, Unavailable
from k3artifacts.net import deadline
from k3artifacts.net.attempt import (
    PermanentError,
    TransientError,
    host_of,
    open_following,
    read_body,
)
from k3artifacts.net.policy import (
    FIRST_CONTACT_RETRY_S,
    IDEMPOTENT,
    RETRY_STATUS,
    RetryPolicy,
    server_wait,
)
from k3artifacts.net.redact import redact_text

log = logging.getLogger(__name__)
#: Largest small answer read by default (a Hub tree page of 1000 entries is ~300 KB).
MAX_ANSWER = 32 << 20


@dataclass(frozen=True)
class Peer:
    """Who is called, as messages name it (``Prometheus at http://...``), and what to do when
    it fails: ``hint`` once it answered, ``unreachable`` while it never has."""

    name: str
    hint: str
    unreachable: str | None = None


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes
    #: Where the answer came from, after redirects.
    url: str


def call(method: str, url: str, peer: Peer, *, headers: Mapping[str, str] | None = None,
         body: bytes | None = None, policy: RetryPolicy | None = None,
         pool: urllib3.PoolManager | None = None, auth_origin: str | None = None,
         limit: int = MAX_ANSWER, idempotent: bool | None = None) -> Answer:
    """``method url`` until it answers with a status no retry would change; that answer.

    Only idempotent calls are retried: those of an idempotent method, or those the caller
    vouches for (``idempotent=True``: a Kubernetes apply patch gives the same object twice).
    Raises :class:`Unavailable` when the peer cannot be reached or keeps failing, and
    :class:`BadAnswer` for an answer no retry changes (too large, a redirect loop)."""
    policy = policy or RetryPolicy()
    retryable = method.upper() in IDEMPOTENT if idempotent is None else idempotent
    with deadline.within(policy.call_deadline):
        return _until_answered(method, url, peer, headers or {}, body, policy, pool,
                               auth_origin or url, limit, retryable)


def _until_answered(method: str, url: str, peer: Peer, headers: Mapping[str, str],
                    body: bytes | None, policy: RetryPolicy, pool: urllib3.PoolManager | None,
                    auth_origin: str, limit: int, retryable: bool) -> Answer:
    attempt = first_tries = 0
    while True:
        try:
            return _once(method, url, headers, body, policy, pool, auth_origin, limit,
                         retryable)
        except PermanentError as exc:
            raise BadAnswer(f"{peer.name}: {redact_text(str(exc))}", hint=peer.hint) from None
        except TransientError as exc:
            detail = redact_text(str(exc))
            if exc.first_contact:
                first_tries += 1
                if first_tries >= 2 or not retryable:
                    raise Unavailable(f"{peer.name} unavailable (first contact): {detail}",
                                      hint=peer.unreachable or peer.hint) from None
                delay, attempts = FIRST_CONTACT_RETRY_S, first_tries
            else:
                attempt += 1
                if not retryable or attempt >= policy.attempts:
                    tries = f" (after {attempt} attempts)" if attempt > 1 else ""
                    raise Unavailable(f"{peer.name} unavailable: {detail}{tries}",
                                      hint=peer.hint) from None
                delay, attempts = policy.delay(attempt - 1, exc.wait), attempt
            left = deadline.left()
            if left is not None and left <= delay:
                raise Unavailable(
                    f"{peer.name} unavailable: {detail}; no answer within "
                    f"{policy.call_deadline:g} s in all (after {attempts} attempt"
                    f"{'s' if attempts > 1 else ''}), the call's deadline",
                    hint=peer.hint) from None
            if not exc.first_contact:
                log.warning("%s: %s; attempt %d of %d, retrying in %.1fs",
                            peer.name, detail, attempt, policy.attempts, delay)
            time.sleep(delay)


def _once(method: str, url: str, headers: Mapping[str, str], body: bytes | None,
          policy: RetryPolicy, pool: urllib3.PoolManager | None, auth_origin: str, limit: int,
          retryable: bool) -> Answer:
    with deadline.within(policy.deadline):
        opened = open_following(url, headers, policy, auth_origin=auth_origin, method=method,
                                body=body, pool=pool)
        resp = opened.response
        host = host_of(opened.url)
        data = read_body(resp, limit, host)  # a HEAD answer's is empty
    if retryable and resp.status in RETRY_STATUS:
        raise TransientError(f"HTTP {resp.status} from {host}", server_wait(resp.headers),
                             answered=True, host=host)
    return Answer(resp.status, resp.headers, data, opened.url)
