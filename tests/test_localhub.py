"""The local hub against the real huggingface_hub client: what staging relies on upstream."""

from __future__ import annotations

import hashlib
import http.client
import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from huggingface_hub import get_hf_file_metadata, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from k3artifacts.localhub import LocalHub
from tests.support.hubfaults import Fault

REPO = "moonshotai/Kimi-K3-tiny"


def _blob(n: int, seed: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(b"%d:%d" % (seed, counter)).digest()
        counter += 1
    return bytes(out[:n])


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    p = tmp_path / "src" / "model-00001-of-00001.safetensors"
    p.parent.mkdir(parents=True)
    p.write_bytes(_blob(300_000, 1))
    return p


@pytest.fixture
def repo(local_hub, weights):
    files = {
        "config.json": b'{"model_type": "kimi_k3"}',
        "model-00001-of-00001.safetensors": weights,
        "tokenizer/vocab.txt": b"a\nb\n",
        "empty.txt": b"",
        "README.md": b"---\nlicense: other\nlicense_name: modified-mit\n---\n# K3\n",
    }
    commit = local_hub.hub.add_commit(REPO, files)
    return commit, files


def _raw_once(endpoint: str, method: str, path: str, headers: dict[str, str] | None = None):
    u = urlsplit(endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    conn.request(method, path, headers=headers or {})
    resp = conn.getresponse()
    try:
        body = resp.read()
    except http.client.IncompleteRead as e:
        body = e.partial
    conn.close()
    return resp, body


def _raw(endpoint: str, method: str, path: str, headers: dict[str, str] | None = None):
    """One request, following the hub's redirect to its CDN as a client does (without the
    Authorization header, which the CDN refuses)."""
    resp, body = _raw_once(endpoint, method, path, headers)
    if resp.status != 302:
        return resp, body
    target = urlsplit(resp.getheader("Location"))
    rest = {k: v for k, v in (headers or {}).items() if k.lower() != "authorization"}
    return _raw_once(f"http://{target.netloc}", method, f"{target.path}?{target.query}", rest)


def _cdn_location(local_hub, path: str) -> str:
    resp, _ = _raw_once(local_hub.endpoint, "HEAD", path)
    assert resp.status == 302
    return resp.getheader("Location")


def test_commit_ids_are_deterministic(tmp_path):
    a = LocalHub(tmp_path / "a").add_commit("o/r", {"x": b"1"})
    b = LocalHub(tmp_path / "b").add_commit("o/r", {"x": b"1"})
    c = LocalHub(tmp_path / "c").add_commit("o/r", {"x": b"2"})
    assert a == b != c
    assert len(a) == 40 and int(a, 16) >= 0


def test_model_info_resolves_branch_tag_and_commit(local_hub, repo, weights):
    commit, _ = repo
    hub = local_hub.hub
    hub.add_tag(REPO, "v1.0", commit)
    second = hub.add_commit(REPO, {"config.json": b"{}"})
    api = local_hub.api()
    assert api.model_info(REPO).sha == second
    assert api.model_info(REPO, revision="main").sha == second
    assert api.model_info(REPO, revision="v1.0").sha == commit
    assert api.model_info(REPO, revision=commit).sha == commit

    info = api.model_info(REPO, revision="v1.0", files_metadata=True)
    by_name = {s.rfilename: s for s in info.siblings}
    shard = by_name["model-00001-of-00001.safetensors"]
    assert shard.lfs is not None
    assert shard.lfs.sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert shard.size == shard.lfs.size == 300_000
    cfg = by_name["config.json"]
    data = b'{"model_type": "kimi_k3"}'
    assert cfg.lfs is None
    assert cfg.blob_id == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    assert info.card_data is not None and info.card_data["license_name"] == "modified-mit"


def test_list_repo_tree_paginates_and_carries_lfs_sha256(make_local_hub, weights):
    server = make_local_hub(page_size=2)
    files = {f"f{i:02d}.json": b"{}" for i in range(5)}
    files["nested/deep/model.safetensors"] = weights
    server.hub.add_commit(REPO, files)
    entries = list(server.api().list_repo_tree(REPO, recursive=True))
    paths = [e.path for e in entries]
    assert sorted(paths) == sorted([*files, "nested", "nested/deep"])
    tree_requests = [r for r in server.hub.requests if "/tree/" in r.url]
    assert len(tree_requests) == 4  # 8 entries, 2 per page
    assert sum("cursor=" in r.query for r in tree_requests) == 3
    shard = next(e for e in entries if e.path == "nested/deep/model.safetensors")
    assert shard.lfs.sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()

    top = {e.path for e in server.api().list_repo_tree(REPO)}
    assert top == {*(f"f{i:02d}.json" for i in range(5)), "nested"}
    sub = [e.path for e in server.api().list_repo_tree(REPO, "nested/deep")]
    assert sub == ["nested/deep/model.safetensors"]


def test_download_bytes_and_metadata(local_hub, repo, weights):
    commit, _ = repo
    path = hf_hub_download(
        REPO,
        "model-00001-of-00001.safetensors",
        endpoint=local_hub.endpoint,
        cache_dir=local_hub.cache_dir,
    )
    assert Path(path).read_bytes() == weights.read_bytes()
    meta = get_hf_file_metadata(local_hub.url(REPO, "model-00001-of-00001.safetensors"))
    assert meta.commit_hash == commit
    assert meta.etag == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert meta.size == 300_000
    small = get_hf_file_metadata(local_hub.url(REPO, "tokenizer/vocab.txt"))
    assert small.etag == hashlib.sha1(b"blob 4\0a\nb\n").hexdigest()
    assert small.size == 4
    empty = hf_hub_download(
        REPO, "empty.txt", endpoint=local_hub.endpoint, cache_dir=local_hub.cache_dir
    )
    assert Path(empty).read_bytes() == b""


def test_range_requests(local_hub, repo, weights):
    data = weights.read_bytes()
    url = "/" + REPO + "/resolve/main/model-00001-of-00001.safetensors"
    resp, body = _raw(local_hub.endpoint, "GET", url, {"Range": "bytes=1000-1999"})
    assert resp.status == 206
    assert resp.getheader("Content-Range") == "bytes 1000-1999/300000"
    assert body == data[1000:2000]
    resp, body = _raw(local_hub.endpoint, "GET", url, {"Range": "bytes=299990-"})
    assert resp.status == 206 and body == data[299990:]
    resp, body = _raw(local_hub.endpoint, "GET", url, {"Range": "bytes=-10"})
    assert resp.status == 206 and body == data[-10:]
    resp, _ = _raw(local_hub.endpoint, "GET", url, {"Range": "bytes=300000-"})
    assert resp.status == 416
    assert resp.getheader("Content-Range") == "bytes */300000"
    resp, _ = _raw(local_hub.endpoint, "HEAD", url)
    assert resp.status == 200
    assert resp.getheader("Accept-Ranges") == "bytes"
    assert resp.getheader("Content-Length") == "300000"


def test_lfs_resolve_redirects_to_a_cdn_on_another_origin_like_huggingface_co(local_hub, repo,
                                                                              weights):
    commit, _ = repo
    sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    resp, body = _raw_once(local_hub.endpoint, "GET", SHARD_URL)
    assert resp.status == 302 and body.startswith(b"Found. Redirecting to ")
    assert resp.getheader("X-Repo-Commit") == commit
    assert resp.getheader("X-Linked-Etag") == resp.getheader("ETag") == f'"{sha}"'
    assert resp.getheader("X-Linked-Size") == "300000"
    location = urlsplit(resp.getheader("Location"))
    assert location.hostname == "127.0.0.1"
    assert location.port != urlsplit(local_hub.endpoint).port
    assert location.path.endswith("/" + sha) and "Signature=" in location.query
    cdn, path = f"http://{location.netloc}", f"{location.path}?{location.query}"
    resp, body = _raw_once(cdn, "GET", path, {"Range": "bytes=10-19"})
    assert resp.status == 206 and body == weights.read_bytes()[10:20]
    # A presigned URL refuses a second auth mechanism, a tampered or expired signature.
    resp, body = _raw_once(cdn, "GET", path, {"Authorization": "Bearer hf_x"})
    assert resp.status == 400 and b"Only one auth mechanism allowed" in body
    resp, _ = _raw_once(cdn, "GET", path.replace("Expires=", "Expires=9"))
    assert resp.status == 403
    # Small files are answered by the hub itself.
    resp, body = _raw_once(local_hub.endpoint, "GET", f"/{REPO}/resolve/main/config.json")
    assert resp.status == 200 and body == b'{"model_type": "kimi_k3"}'


def test_expired_cdn_link_is_refused(tmp_path, hf_env, weights):
    hub = LocalHub(tmp_path / "root", link_ttl=-1)
    hub.add_commit(REPO, {SHARD: weights})
    with hub.serve() as endpoint:
        resp, _ = _raw(endpoint, "GET", SHARD_URL)
    assert resp.status == 403


def test_direct_mode_serves_lfs_from_the_hub(tmp_path, hf_env, weights):
    hub = LocalHub(tmp_path / "root", redirects=False)
    hub.add_commit(REPO, {SHARD: weights})
    with hub.serve() as endpoint:
        resp, body = _raw_once(endpoint, "GET", SHARD_URL)
    assert resp.status == 200 and body == weights.read_bytes()
    assert resp.getheader("X-Linked-Size") == "300000"


def test_official_client_follows_the_redirect_and_keeps_the_token_on_the_hub(make_local_hub,
                                                                             weights):
    server = make_local_hub(token="hf_secret")
    server.hub.add_commit(REPO, {SHARD: weights, "config.json": b"{}"})
    path = hf_hub_download(REPO, SHARD, endpoint=server.endpoint, token="hf_secret",
                           cache_dir=server.cache_dir)
    assert Path(path).read_bytes() == weights.read_bytes()
    cdn = [r for r in server.hub.requests if r.origin == "cdn"]
    assert [(r.method, r.status, r.target) for r in cdn] == [("GET", 200, SHARD)]
    assert not any(r.authorization for r in cdn)
    assert all(r.authorization for r in server.hub.requests if r.origin == "hub")


def test_not_found_errors_map_to_client_exceptions(local_hub, repo):
    api = local_hub.api()
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("moonshotai/nope")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="v9")
    with pytest.raises(RevisionNotFoundError):
        list(api.list_repo_tree(REPO, revision="0" * 40))
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(
            REPO, "missing.bin", endpoint=local_hub.endpoint, cache_dir=local_hub.cache_dir
        )
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree(REPO, "no/such/dir"))


