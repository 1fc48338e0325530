"""Network faults injected by the local hub: dropped, refused, stalled, short and changed
answers. Retried where retrying is right, resumed from the partial file, refused with the file
named where the bytes are wrong; never published unverified."""

from __future__ import annotations

import time

import pytest

from k3artifacts.errors import ReleaseRefused, Unavailable
from k3artifacts.net.policy import RetryPolicy
from k3artifacts.staging.engine import StageObserver, StageOptions, stage
from k3artifacts.staging.hub import HubSource
from k3artifacts.stores.verify import verify_revision
from tests.faults.faultkit import (
    SHARD1,
    SHARD2,
    assert_nothing_published,
    file_gets,
    quarantine_of,
    serving,
)
from tests.staging_helpers import REPO, run_stage, small_release
from tests.support.cli import run_process
from tests.support.hubfaults import Fault

pytestmark = pytest.mark.faults

CUT = 100_000


@pytest.fixture
def release(local_hub, tmp_path):
    return local_hub.hub.add_commit(REPO, small_release(tmp_path))


@pytest.fixture
def quarantine(tmp_path):
    return tmp_path / "quarantine"


def published(store, commit):
    assert verify_revision(store=store, repo_id=REPO, commit=commit, full=True).ok
    return True


def refusal(err: ReleaseRefused, path: str):
    found = [r for r in err.refusals if r.path == path]
    assert found, f"{path} is not named in: {err}"
    return found[0]


def test_dropped_connection_resumes_from_received_bytes(local_hub, file_store, quarantine, release):
    local_hub.hub.faults.add(SHARD1, Fault.drop(after_bytes=CUT))
    run_stage(local_hub.endpoint, file_store, quarantine)
    assert [g.range for g in file_gets(local_hub.hub, path=SHARD1)] == [None, f"bytes={CUT}-"]
    assert published(file_store, release)


def test_short_body_with_full_content_length_resumes(local_hub, file_store, quarantine, release):
    size = local_hub.hub.files(REPO)[SHARD1].size
    local_hub.hub.faults.add(SHARD1, Fault.short(missing=10))
    run_stage(local_hub.endpoint, file_store, quarantine)
    assert [g.range for g in file_gets(local_hub.hub, path=SHARD1)] == [None, f"bytes={size - 10}-"]
    assert published(file_store, release)


def test_stall_past_read_timeout_is_retried_and_resumed(local_hub, file_store, quarantine, release):
    local_hub.hub.faults.add(SHARD1, Fault.stall(5, after_bytes=CUT))
    run_stage(local_hub.endpoint, file_store, quarantine,
              retry=RetryPolicy(attempts=3, backoff=0.01, read_timeout=0.5))
    # The log lists requests as they complete: the stalled one is still sleeping on the hub.
    assert [g.range for g in file_gets(local_hub.hub, path=SHARD1)] == [f"bytes={CUT}-"]
    assert published(file_store, release)


@pytest.mark.parametrize("status", [500, 503, 429])
def test_server_errors_on_file_are_retried(local_hub, file_store, quarantine, release, status):
    local_hub.hub.faults.add(SHARD1, Fault.http_status(status, retry_after=0, times=2))
    run_stage(local_hub.endpoint, file_store, quarantine)
    assert [g.status for g in file_gets(local_hub.hub, path=SHARD1)] == [status, status, 200]
    assert published(file_store, release)


@pytest.mark.parametrize("status", [500, 503, 429])
def test_server_errors_on_revision_lookup_are_retried(local_hub, file_store, quarantine, release,
                                                      status):
    local_hub.hub.faults.add("/api/models/*", Fault.http_status(status, retry_after=0))
    result = run_stage(local_hub.endpoint, file_store, quarantine)
    assert result.commit == release
    assert [r.status for r in local_hub.hub.requests][:2] == [status, 200]


