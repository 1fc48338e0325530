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

from k3artifacts.localhub import Fault, LocalHub

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
        "README.md": b"---\nlicense: other\nlicense_name: modified-mit\n---\n# K3\n",
    }
    commit = local_hub.hub.add_commit(REPO, files)
    return commit, files


def _raw(endpoint: str, method: str, path: str, headers: dict[str, str] | None = None):
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
        REPO, "model-00001-of-00001.safetensors", endpoint=local_hub.endpoint,
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
    assert resp.getheader("X-Linked-Size") == "300000"
    assert resp.getheader("X-Linked-Etag") == '"%s"' % hashlib.sha256(data).hexdigest()


def test_not_found_errors_map_to_client_exceptions(local_hub, repo):
    api = local_hub.api()
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("moonshotai/nope")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="v9")
    with pytest.raises(RevisionNotFoundError):
        list(api.list_repo_tree(REPO, revision="0" * 40))
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "missing.bin", endpoint=local_hub.endpoint, cache_dir=local_hub.cache_dir)
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