def test_token_is_enforced(make_local_hub):
    server = make_local_hub(token="hf_secret")
    server.hub.add_commit(REPO, {"config.json": b"{}"})
    with pytest.raises(RepositoryNotFoundError) as anon:
        server.api(token=False).model_info(REPO)
    assert anon.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError) as wrong:
        server.api(token="hf_wrong").model_info(REPO)
    assert wrong.value.response.status_code == 401
    assert server.api(token="hf_secret").model_info(REPO).sha
    path = hf_hub_download(
        REPO, "config.json", endpoint=server.endpoint, token="hf_secret", cache_dir=server.cache_dir
    )
    assert Path(path).read_bytes() == b"{}"


# ----- hostile listings ----------------------------------------------------------------------


def test_hostile_paths_are_listed_verbatim_and_never_touch_the_filesystem(local_hub, tmp_path):
    hostile = {
        "../x": b"dotdot",
        "/etc/passwd": b"root",
        "a/../../b": b"climb",
        "Model.safetensors": b"upper",
        "model.safetensors": b"lower",
    }
    local_hub.hub.add_commit(REPO, hostile)
    listed = {
        e.path for e in local_hub.api().list_repo_tree(REPO, recursive=True) if hasattr(e, "size")
    }
    assert listed == set(hostile)
    info = local_hub.api().model_info(REPO, files_metadata=True)
    assert {s.rfilename for s in info.siblings} == set(hostile)
    resp, body = _raw(local_hub.endpoint, "GET", f"/{REPO}/resolve/main/%2E%2E%2Fx")
    assert resp.status == 200 and body == b"dotdot"
    resp, body = _raw(local_hub.endpoint, "GET", f"/{REPO}/resolve/main/%2Fetc%2Fpasswd")
    assert resp.status == 200 and body == b"root"
    resp, body = _raw(local_hub.endpoint, "GET", f"/{REPO}/resolve/main/Model.safetensors")
    assert body == b"upper"
    assert not (tmp_path / "x").exists()