def test_retries_exhausted_keeps_partial_and_says_rerun(local_hub, file_store, quarantine, release):
    """The link drops after CUT bytes, then the hub answers 503 for good. Attempts that move
    bytes do not count towards giving up; the ones that move none do."""
    hub = local_hub.hub
    hub.faults.add(SHARD1, Fault.drop(after_bytes=CUT))

    class HubDiesAfterFirstBytes(StageObserver):
        armed = False

        def advance(self, path: str, nbytes: int) -> None:
            if path == SHARD1 and not self.armed:
                self.armed = True  # the first response is already being served: later ones fail
                hub.faults.add(SHARD1, Fault.http_status(503, times=None))

    retry = RetryPolicy(attempts=3, backoff=0.01)
    with pytest.raises(Unavailable) as err:
        stage(HubSource(local_hub.endpoint, token=False, retry=retry), file_store, REPO, "main",
              quarantine, StageOptions(retry=retry), HubDiesAfterFirstBytes())
    assert f"{SHARD1}: gave up after 3 attempts without a new byte: HTTP 503" in str(err.value)
    assert "re-run the same command to resume" in err.value.hint
    assert [g.status for g in file_gets(hub, path=SHARD1)] == [200, 503, 503]
    assert_nothing_published(file_store)
    # Every byte received is kept for the re-run, which asks only for the rest.
    assert quarantine_of(quarantine, release).part_path(SHARD1).stat().st_size == CUT
    hub.faults.clear()
    mark = len(hub.requests)
    run_stage(local_hub.endpoint, file_store, quarantine)
    assert [g.range for g in file_gets(hub, mark, SHARD1)] == [f"bytes={CUT}-"]
    assert published(file_store, release)


@pytest.mark.parametrize(
    "fault,rule",
    [
        # Attempt 1 serves the listed bytes and drops; the resumed tail is other bytes.
        (Fault.mutate(good_first=True), "sha256"),
        # Attempt 1 serves other bytes and drops; the resumed tail is the listed bytes.
        (Fault.mutate(good_first=False), "sha256"),
        (Fault.corrupt(offset=CUT + 7), "sha256"),
    ],
    ids=["changed-after-first-attempt", "changed-before-resume", "flipped-byte"],
)
def test_changed_bytes_are_refused_and_not_resumed(local_hub, file_store, quarantine, release,
                                                   fault, rule):
    local_hub.hub.faults.add(SHARD1, fault)
    local_hub.hub.faults.add(SHARD1, Fault.drop(after_bytes=CUT))
    with pytest.raises(ReleaseRefused) as err:
        run_stage(local_hub.endpoint, file_store, quarantine)
    found = refusal(err.value, SHARD1)
    assert found.rule == rule and "upstream LFS sha256" in found.detail
    assert_nothing_published(file_store)
    # Wrong bytes are not resumed from: the next run starts the file from byte 0.
    assert not quarantine_of(quarantine, release).part_path(SHARD1).exists()
    local_hub.hub.faults.clear()
    mark = len(local_hub.hub.requests)
    run_stage(local_hub.endpoint, file_store, quarantine)
    assert [g.range for g in file_gets(local_hub.hub, mark, SHARD1)] == [None]
    assert published(file_store, release)


def test_small_file_with_wrong_bytes_is_refused_by_git_oid(local_hub, file_store, quarantine,
                                                          release):
    local_hub.hub.faults.add("config.json", Fault.corrupt(offset=3))
    with pytest.raises(ReleaseRefused) as err:
        run_stage(local_hub.endpoint, file_store, quarantine)
    assert refusal(err.value, "config.json").rule == "git-oid"
    assert_nothing_published(file_store)


def test_listed_file_answering_404_is_refused(local_hub, file_store, quarantine, release):
    local_hub.hub.faults.add(SHARD1, Fault.http_status(404, times=None))
    with pytest.raises(ReleaseRefused) as err:
        run_stage(local_hub.endpoint, file_store, quarantine)
    found = refusal(err.value, SHARD1)
    assert found.rule == "download" and "404" in found.detail
    assert_nothing_published(file_store)


def test_hub_down_for_good_fails_with_unavailable(local_hub, file_store, quarantine, release):
    local_hub.hub.faults.add("/api/models/*", Fault.http_status(503, times=None))
    with pytest.raises(Unavailable, match="unavailable") as err:
        run_stage(local_hub.endpoint, file_store, quarantine,
                  retry=RetryPolicy(attempts=2, backoff=0.01))
    assert "re-run" in err.value.hint
    assert_nothing_published(file_store)


# ----- the world as it is: redirects, silence, trickles, rate limits, lying listings ----------

TOKEN = "hf_k3a_secret"


def stage_with(endpoint, store, quarantine, *, token=False, revision="main", **retry):
    policy = RetryPolicy(**{"attempts": 3, "backoff": 0.01, "max_backoff": 0.05, **retry})
    return stage(HubSource(endpoint, token=token, retry=policy), store, REPO, revision,
                 quarantine, StageOptions(retry=policy))


