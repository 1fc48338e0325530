"""A large file fetched as several ranges at once from the Hub's CDN: the Hub is asked once,
every range obeys the single stream's rules on its own (resume from the byte reached, a fresh
CDN URL when it expires, a server that ignores Range), and a killed run resumes from the
whole prefix it recorded, never from bytes after a hole."""

from __future__ import annotations

import json
import time
from itertools import pairwise

import pytest

from k3artifacts.errors import Unavailable
from k3artifacts.net.policy import RetryPolicy
from k3artifacts.staging.download import PartialRecord, Ranges, record_path
from k3artifacts.staging.engine import StageObserver, StageOptions, stage
from k3artifacts.staging.hub import HubSource
from k3artifacts.stores.verify import verify_revision
from tests.faults.faultkit import (
    SHARD1,
    assert_nothing_published,
    file_gets,
    quarantine_of,
    serving,
)
from tests.staging_helpers import REPO, small_release
from tests.support.hubfaults import Fault

pytestmark = pytest.mark.faults

#: 64 KiB ranges: each 256 KiB shard of the small release is five of them.
RANGE = 64 << 10


@pytest.fixture
def release(local_hub, tmp_path):
    return local_hub.hub.add_commit(REPO, small_release(tmp_path))


def ranged(endpoint, store, quarantine, observer=None, *, streams=4, **retry):
    policy = RetryPolicy(**{"attempts": 3, "backoff": 0.01, "max_backoff": 0.05, **retry})
    return stage(HubSource(endpoint, token=False, retry=policy), store, REPO, "main",
                 quarantine, StageOptions(retry=policy, ranges=Ranges(streams, RANGE)),
                 observer)


def expected_ranges(size: int, start: int = 0) -> list[str]:
    cuts = [start, *range(start - start % RANGE + RANGE, size, RANGE), size]
    return [f"bytes={a}-{b - 1}" if b < size else f"bytes={a}-" for a, b in pairwise(cuts)]


def shard_size(hub, commit) -> int:
    return hub.files(REPO, commit)[SHARD1].size


def published(store, commit) -> bool:
    return verify_revision(store=store, repo_id=REPO, commit=commit, full=True).ok


def test_a_large_file_comes_as_ranges_on_several_streams_the_hub_asked_once(
        local_hub, file_store, tmp_path, release):
    hub = local_hub.hub
    # Four stalls of 2 s before the headers: one stream would wait 8 s, four wait 2.
    hub.faults.add(SHARD1, Fault.stall(2.0, times=4))
    started = time.monotonic()
    ranged(local_hub.endpoint, file_store, tmp_path / "q", read_timeout=10)
    assert time.monotonic() - started < 6
    size = shard_size(hub, release)
    gets = file_gets(hub, path=SHARD1)
    assert sorted(g.range for g in gets) == sorted(expected_ranges(size))
    assert {(g.origin, g.status) for g in gets} == {("cdn", 206)}
    assert sum(g.bytes_sent for g in gets) == size
    assert len([r for r in hub.requests if r.origin == "hub" and r.target == SHARD1]) == 1
    assert published(file_store, release)
    assert not record_path(quarantine_of(tmp_path / "q", release).part_path(SHARD1)).exists()


def test_a_dropped_range_resumes_from_the_byte_it_reached(local_hub, file_store, tmp_path,
                                                          release):
    local_hub.hub.faults.add(SHARD1, Fault.drop(after_bytes=10_000))
    ranged(local_hub.endpoint, file_store, tmp_path / "q")
    gets = [g.range for g in file_gets(local_hub.hub, path=SHARD1)]
    assert f"bytes=10000-{RANGE - 1}" in gets
    assert published(file_store, release)


def test_a_range_whose_cdn_link_expired_gets_a_fresh_one_from_the_hub(local_hub, file_store,
                                                                      tmp_path, release):
    hub = local_hub.hub

    class LinkExpiresAfterFirstBytes(StageObserver):
        armed = False

        def advance(self, path: str, nbytes: int) -> None:
            if path == SHARD1 and not self.armed:
                self.armed = True  # the next CDN answer for it is an expired signature
                hub.faults.add(SHARD1, Fault.http_status(403, times=1))

    ranged(local_hub.endpoint, file_store, tmp_path / "q", LinkExpiresAfterFirstBytes(),
           streams=2)
    assert [g.status for g in file_gets(hub, path=SHARD1)].count(403) == 1
    # Asked again after the 403; the other stream may have asked too before a new link came.
    assert 2 <= len([r for r in hub.requests if r.origin == "hub" and r.target == SHARD1]) <= 3
    assert published(file_store, release)