# ----- faults --------------------------------------------------------------------------------

SHARD = "model-00001-of-00001.safetensors"
SHARD_URL = f"/{REPO}/resolve/main/{SHARD}"


def _gets(hub, path=SHARD):
    return [r for r in hub.requests if r.method == "GET" and r.target == path and r.is_file]


def test_drop_then_range_resume(local_hub, repo, weights):
    data = weights.read_bytes()
    local_hub.hub.faults.add(SHARD, Fault.drop(after_bytes=100_000))
    resp, body = _raw(local_hub.endpoint, "GET", SHARD_URL)
    assert resp.status == 200 and body == data[:100_000]
    resp, rest = _raw(local_hub.endpoint, "GET", SHARD_URL, {"Range": f"bytes={len(body)}-"})
    assert resp.status == 206 and body + rest == data
    first, second = _gets(local_hub.hub)
    assert (first.bytes_sent, first.range) == (100_000, None)
    assert (second.bytes_sent, second.range) == (200_000, "bytes=100000-")


def test_client_recovers_from_a_drop(local_hub, repo, weights):
    local_hub.hub.faults.add("*.safetensors", Fault.drop(after_bytes=50_000))
    path = hf_hub_download(REPO, SHARD, endpoint=local_hub.endpoint, cache_dir=local_hub.cache_dir)
    assert Path(path).read_bytes() == weights.read_bytes()
    assert [r.bytes_sent for r in _gets(local_hub.hub)] == [50_000, 300_000]


