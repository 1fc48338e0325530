"""A long transfer across its attempts: when to give up, and whether it is too slow.

Two rules no single connection can judge, so they live here, across attempts and
reconnects:

- **new bytes**: only an attempt that reaches a byte no earlier attempt reached counts as
  progress. A server that drops every connection after the same 256 KiB, and ignores ``Range``
  so each attempt starts again from byte 0, makes no progress and runs out of attempts.
- **the rate floor** counts every byte over wall-clock windows that span reconnects: a peer
  that sends 64 bytes per connection is as slow as one that sends 64 bytes a second. Each
  window below the floor is a slow verdict (the connection in flight is cut and resumed); a
  window at the floor clears them; ``slow_attempts`` verdicts in a row end the transfer. A
  wait the server asked for (``Retry-After``) starts a new window: it is not a trickle.
"""

from __future__ import annotations

import logging
import threading
import time

from k3artifacts.errors import Unavailable
from k3artifacts.net.attempt import TransientError
from k3artifacts.net.policy import FIRST_CONTACT_RETRY_S, RetryPolicy

log = logging.getLogger(__name__)


class Stopped(Exception):
    """Another stream of the same file failed: this one stops where it is."""


class RateMeter:
    """Bytes per second of one transfer, over windows of ``policy.rate_window`` seconds."""

    def __init__(self, policy: RetryPolicy):
        self.min_rate = policy.min_rate
        self.window = policy.rate_window
        self.slow = 0
        self.restart()

    def restart(self) -> None:
        self.started = time.monotonic()
        self.bytes = 0

    def add(self, nbytes: int) -> None:
        self.bytes += nbytes

    def judge(self, host: str) -> str | None:
        """At the end of a window, its verdict: why it was too slow, or None (also while the
        window is still open)."""
        elapsed = time.monotonic() - self.started
        if elapsed < self.window:
            return None
        rate = self.bytes / elapsed
        self.restart()
        if rate >= self.min_rate:
            self.slow = 0
            return None
        self.slow += 1
        return (f"{host} sent {rate:.0f} B/s over {elapsed:.1f}s, below the floor of "
                f"{self.min_rate:.0f} B/s")


class Attempts:
    """When one stream of bytes (a whole file, or one range of it) gives up.

    ``name`` is what messages call it (a file's path), ``origin`` the host it is fetched from
    first, ``start`` the byte it starts from, ``stop`` set when a sibling stream failed (the
    wait then ends early)."""

    def __init__(self, policy: RetryPolicy, name: str, origin: str, start: int = 0,
                 stop: threading.Event | None = None, *, retry_hint: str, slow_hint: str,
                 unreachable_hint: str):
        self.policy = policy
        self.name = name
        self.origin = origin
        self.stop = stop
        self.meter = RateMeter(policy)
        self.retry_hint = retry_hint
        self.slow_hint = slow_hint
        self.unreachable_hint = unreachable_hint
        #: The furthest byte any attempt reached.
        self.reached = start
        self.attempt = 0
        self.first_tries = 0

    def failed(self, exc: TransientError, position: int) -> None:
        """An attempt ended at byte ``position``: wait before the next, or raise
        :class:`Unavailable`."""
        policy, name = self.policy, self.name
        if exc.first_contact:
            self.first_tries += 1
            if self.first_tries >= 2:
                raise Unavailable(f"{name}: cannot reach {exc.host or self.origin} (it never "
                                  f"answered): {exc}", hint=self.unreachable_hint) from None
            self._sleep(FIRST_CONTACT_RETRY_S)
            return
        # Time spent failing and reconnecting counts against the floor too.
        verdict = str(exc) if exc.slow else self.meter.judge(exc.host or self.origin)
        if self.meter.slow >= policy.slow_attempts:
            raise Unavailable(
                f"{name}: {exc.host or self.origin} too slow, {self.meter.slow} windows of "
                f"{policy.rate_window:g}s in a row: {verdict}", hint=self.slow_hint) from None
        progressed = position > self.reached
        self.reached = max(self.reached, position)
        self.attempt = 1 if progressed else self.attempt + 1
        if self.attempt >= policy.attempts:
            raise Unavailable(
                f"{name}: gave up after {self.attempt} attempts without a new byte: {exc}",
                hint=self.retry_hint) from None
        delay = policy.delay(self.attempt - 1, exc.wait)
        log.warning("%s: %s; attempt %d of %d without a new byte, retrying in %.1fs from "
                    "byte %d", name, exc, self.attempt, policy.attempts, delay, position)
        self._sleep(delay)
        if exc.wait is not None:
            self.meter.restart()

    def _sleep(self, seconds: float) -> None:
        if self.stop is None:
            time.sleep(seconds)
        elif self.stop.wait(seconds):
            raise Stopped()