def test_a_server_that_ignores_range_gets_one_stream_from_byte_zero(local_hub, file_store,
                                                                     tmp_path, release):
    local_hub.hub.faults.add(SHARD1, Fault.whole(times=None))
    ranged(local_hub.endpoint, file_store, tmp_path / "q")
    gets = [(g.status, g.range) for g in file_gets(local_hub.hub, path=SHARD1)]
    assert gets == [(200, f"bytes=0-{RANGE - 1}"), (200, None)]
    assert published(file_store, release)


def test_a_killed_ranged_download_resumes_from_its_recorded_prefix(local_hub, file_store,
                                                                   tmp_path, release):
    hub, quarantine = local_hub.hub, tmp_path / "q"
    size = shard_size(hub, release)

    class HubDiesMidFile(StageObserver):
        seen = 0

        def advance(self, path: str, nbytes: int) -> None:
            # Ranges already answered finish; every range asked for after this fails.
            if path == SHARD1 and self.seen < RANGE <= self.seen + nbytes:
                hub.faults.add(SHARD1, Fault.http_status(503, times=None))
            if path == SHARD1:
                self.seen += nbytes

    with pytest.raises(Unavailable) as err:
        ranged(local_hub.endpoint, file_store, quarantine, HubDiesMidFile(), streams=2,
               attempts=2)
    assert err.value.exit_code == 8 and "re-run" in err.value.hint
    assert_nothing_published(file_store)
    part = quarantine_of(quarantine, release).part_path(SHARD1)
    record = PartialRecord.model_validate_json(record_path(part).read_bytes())
    # The first range was answered before the hub died and finished; later ones may have.
    assert record.size == size and RANGE <= record.prefix < size and record.prefix % RANGE == 0

    hub.faults.clear()
    mark = len(hub.requests)
    ranged(local_hub.endpoint, file_store, quarantine)
    assert sorted(g.range for g in file_gets(hub, mark, SHARD1)) == \
        sorted(expected_ranges(size, record.prefix))
    assert published(file_store, release)


@pytest.mark.parametrize("sidecar", [b"{not json", json.dumps(
    {"size": 1, "sha256": None, "prefix": 1}).encode()])
def test_a_partial_file_whose_record_does_not_fit_is_fetched_again_whole(
        local_hub, file_store, tmp_path, release, sidecar):
    """A damaged or foreign record says nothing about where the holes of a ranged partial
    file are: none of its bytes are trusted."""
    quarantine = tmp_path / "q"
    part = quarantine_of(quarantine, release).part_path(SHARD1)
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * (3 * RANGE))
    record_path(part).write_bytes(sidecar)
    ranged(local_hub.endpoint, file_store, quarantine)
    size = shard_size(local_hub.hub, release)
    assert sorted(g.range for g in file_gets(local_hub.hub, path=SHARD1)) == \
        sorted(expected_ranges(size))
    assert published(file_store, release)


@pytest.mark.parametrize("lie,message", [
    # Whichever stream asks first for a later range is refused: its start is not known.
    ("start", r"answered a range from byte 0 when asked for byte (65536|131072|196608)$"),
    ("total", "says the file has 999 bytes, the listing 262144"),
])
def test_a_range_answer_that_contradicts_the_request_is_refused(tmp_path, lie, message):
    """A server (or a cache in front of it) that answers another range than the one asked
    for, or another file size than listed, is named: its bytes would land at the wrong place."""
    import http.server

    from k3artifacts.revisions.hashing import MultiHasher
    from k3artifacts.staging.download import PermanentError, fetch

    size, body = 4 * RANGE, bytes(4 * RANGE)

    class Liar(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the base class's name
            first, _, last = self.headers["Range"][6:].partition("-")
            first, last = int(first), int(last or size - 1)
            served = 0 if lie == "start" else first
            total = 999 if lie == "total" else size
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {served}-{served + last - first}/{total}")
            self.send_header("Content-Length", str(last - first + 1))
            self.end_headers()
            self.wfile.write(body[served:served + last - first + 1])

        def log_message(self, *args):
            pass

    with serving(Liar) as base:
        with pytest.raises(PermanentError, match=message):
            fetch(f"{base}/f", {}, tmp_path / "f.part", size, MultiHasher,
                  policy=RetryPolicy(attempts=2, backoff=0.01), ranges=Ranges(2, RANGE))
