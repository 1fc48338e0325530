"""How hard to try and how long to wait, for every HTTP peer: one policy, from the settings.

Only idempotent methods are retried (a PATCH that may have been applied is not sent twice).
A retry follows a dropped or refused connection, a timeout, 408/425/429 or a 5xx; it waits
what the server asked (``Retry-After``, or the Hub's ``RateLimit: "api";r=0;t=<seconds>``),
capped at :attr:`RetryPolicy.max_retry_after`, else an exponential backoff with jitter.
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import urllib3

from k3artifacts.settings import load

RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
#: Before a host ever answered, a failed first contact is retried once, this soon.
FIRST_CONTACT_RETRY_S = 0.5
#: ``t=<seconds>`` of a RateLimit header (IETF draft, as huggingface.co sends it).
_RATE_LIMIT_T = re.compile(r";\s*t\s*=\s*(\d+(?:\.\d+)?)")
_RATE_LIMIT_R = re.compile(r";\s*r\s*=\s*(\d+)")


def _setting(name: str):  # noqa: ANN202 - a field default read from the settings
    return field(default_factory=lambda: getattr(load(), name))


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try, and how long to wait, for one call or transfer.

    Fields left out are read from the settings (``K3A_HTTP_*``) when the policy is made; the
    defaults suit huggingface.co: its API answers in well under a second and its CDN
    delivers megabytes a second, so a minute without a byte or under 64 KiB/s for a minute
    means a stuck connection, worth cutting and resuming rather than waiting on."""

    attempts: int = _setting("http_attempts")
    backoff: float = _setting("http_backoff")
    max_backoff: float = 60.0
    #: The longest wait a server may ask for; a longer one is waited this long, then retried.
    max_retry_after: float = _setting("http_max_wait")
    connect_timeout: float = _setting("http_connect_timeout")
    #: No byte for this long cuts the request (headers or body): a stall.
    read_timeout: float = _setting("http_read_timeout")
    #: The headers of an answer, and the whole of a small answer, within this long in all.
    deadline: float = _setting("http_deadline")
    #: One small call, every attempt and every wait between them, within this long in all:
    #: a peer that trickles each answer to just under :attr:`deadline` is cut here, not after
    #: ``attempts`` deadlines.
    call_deadline: float = _setting("http_call_deadline")
    max_redirects: int = 5
    #: A transfer slower than this many bytes/s over ``rate_window`` seconds is a trickle.
    min_rate: float = _setting("http_min_rate")
    rate_window: float = _setting("http_rate_window")
    #: Slow windows in a row before giving up (each one is cut and resumed from its last byte).
    slow_attempts: int = 3

    def delay(self, attempt: int, server_wait: float | None) -> float:
        """Seconds before retry number ``attempt + 1``: what the server asked, capped, or the
        backoff."""
        if server_wait is not None:
            return min(server_wait, self.max_retry_after)
        return min(self.backoff * 2**attempt, self.max_backoff) * (0.5 + random.random() / 2)

    def timeout(self, *, first_contact: bool = False) -> urllib3.Timeout:
        """Connect and read timeouts of one request. A host that never answered gets the
        connect timeout for its first headers too: a silent peer is a wrong endpoint until it
        has shown otherwise."""
        read = min(self.read_timeout, self.connect_timeout) if first_contact else self.read_timeout
        return urllib3.Timeout(connect=self.connect_timeout, read=read)

    def headers_deadline(self, *, first_contact: bool = False) -> float:
        return min(self.deadline, self.connect_timeout) if first_contact else self.deadline


def retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (delta-seconds or an HTTP date), None if absent."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def rate_limit_wait(value: str | None) -> float | None:
    """Seconds until the quota of a ``RateLimit: "<policy>";r=<remaining>;t=<seconds>`` header
    resets, when it says nothing remains (or says nothing of the remaining); None otherwise."""
    if not value:
        return None
    reset = _RATE_LIMIT_T.search(value)
    if reset is None:
        return None
    remaining = _RATE_LIMIT_R.search(value)
    if remaining is not None and int(remaining.group(1)) > 0:
        return None
    return float(reset.group(1))


def server_wait(headers: Mapping[str, str]) -> float | None:
    """What a 429/5xx answer asked us to wait: the longer of ``Retry-After`` and ``RateLimit``."""
    waits = [w for w in (retry_after(headers.get("Retry-After")),
                         rate_limit_wait(headers.get("RateLimit"))) if w is not None]
    return max(waits) if waits else None
