"""Stream one file from the Hub into a partial file, hashing bytes as they arrive.

What it follows, as the official ``huggingface_hub`` client does (``file_download.py``,
``utils/_http.py``), through the network layer (:mod:`k3artifacts.net`):

- **Redirects**, each hop's headers chosen for its origin (``net.attempt.open_following``):
  huggingface.co answers ``/resolve/`` for every LFS file with a 302 to its CDN on another
  origin, and ``Authorization`` never goes there. The ``X-Repo-Commit``, ``X-Linked-Etag`` and
  ``X-Linked-Size`` of the Hub's own (first, pre-redirect) answer are checked against what the
  caller expects.
- **Resume against the final URL**: after a dropped connection the next attempt asks the CDN
  URL it was redirected to for ``Range: bytes=<received>-``; if that URL no longer answers
  (an expired signature: 401/403/410), it goes back to the Hub once for a fresh one. Across
  processes the partial file on disk is re-hashed once, then the rest is fetched.
- **429 and 5xx** are retried after what the server asked (``Retry-After``, the Hub's
  ``RateLimit``), capped, or a backoff; only attempts that reach a byte no attempt reached
  before count as progress (``net.transfer.Attempts``): a CDN that ignores ``Range`` and drops
  every connection at the same byte runs out of attempts instead of restarting for ever.
- **Several streams per file**: a file larger than one range (:class:`Ranges`) is fetched
  as ranges on several connections at once, the first from the Hub (headers checked, CDN
  URL learned) and the rest from the CDN directly; each range follows every rule here on its
  own. A partial file written so keeps a :class:`PartialRecord` of its whole prefix.
- **Time**: every request has a connect and a read timeout, and its headers a total
  deadline; a transfer that delivers no byte for ``read_timeout`` is cut and resumed. The
  rate floor (``min_rate`` bytes/s over ``rate_window`` seconds) counts bytes across
  reconnects; ``slow_attempts`` slow windows in a row end with :class:`Unavailable` (exit 8)
  naming the server that trickled.

Memory is one network chunk per stream in flight, whatever the file's size.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict
from urllib3.exceptions import HTTPError as Urllib3Error

from k3artifacts.errors import ConfigError, CredentialsRefused
from k3artifacts.net.attempt import (
    Opened,
    PermanentError,
    TransientError,
    host_of,
    open_following,
)
from k3artifacts.net.policy import RETRY_STATUS, RetryPolicy, server_wait
from k3artifacts.net.redact import redact_url
from k3artifacts.net.transfer import Attempts, Stopped
from k3artifacts.revisions.hashing import MultiHasher, feed_file, feed_range
from k3artifacts.staging.hub_refusals import credentials_refused

NET_CHUNK = 1 << 20
#: A presigned URL that expired between attempts: ask the Hub for a fresh one.
EXPIRED_STATUS = {401, 403, 410}
#: Hub headers on the ``/resolve/`` answer (huggingface_hub.constants spells them the same).
HEADER_COMMIT = "X-Repo-Commit"
HEADER_LINKED_ETAG = "X-Linked-Etag"
HEADER_LINKED_SIZE = "X-Linked-Size"

RETRY_HINT = "the partial file is kept; re-run the same command to resume"
SLOW_HINT = ("the partial file is kept; re-run later or from a better connected host, or "
             "lower the floor with --min-rate (K3A_HTTP_MIN_RATE)")
UNREACHABLE_HINT = ("check the endpoint (--endpoint / HF_ENDPOINT) and the route, DNS and "
                    "proxy to it; partial files are kept for the re-run")


class RangeIgnored(Exception):
    """The server answered a Range request with the whole body."""


def attempts(policy: RetryPolicy, name: str, url: str, start: int = 0,
             stop: threading.Event | None = None) -> Attempts:
    return Attempts(policy, name, host_of(url), start, stop, retry_hint=RETRY_HINT,
                    slow_hint=SLOW_HINT, unreachable_hint=UNREACHABLE_HINT)


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


@dataclass(frozen=True)
class Ranges:
    """How many HTTP streams one large file is fetched over, and in how big pieces.

    One connection to a CDN moves what one TCP stream over a long path can carry (tens of
    MB/s from huggingface.co's CDN to an AWS region); the file needs many at once to reach
    the link's rate, which is why the Hub's own Xet client opens up to 64. A file of more than
    one range is cut into ranges that ``streams`` threads fetch in file order, each written in
    place; the bytes are hashed, in order, as the ranges below the cursor complete."""

    streams: int = 4
    size: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.streams < 1 or self.size < 1:
            raise ConfigError(f"{self.streams} streams of {self.size}-byte ranges: a file needs "
                              "at least one stream and ranges of at least one byte")

    def split(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """``[start, end)`` as ``(first, stop)`` ranges on multiples of ``size``: the same
        boundaries whatever byte a resumed run starts from. Made one at a time: a file's
        listed size is upstream's word, and no list of its ranges is built from it."""
        first = start
        while first < end:
            stop = min(first - first % self.size + self.size, end)
            yield first, stop
            first = stop

    def applies(self, start: int, end: int) -> bool:
        return self.streams > 1 and end - start > self.size


class PartialRecord(BaseModel):
    """``<part>.json``, beside a partial file written as parallel ranges: its first ``prefix``
    bytes are whole; what lies after them may have holes and is fetched again. A partial file
    without one was written front to back, so all of it counts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    size: int
    sha256: str | None
    prefix: int


def record_path(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def kept_prefix(part: Path, size: int, expected: Expected) -> int | None:
    """Bytes of a partial file left by an earlier process that can be trusted as a prefix
    (0 when there is none); None when the file is there but no byte of it can be trusted."""
    try:
        existing = part.stat().st_size
    except FileNotFoundError:
        return 0
    sidecar = record_path(part)
    if not sidecar.exists():
        return existing if existing <= size else None
    try:
        record = PartialRecord.model_validate_json(sidecar.read_bytes())
    except (OSError, ValueError):
        return None  # ranged, and where its holes are is unknown
    if record.size != size or record.sha256 != expected.sha256:
        return None
    return min(record.prefix, existing, size)


def _kept(part: Path, size: int, expected: Expected) -> int:
    kept = kept_prefix(part, size, expected)
    if not kept:
        # Nothing to keep: no file whose size could later pass for a prefix, no stale record.
        part.unlink(missing_ok=True)
        record_path(part).unlink(missing_ok=True)
    return kept or 0


def _content_range_start(value: str | None, size: int, host: str) -> int | None:
    """The first byte of a 206's ``Content-Range: bytes a-b/total``; refuses a total that
    contradicts the listed size."""
    if not value or not value.startswith("bytes "):
        return None
    span, _, total = value[6:].partition("/")
    if total.strip() not in ("*", str(size)):
        raise PermanentError(f"{host} says the file has {total.strip()} bytes, the listing {size}")
    first = span.partition("-")[0].strip()
    return int(first) if first.isdigit() else None


class _Transfer:
    """One file's download across attempts and threads: the URL its bytes come from.

    The first answer of a file comes from the Hub (its headers are checked against the
    listing); the CDN URL it redirects to is kept and asked directly for every later range
    or resume, until it stops answering (an expired signature) and the Hub gives a fresh one."""

    def __init__(self, url: str, headers: Mapping[str, str], size: int, expected: Expected,
                 policy: RetryPolicy):
        self.hub_url = url
        self.headers = headers
        self.size = size
        self.expected = expected
        self.policy = policy
        #: Where the bytes came from last time (the CDN, after the Hub's redirect).
        self.resume_url: str | None = None

    def open(self, first: int, stop: int) -> Opened:
        """An answer whose body is bytes ``[first, stop)`` of the file (or raise)."""
        req = dict(self.headers)
        if stop < self.size:
            req["Range"] = f"bytes={first}-{stop - 1}"
        elif first:
            req["Range"] = f"bytes={first}-"
        start = self.resume_url or self.hub_url
        opened = open_following(start, req, self.policy, auth_origin=self.hub_url)
        resp, host = opened.response, host_of(opened.url)
        try:
            if start == self.hub_url:
                check_hub_headers(opened.first_headers, self.size, self.expected)
            if opened.url == self.hub_url and (refused := self._refused(resp)) is not None:
                raise refused
            if resp.status in RETRY_STATUS:
                raise TransientError(f"HTTP {resp.status} from {host}",
                                     server_wait(resp.headers), answered=True, host=host)
            if self.resume_url is not None and resp.status in EXPIRED_STATUS:
                self.resume_url = None
                raise TransientError(f"HTTP {resp.status} from {host} on resume", 0.0,
                                     stale_url=True, answered=True, host=host)
            if "Range" in req and resp.status == 200:
                # The server ignored Range: start over rather than append a second copy.
                raise RangeIgnored()
            if resp.status not in (200, 206):
                raise PermanentError(f"HTTP {resp.status} from {host}")
            if resp.status == 206:
                served = _content_range_start(resp.headers.get("Content-Range"), self.size, host)
                if served is not None and served != first:
                    raise PermanentError(f"{host} answered a range from byte {served} when "
                                         f"asked for byte {first}")
        except BaseException:
            # An unread or broken body must not go back to the pool for the next request.
            resp.close()
            resp.release_conn()
            raise
        if start == self.hub_url:
            # Only a fresh answer from the Hub sets the URL: an answer from the kept URL that
            # was asked before another stream found it expired must not bring it back.
            self.resume_url = opened.url if opened.url != self.hub_url else None
        return opened

    def _refused(self, resp: Any) -> CredentialsRefused | None:
        """The Hub's own 401/403 for this file: its credential error, named."""
        page, _, rest = redact_url(self.hub_url).partition("/resolve/")
        commit, _, path = rest.partition("/")
        repo_id = "/".join(page.rsplit("/", 2)[-2:])
        headers = {k.lower(): v for k, v in resp.headers.items()}
        return credentials_refused(f"{repo_id}@{commit}: {unquote(path)}", resp.status,
                                   headers, page)

    def body(self, opened: Opened, first: int, stop: int, sink: Callable[[bytes], None],
             tries: Attempts, halt: threading.Event | None = None) -> None:
        """Pass the answer's bytes ``[first, stop)`` to ``sink`` in order; always releases
        the answer. A stall or trickle (``tries``' rate meter, which spans attempts) is a
        :class:`TransientError` from the byte reached."""
        resp, host = opened.response, host_of(opened.url)
        position = first
        try:
            while position < stop:
                if halt is not None and halt.is_set():
                    raise Stopped()
                try:
                    # read1 returns what has arrived instead of waiting for a full chunk, so a
                    # dropped connection loses no byte already received: resume starts there.
                    data = resp.read1(min(NET_CHUNK, stop - position))
                except Urllib3Error as exc:
                    raise TransientError(f"connection to {host} lost at byte {position}: {exc}",
                                         host=host) from None
                if not data:
                    raise TransientError(f"body from {host} ended at byte {position} of "
                                         f"{self.size}", host=host)
                sink(data)
                position += len(data)
                tries.meter.add(len(data))
                if position < stop and (verdict := tries.meter.judge(host)) is not None:
                    raise TransientError(verdict, slow=True, host=host)
            if stop == self.size and resp.read(1):
                raise PermanentError(f"{host} sent more than the listed {self.size} bytes")
        except BaseException:
            resp.close()
            raise
        finally:
            resp.release_conn()


#: Seconds between records of a ranged file's whole prefix (and the sync each one needs).
RECORD_INTERVAL = 1.0


class _RangedFetch:
    """One file as several ranges in flight, written in place, hashed in order.

    The first range is opened on the caller's thread, so the Hub is asked once (its headers
    checked, its CDN URL learned) before the other streams go to the CDN directly. Whichever
    thread completes the range at the hash cursor hashes it and any completed ranges after it,
    straight from the page cache. The whole prefix that has landed is what the store's
    streamed upload may read, reported before the cursor hashes it; the cursor is what
    :class:`PartialRecord` keeps for a re-run."""

    def __init__(self, transfer: _Transfer, fd: int, hasher: MultiHasher, ranges: Ranges, *,
                 part: Path, name: str, durable: bool,
                 on_bytes: Callable[[int], None] | None,
                 on_prefix: Callable[[int], None] | None):
        self.transfer = transfer
        self.fd = fd
        self.hasher = hasher
        self.streams = ranges.streams
        self.ranges = ranges
        self.pending = ranges.split(hasher.size, transfer.size)
        self.part = part
        self.name = name
        self.durable = durable
        self.on_bytes = on_bytes
        self.on_prefix = on_prefix
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.landed: dict[int, int] = {}
        self.hashing = False
        self.offered = hasher.size  # the prefix last offered to on_prefix
        self.errors: list[BaseException] = []
        self.recorded_at = 0.0

    def run(self) -> None:
        self._record()  # before any byte lands past the prefix
        first, stop = next(self.pending)
        tries = self._tries(first)
        opened = None
        try:
            while opened is None:
                try:
                    opened = self.transfer.open(first, stop)
                except TransientError as exc:
                    tries.failed(exc, first)
            left = -(-(self.transfer.size - stop) // self.ranges.size)
            helpers = [threading.Thread(target=self._guarded, args=(self._work,),
                                        name="k3a-range", daemon=True)
                       for _ in range(min(self.streams - 1, left))]
            for thread in helpers:
                thread.start()
            self._guarded(self._range, first, stop, opened, tries)
            self._guarded(self._work)
            for thread in helpers:
                thread.join()
        finally:
            self._record(force=True)
        if self.errors:
            kinds = (RangeIgnored, PermanentError)
            raise next((e for e in self.errors if isinstance(e, kinds)), self.errors[0])

    def _guarded(self, work: Callable[..., None], *args: object) -> None:
        try:
            work(*args)
        except Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - run() raises it on the caller's thread
            with self.lock:
                self.errors.append(exc)
            self.halt.set()

    def _tries(self, first: int) -> Attempts:
        return attempts(self.transfer.policy, self.name, self.transfer.hub_url, first, self.halt)

    def _work(self) -> None:
        while not self.halt.is_set():
            with self.lock:
                span = next(self.pending, None)
            if span is None:
                return
            self._range(*span, None, self._tries(span[0]))

    def _range(self, first: int, stop: int, opened: Opened | None, tries: Attempts) -> None:
        position = first

        def sink(data: bytes) -> None:
            nonlocal position
            view, done = memoryview(data), 0
            while done < len(view):
                done += os.pwrite(self.fd, view[done:], position + done)
            position += done
            if self.on_bytes is not None:
                self.on_bytes(done)

        while position < stop:
            try:
                if opened is None:
                    opened = self.transfer.open(position, stop)
                self.transfer.body(opened, position, stop, sink, tries, self.halt)
            except TransientError as exc:
                tries.failed(exc, position)
            finally:
                opened = None
        self._landed(first, stop)

    def _landed(self, first: int, stop: int) -> None:
        with self.lock:
            self.landed[first] = stop
            if self.hashing:
                return  # the thread at the cursor picks this range up
            self.hashing = True
        while True:
            with self.lock:
                start = self.hasher.size
                stop = self.landed.pop(start, -1)
                if stop < 0:
                    self.hashing = False
                    return
                reach = stop
                while reach in self.landed:
                    reach = self.landed[reach]
            # The upload follows what has landed, not what is hashed: on one large file the
            # cursor's sha256 is the slowest stage, and the upload is completed only once the
            # file is verified and its parts' CRCs combine to the verified bytes' CRC.
            if self.on_prefix is not None and reach > self.offered:
                self.offered = reach
                self.on_prefix(reach)
            feed_range(self.hasher, self.fd, start, stop)
            self._record()

    def _record(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.recorded_at < RECORD_INTERVAL:
            return
        self.recorded_at = now
        if self.durable:
            os.fdatasync(self.fd)  # the record never claims bytes a power loss takes back
        record = PartialRecord(size=self.transfer.size, sha256=self.transfer.expected.sha256,
                               prefix=self.hasher.size)
        sidecar = record_path(self.part)
        staging = sidecar.with_name(sidecar.name + ".new")
        staging.write_text(record.model_dump_json())
        os.replace(staging, sidecar)


def fetch(
    url: str,
    headers: dict[str, str],
    part: Path,
    size: int,
    hasher_factory: Callable[[], MultiHasher],
    *,
    policy: RetryPolicy | None = None,
    ranges: Ranges = Ranges(),
    on_bytes: Callable[[int], None] | None = None,
    on_prefix: Callable[[int], None] | None = None,
    on_resumed: Callable[[int], None] | None = None,
    label: str = "",
    durable: bool = True,
    expected: Expected = Expected(),
) -> MultiHasher:
    """Complete ``part`` to ``size`` bytes from ``url``; return the hasher over the whole file.

    ``on_bytes`` sees bytes received from the network (from any thread), ``on_prefix`` the
    length of the whole prefix on disk each time it grows, ``on_resumed`` bytes re-read from a
    partial file left by an earlier process. A file of more than one range is fetched over
    ``ranges.streams`` connections. Raises :class:`Unavailable` when attempts that make no
    progress (or trickles) are exhausted and :class:`PermanentError` when the server's answer
    cannot become right by retrying. ``policy`` defaults to the settings' (``K3A_HTTP_*``).
    ``durable=False`` skips the fsync (the caller makes the bytes durable some other way, or
    re-checks them after a crash).
    """
    hasher = hasher_factory()
    kept = _kept(part, size, expected)
    if kept:
        # Cross-process resume: the old process's hash state is gone; rebuild it from the
        # bytes already on disk (read once), then fetch only the rest.
        feed_file(hasher, part, limit=kept, on_bytes=on_resumed)
    transfer = _Transfer(url, headers, size, expected, policy or RetryPolicy())
    name = label or redact_url(url)
    # Readable too: the hash cursor maps what the streams wrote.
    with open(part, "r+b" if part.exists() else "w+b") as fh:
        if ranges.applies(hasher.size, size):
            try:
                _RangedFetch(transfer, fh.fileno(), hasher, ranges, part=part, name=name,
                             durable=durable, on_bytes=on_bytes, on_prefix=on_prefix).run()
            except RangeIgnored:
                record_path(part).unlink(missing_ok=True)
                hasher = hasher_factory()
        hasher = _single(transfer, fh, hasher, hasher_factory, name, on_bytes, on_prefix)
        fh.flush()
        if durable:
            os.fsync(fh.fileno())
    record_path(part).unlink(missing_ok=True)
    return hasher


def _single(transfer: _Transfer, fh, hasher: MultiHasher,
            hasher_factory: Callable[[], MultiHasher], name: str,
            on_bytes: Callable[[int], None] | None,
            on_prefix: Callable[[int], None] | None) -> MultiHasher:
    """The rest of the file over one stream, front to back (a no-op once it is whole)."""
    tries = attempts(transfer.policy, name, transfer.hub_url, hasher.size)

    def sink(data: bytes) -> None:
        fh.write(data)
        hasher.update(data)
        if on_bytes is not None:
            on_bytes(len(data))
        if on_prefix is not None:
            on_prefix(hasher.size)

    while hasher.size < transfer.size:
        fh.seek(hasher.size)
        fh.truncate()
        before = hasher.size
        try:
            transfer.body(transfer.open(before, transfer.size), before, transfer.size, sink,
                          tries)
        except RangeIgnored:
            hasher = hasher_factory()  # the sink hashes into the new one from byte 0
        except TransientError as exc:
            tries.failed(exc, hasher.size)
    return hasher