def test_status_fault_with_retry_after_for_k_requests(local_hub, repo):
    local_hub.hub.faults.add(SHARD, Fault.http_status(503, retry_after=7, times=2))
    for _ in range(2):
        resp, _ = _raw(local_hub.endpoint, "GET", SHARD_URL)
        assert resp.status == 503 and resp.getheader("Retry-After") == "7"
    resp, _ = _raw(local_hub.endpoint, "GET", SHARD_URL)
    assert resp.status == 200
    assert [r.status for r in _gets(local_hub.hub)] == [503, 503, 200]


def test_status_fault_on_the_api(local_hub, repo):
    local_hub.hub.faults.add("/api/models/*", Fault.http_status(500))
    with pytest.raises(HfHubHTTPError) as err:
        local_hub.api().model_info(REPO)
    assert err.value.response.status_code == 500
    assert local_hub.api().model_info(REPO).sha == repo[0]


def test_status_fault_can_hit_head(local_hub, repo):
    local_hub.hub.faults.add(SHARD, Fault.http_status(429, methods=frozenset({"HEAD"})))
    resp, _ = _raw(local_hub.endpoint, "HEAD", SHARD_URL)
    assert resp.status == 429
    resp, _ = _raw(local_hub.endpoint, "GET", SHARD_URL)
    assert resp.status == 200