def test_no_request_to_the_cdn_carries_the_token(make_local_hub, file_store, quarantine,
                                                 tmp_path):
    server = make_local_hub(token=TOKEN)
    commit = server.hub.add_commit(REPO, small_release(tmp_path))
    # A drop makes the transfer resume against the CDN URL it was redirected to.
    server.hub.faults.add(SHARD1, Fault.drop(after_bytes=CUT))
    result = stage_with(server.endpoint, file_store, quarantine, token=TOKEN)
    assert result.commit == commit and published(file_store, commit)
    cdn = [r for r in server.hub.requests if r.origin == "cdn"]
    assert {r.target for r in cdn} == {SHARD1, SHARD2}
    assert [g.range for g in file_gets(server.hub, path=SHARD1)] == [None, f"bytes={CUT}-"]
    # The resume went to the CDN URL directly: the hub was asked once.
    assert len([r for r in server.hub.requests if r.origin == "hub" and r.target == SHARD1]) == 1
    assert not [r for r in cdn if r.authorization]
    # The hub itself needs the token on every call (it answers 401 without).
    assert all(r.authorization for r in server.hub.requests if r.origin == "hub")


def test_expired_cdn_link_on_resume_goes_back_to_the_hub(local_hub, file_store, quarantine,
                                                          release):
    hub = local_hub.hub
    hub.faults.add(SHARD1, Fault.drop(after_bytes=CUT))

    class LinkExpiresAfterFirstBytes(StageObserver):
        armed = False

        def advance(self, path: str, nbytes: int) -> None:
            if path == SHARD1 and not self.armed:
                self.armed = True  # the next CDN answer for it is an expired signature
                hub.faults.add(SHARD1, Fault.http_status(403, times=1))

    policy = RetryPolicy(attempts=3, backoff=0.01)
    stage(HubSource(local_hub.endpoint, token=False, retry=policy), file_store, REPO, "main",
          quarantine, StageOptions(retry=policy), LinkExpiresAfterFirstBytes())
    assert [(g.status, g.range) for g in file_gets(hub, path=SHARD1)] == [
        (200, None), (403, f"bytes={CUT}-"), (206, f"bytes={CUT}-")]
    assert len([r for r in hub.requests if r.origin == "hub" and r.target == SHARD1]) == 2
    assert published(file_store, release)


def test_hub_that_accepts_and_never_answers_fails_within_the_timeout(local_hub, file_store,
                                                                     quarantine, release):
    local_hub.hub.faults.add("/api/models/*", Fault.stall(60, times=None))
    started = time.monotonic()
    with pytest.raises(Unavailable) as err:
        stage_with(local_hub.endpoint, file_store, quarantine, attempts=2, read_timeout=0.3)
    # Two attempts of 0.3 s each, not the hub's 60 s of silence.
    assert time.monotonic() - started < 20
    assert err.value.exit_code == 8
    assert local_hub.endpoint in str(err.value) and "timed out" in str(err.value)
    assert_nothing_published(file_store)


def test_file_transfer_that_stalls_before_headers_is_cut(local_hub, file_store, quarantine,
                                                         release):
    local_hub.hub.faults.add(SHARD1, Fault.stall(60, times=1))
    stage_with(local_hub.endpoint, file_store, quarantine, read_timeout=0.5)
    assert published(file_store, release)


def test_trickle_is_cut_resumed_then_fails_exit_8_naming_the_server(local_hub, file_store,
                                                                    quarantine, release):
    local_hub.hub.faults.add(SHARD1, Fault.trickle(64, 0.05))
    with pytest.raises(Unavailable) as err:
        stage_with(local_hub.endpoint, file_store, quarantine, attempts=8,
                   rate_window=0.4, min_rate=64 * 1024, slow_attempts=2)
    cdn = local_hub.hub.cdn_endpoint.removeprefix("http://")
    assert err.value.exit_code == 8
    assert f"{SHARD1}: {cdn} too slow, 2 windows of 0.4s in a row" in str(err.value)
    assert "below the floor of 65536 B/s" in str(err.value)
    # The trickle was cut and resumed from its last byte, against the CDN URL.
    gets = file_gets(local_hub.hub, path=SHARD1)
    assert len(gets) == 2 and gets[0].range is None and gets[1].range.startswith("bytes=")
    assert int(gets[1].range[6:-1]) > 0
    assert_nothing_published(file_store)
    # What was received is kept: a re-run on a healthy link fetches only the rest.
    kept = quarantine_of(quarantine, release).part_path(SHARD1).stat().st_size
    local_hub.hub.faults.clear()
    mark = len(local_hub.hub.requests)
    stage_with(local_hub.endpoint, file_store, quarantine)
    assert [g.range for g in file_gets(local_hub.hub, mark, SHARD1)] == [f"bytes={kept}-"]
    assert published(file_store, release)