def test_stall_before_headers_trips_a_client_timeout(local_hub, repo):
    local_hub.hub.faults.add(SHARD, Fault.stall(5.0))
    u = urlsplit(_cdn_location(local_hub, SHARD_URL))
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=0.3)
    conn.request("GET", f"{u.path}?{u.query}")
    with pytest.raises(TimeoutError):
        conn.getresponse()
    conn.close()


def test_stall_mid_body(local_hub, repo, weights):
    local_hub.hub.faults.add(SHARD, Fault.stall(5.0, after_bytes=4096))
    u = urlsplit(_cdn_location(local_hub, SHARD_URL))
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=0.3)
    conn.request("GET", f"{u.path}?{u.query}")
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.read(4096) == weights.read_bytes()[:4096]
    with pytest.raises(TimeoutError):
        resp.read(1)
    conn.close()


def test_short_body(local_hub, repo, weights):
    local_hub.hub.faults.add(SHARD, Fault.short(missing=10))
    resp, body = _raw(local_hub.endpoint, "GET", SHARD_URL)
    assert resp.getheader("Content-Length") == "300000"
    assert body == weights.read_bytes()[:-10]


def test_corrupt_bytes_under_a_true_listing(local_hub, repo, weights):
    data = weights.read_bytes()
    local_hub.hub.faults.add(SHARD, Fault.corrupt(offset=12_345))
    path = hf_hub_download(REPO, SHARD, endpoint=local_hub.endpoint, cache_dir=local_hub.cache_dir)
    got = Path(path).read_bytes()
    # The client accepts it: only the size is checked, which is why staging hashes.
    assert len(got) == len(data) and got != data
    assert [i for i in range(len(data)) if got[i] != data[i]] == [12_345]
    assert got[12_345] == data[12_345] ^ 0xFF
    info = local_hub.api().model_info(REPO, files_metadata=True)
    lfs = next(s.lfs for s in info.siblings if s.rfilename == SHARD)
    assert lfs.sha256 == hashlib.sha256(data).hexdigest()
    resp, body = _raw(local_hub.endpoint, "GET", SHARD_URL, {"Range": "bytes=12340-12349"})
    assert body == data[12340:12345] + bytes([data[12345] ^ 0xFF]) + data[12346:12350]


@pytest.mark.parametrize("good_first", [True, False])
def test_content_changes_between_attempts(local_hub, repo, weights, good_first):
    data = weights.read_bytes()
    local_hub.hub.faults.add(SHARD, Fault.mutate(good_first=good_first))
    _, first = _raw(local_hub.endpoint, "GET", SHARD_URL)
    _, second = _raw(local_hub.endpoint, "GET", SHARD_URL)
    _, tail = _raw(local_hub.endpoint, "GET", SHARD_URL, {"Range": "bytes=1000-"})
    assert len(first) == len(second) == len(data)
    good, bad = (first, second) if good_first else (second, first)
    assert good == data and bad != data
    assert tail == (second[1000:])


def test_faults_are_scoped_by_repo_and_count(local_hub, repo, weights):
    local_hub.hub.add_commit("other/repo", {SHARD: weights})
    local_hub.hub.faults.add(SHARD, Fault.http_status(500, repo_id="other/repo", times=None))
    assert _raw(local_hub.endpoint, "GET", SHARD_URL)[0].status == 200
    for _ in range(3):
        assert _raw(local_hub.endpoint, "GET", f"/other/repo/resolve/main/{SHARD}")[0].status == 500
    local_hub.hub.faults.clear()
    assert _raw(local_hub.endpoint, "GET", f"/other/repo/resolve/main/{SHARD}")[0].status == 200


def test_a_file_fetched_once_is_logged_once(local_hub, repo, weights):
    for _ in range(2):
        hf_hub_download(REPO, SHARD, endpoint=local_hub.endpoint, cache_dir=local_hub.cache_dir)
    gets = _gets(local_hub.hub)
    assert len(gets) == 1 and gets[0].bytes_sent == os.path.getsize(weights)


def test_served_from_an_existing_root(tmp_path, hf_env):
    first = LocalHub(tmp_path / "root")
    commit = first.add_commit(REPO, {"config.json": b"{}"})
    first.add_tag(REPO, "v1", commit)
    with LocalHub(tmp_path / "root").serve() as endpoint:
        from huggingface_hub import HfApi

        assert HfApi(endpoint=endpoint).model_info(REPO, revision="v1").sha == commit


def test_module_serves_a_root_in_the_foreground(tmp_path, hf_env, k3a_env):
    import signal
    import subprocess
    import sys

    from huggingface_hub import HfApi

    proc = subprocess.Popen(
        [sys.executable, "-m", "k3artifacts.localhub", "--root", str(tmp_path / "root"),
         "--synthetic", REPO, "--total-bytes", "256K", "--shards", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=k3a_env,
    )  # fmt: skip
    try:
        endpoint = proc.stdout.readline().strip()
        assert endpoint.startswith("http://127.0.0.1:")
        info = HfApi(endpoint=endpoint).model_info(REPO, files_metadata=True)
        assert "model-00002-of-00002.safetensors" in {s.rfilename for s in info.siblings}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def test_lfs_rules(tmp_path):
    from k3artifacts.localhub.repos import is_lfs_by_default

    assert is_lfs_by_default("sub/model.safetensors", 10)
    assert is_lfs_by_default("w.gguf", 10) and is_lfs_by_default("x.pkl", 10)
    assert not is_lfs_by_default("config.json", 10 * 1024 * 1024)
    assert is_lfs_by_default("tokenizer.json", 10 * 1024 * 1024 + 1)
    hub = LocalHub(tmp_path)
    hub.add_commit("o/r", {"a.json": b"{}", "b.bin": b"x"}, lfs={"a.json"})
    files = hub.files("o/r")
    assert files["a.json"].lfs and not files["b.bin"].lfs
    assert files["a.json"].etag == hashlib.sha256(b"{}").hexdigest()
    assert files["b.bin"].etag == hashlib.sha1(b"blob 1\0x").hexdigest()


def test_keep_alive_survives_errors_and_partial_ranges(local_hub, repo, weights):
    u = urlsplit(local_hub.endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    for path, headers, status in [
        (f"/{REPO}/resolve/main/nope", {}, 404),
        (SHARD_URL, {"Range": "bytes=0-9"}, 302),
        ("/api/models/" + REPO, {}, 200),
        (SHARD_URL, {}, 302),
    ]:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        assert resp.status == status
        resp.read()
    conn.close()
    assert len({r.url for r in local_hub.hub.requests}) == 3


def test_force_moved_branch_and_expanded_listing(local_hub, repo):
    first, files = repo
    hub = local_hub.hub
    second = hub.add_commit(REPO, {**files, "config.json": b'{"v": 2}'}, message="bump config")
    entries = {e.path: e for e in local_hub.api().list_repo_tree(REPO, expand=True)}
    assert entries["config.json"].last_commit.oid == second
    assert entries["config.json"].last_commit.title == "bump config"
    assert entries[SHARD].last_commit.oid == first
    hub.set_branch(REPO, "main", first)
    assert local_hub.api().model_info(REPO).sha == first


def test_trickle_sends_a_chunk_per_interval(local_hub, repo, weights):
    local_hub.hub.faults.add(SHARD, Fault.trickle(100, 0.05, after_bytes=1000, times=1))
    u = urlsplit(_cdn_location(local_hub, SHARD_URL))
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
    conn.request("GET", f"{u.path}?{u.query}", headers={"Range": "bytes=0-1499"})
    resp = conn.getresponse()
    assert resp.status == 206
    assert resp.read() == weights.read_bytes()[:1500]
    conn.close()
    (got,) = _gets(local_hub.hub)
    assert got.bytes_sent == 1500


def test_unknown_fault_kind_is_refused():
    with pytest.raises(ValueError):
        Fault("explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Fault.drop(10, times=0)