@pytest.mark.parametrize("at,target", [("file", SHARD1), ("resolve", SHARD1),
                                       ("file", "/api/models/*")])
def test_429_waits_for_retry_after(local_hub, file_store, quarantine, release, at, target):
    local_hub.hub.faults.add(target, Fault.http_status(429, retry_after=1, times=1, at=at))
    stage_with(local_hub.endpoint, file_store, quarantine, backoff=0.001)
    limited = [i for i, r in enumerate(local_hub.hub.requests) if r.status == 429]
    assert len(limited) == 1
    requests = local_hub.hub.requests
    again = next(r for r in requests[limited[0] + 1:]
                 if r.origin == requests[limited[0]].origin
                 and (r.target == SHARD1 if target == SHARD1 else "/api/" in r.url))
    # The backoff alone would have retried after 1 ms; the hub asked for a second.
    assert again.time - requests[limited[0]].time >= 0.9
    assert published(file_store, release)


def test_retry_after_is_bounded(local_hub, file_store, quarantine, release):
    local_hub.hub.faults.add(SHARD1, Fault.http_status(503, retry_after=3600, times=1))
    started = time.monotonic()
    stage_with(local_hub.endpoint, file_store, quarantine, max_retry_after=0.1)
    assert time.monotonic() - started < 30
    assert published(file_store, release)


def _edit_entry(path, **fields):
    def edit(page):
        for entry in page:
            if entry.get("path") == path:
                entry.update(fields)
        return page

    return edit


@pytest.mark.parametrize(
    "fields,words",
    [
        ({"size": None}, "size is 'None'"),
        ({"size": "262144"}, "not a non-negative integer"),
        ({"size": -1}, "not a non-negative integer"),
        ({"size": True}, "not a non-negative integer"),
        ({"lfs": {"oid": "not-a-sha", "size": 1}}, "not a 64-hex sha256"),
        ({"lfs": {"oid": "a" * 64, "size": 5}}, "lfs size '5' differs"),
        ({"lfs": "yes"}, "not an object"),
        ({"oid": None}, "40-hex git blob id"),
        # Sizes nothing may be sized from: refused at the listing, before any range plan,
        # preallocation or file offset is made from them.
        ({"size": 2**63}, f"size {2**63} is beyond any file the Hub serves"),
        ({"size": 10**30}, f"size {10**30} is beyond any file the Hub serves"),
        ({"size": 2**50}, f"size {2**50} is beyond any file the Hub serves"),
    ],
    ids=["size-null", "size-string", "size-negative", "size-bool", "lfs-oid", "lfs-size",
         "lfs-type", "oid-null", "size-2^63", "size-10^30", "size-2^50"],
)
def test_malformed_listing_field_is_refused_with_the_file_named(local_hub, file_store,
                                                                quarantine, release, fields,
                                                                words):
    local_hub.hub.faults.add("/api/models/*/tree/*", Fault.json(_edit_entry(SHARD1, **fields)))
    with pytest.raises(ReleaseRefused) as err:
        stage_with(local_hub.endpoint, file_store, quarantine)
    found = refusal(err.value, SHARD1)
    assert found.rule == "listing" and words in found.detail, found.detail
    assert err.value.exit_code == 3
    assert not file_gets(local_hub.hub)
    assert_nothing_published(file_store)


def test_listing_entry_without_a_usable_path_is_refused(local_hub, file_store, quarantine,
                                                        release):
    local_hub.hub.faults.add("/api/models/*/tree/*", Fault.json(
        lambda page: [*page, {"type": "file", "path": "p" * 5000, "size": 1, "oid": "0" * 40},
                      "not an entry"]))
    with pytest.raises(ReleaseRefused) as err:
        stage_with(local_hub.endpoint, file_store, quarantine)
    assert {(r.path, r.rule) for r in err.value.refusals} == {
        (f"<entry {len(local_hub.hub.files(REPO))}>", "listing"),
        (f"<entry {len(local_hub.hub.files(REPO)) + 1}>", "listing")}
    assert not file_gets(local_hub.hub)


def test_pinned_commit_contradicted_by_the_hub_is_refused(local_hub, file_store, quarantine,
                                                          tmp_path, release):
    other = local_hub.hub.add_commit(REPO, small_release(tmp_path, seed=1))
    local_hub.hub.faults.add("/api/models/*/revision/*",
                             Fault.json(lambda info: {**info, "sha": other}))
    with pytest.raises(ReleaseRefused) as err:
        stage_with(local_hub.endpoint, file_store, quarantine, revision=release)
    assert err.value.exit_code == 3
    (found,) = err.value.refusals
    assert found.rule == "pinned-commit"
    assert release in found.detail and other in found.detail
    assert not file_gets(local_hub.hub)
    assert_nothing_published(file_store)


def test_listing_pages_on_another_host_get_no_token(make_local_hub, file_store, quarantine,
                                                    tmp_path):
    hub = make_local_hub(token=TOKEN, page_size=3)
    mirror = make_local_hub(page_size=3)  # another origin, serving the same repo
    files = small_release(tmp_path)
    commit = hub.hub.add_commit(REPO, files)
    assert mirror.hub.add_commit(REPO, files) == commit
    hub.hub.faults.add("/api/models/*/tree/*", Fault.next_page_on(mirror.endpoint))
    result = stage_with(hub.endpoint, file_store, quarantine, token=TOKEN)
    assert result.commit == commit and published(file_store, commit)
    pages = [r for r in mirror.hub.requests if "/tree/" in r.url]
    assert pages and "cursor=" in pages[0].query
    assert not [r for r in mirror.hub.requests if r.authorization]


def test_hostile_hub_cases_through_the_cli(k3a_cmd, k3a_env, local_hub, tmp_path, release):
    """What a release engineer sees: the exit code and the message for each hostile answer."""
    hub = local_hub.hub
    stage = ["stage", REPO, "--endpoint", local_hub.endpoint,
             "--store", f"file://{tmp_path / 'store'}", "-q", "--retries", "2"]

    def k3a(*args):
        return run_process(*stage, *args, env=k3a_env, cmd=k3a_cmd, expect=None)

    hub.faults.add(SHARD1, Fault.trickle(64, 0.05))
    trickle = k3a("--rate-window", "0.3")
    cdn = hub.cdn_endpoint.removeprefix("http://")
    assert trickle.returncode == 8, trickle.stderr
    assert f"{SHARD1}: {cdn} too slow, 3 windows of 0.3s in a row" in trickle.stderr
    assert "--min-rate" in trickle.stderr

    hub.faults.clear()
    hub.faults.add("/api/models/*", Fault.stall(60, times=None))
    silent = k3a("--read-timeout", "0.3")
    assert silent.returncode == 8, silent.stderr
    assert f"hub at {local_hub.endpoint} unavailable" in silent.stderr
    assert "timed out" in silent.stderr

    hub.faults.clear()
    mark = len(hub.requests)
    hub.faults.add("/api/models/*/tree/*", Fault.json(_edit_entry(SHARD1, size=None)))
    listing = k3a()
    assert listing.returncode == 3, listing.stderr
    assert f"{SHARD1}: [listing] size is 'None', not a non-negative integer" in listing.stderr

    hub.faults.clear()
    other = "f" * 40
    hub.faults.add("/api/models/*/revision/*", Fault.json(lambda info: {**info, "sha": other}))
    pinned = k3a("--revision", release)
    assert pinned.returncode == 3, pinned.stderr
    assert f"[pinned-commit] pinned commit {release} but the hub at {local_hub.endpoint} " \
           f"answered commit {other}" in pinned.stderr
    hub.faults.clear()
    hub.add_commit(REPO, {**small_release(tmp_path), "gnp.\u202ejson": b"{}"})
    bidi = k3a()
    assert bidi.returncode == 3, bidi.stderr
    # Named, escaped: the override would reorder the operator's terminal line.
    assert "'gnp.\\u202ejson': [unsafe-path] bidirectional override" in bidi.stderr
    assert "\u202e" not in bidi.stderr
    # Refused before any byte moved.
    assert not file_gets(hub, mark)


def test_redirects_are_bounded_and_never_leave_http():
    """A server that redirects for ever (or to another scheme) is an answer, not a hang."""
    import http.server

    from k3artifacts.net.attempt import PermanentError, open_following

    hits = []

    class Loop(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the base class's name
            hits.append(self.path)
            self.send_response(302)
            target = "file:///etc/passwd" if self.path == "/scheme" else f"/hop{len(hits)}"
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    with serving(Loop) as url:
        with pytest.raises(PermanentError, match="more than 2 redirects"):
            open_following(f"{url}/start", {}, RetryPolicy(max_redirects=2), auth_origin=url)
        assert hits == ["/start", "/hop1", "/hop2"]
        with pytest.raises(PermanentError, match="non-HTTP URL"):
            open_following(f"{url}/scheme", {}, RetryPolicy(), auth_origin=url)
