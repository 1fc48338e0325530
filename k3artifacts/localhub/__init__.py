"""A local Hugging Face Hub for the demo, the staging tests, the fault suite and the benchmarks.

It speaks, over real HTTP on 127.0.0.1, the part of the Hub API that ``huggingface_hub`` 2.4
needs to resolve a revision, list files (with LFS sha256) and download them (HEAD metadata,
Range resume). Like huggingface.co, it answers ``/resolve/`` for an LFS file with a 302 to a
CDN on another origin (its own server on another port) that refuses ``Authorization``;
``redirects=False`` serves every file from the hub itself, for the few tests that need that.
The tests' stand-in that misbehaves on purpose and records every request
(``tests/support/hubfaults.py``) hooks in through :meth:`LocalHub.plan_answer` and
:meth:`LocalHub.record`::

    hub = LocalHub(tmp_path / "hub")
    commit = hub.add_commit("moonshotai/Kimi-K3", {"config.json": b"{}", "model.safetensors": path})
    hub.add_tag("moonshotai/Kimi-K3", "v1", commit)
    with hub.serve() as endpoint:
        HfApi(endpoint=endpoint).model_info("moonshotai/Kimi-K3", files_metadata=True)
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode

from k3artifacts.localhub.repos import LFS_PATTERNS, LFS_THRESHOLD, Commit, Entry, RepoStore
from k3artifacts.localhub.server import BodyPlan, RequestRecord, _Server

__all__ = [
    "LFS_PATTERNS",
    "LFS_THRESHOLD",
    "Commit",
    "BodyPlan",
    "Entry",
    "LocalHub",
    "RequestRecord",
]


#: Bytes sent at once by a paced answer (``stream_rate``), then a pause that keeps the rate.
STREAM_CHUNK = 256 * 1024


class LocalHub:
    """Repos under ``root`` plus the server that serves them.

    ``token``: when set, every request to the hub must carry ``Authorization: Bearer <token>``
    (401 otherwise, as the Hub answers for a private repo); the CDN refuses any request that
    carries one. ``tokens``: the accounts' tokens the hub knows (``token`` among them): any
    other token sent is answered 401 ``Invalid credentials in Authorization header``, as
    huggingface.co answers a wrong token on any repo. ``gated``: repos whose files are served
    only to tokens granted access (:meth:`grant`): 401 ``GatedRepo`` to an anonymous request,
    403 to a token not granted; their metadata and listing stay open, as on huggingface.co.
    ``page_size``: entries per page of a tree listing (the Hub uses 1000; make it small to
    exercise pagination). ``redirects``: LFS files go through the CDN (the default,
    as on huggingface.co). ``link_ttl``: seconds a signed CDN URL stays valid.
    """

    def __init__(self, root: Path, *, token: str | None = None, page_size: int = 1000,
                 redirects: bool = True, link_ttl: float = 3600.0,
                 stream_rate: float | None = None, tokens: Collection[str] = (),
                 gated: Collection[str] = ()):
        self.repos = RepoStore(Path(root))
        self.token = token
        self.tokens = {*tokens, *([token] if token else [])}
        self.gated = set(gated)
        #: Gated repo -> the tokens granted access to it.
        self.granted: dict[str, set[str]] = {}
        self.page_size = page_size
        self.redirects = redirects
        self.link_ttl = link_ttl
        #: Bytes/s each file answer is paced to, where given: one TCP stream over a long path
        #: (huggingface.co's CDN to another continent) carries tens of MB/s, not loopback's GB/s.
        self.stream_rate = stream_rate
        self._secret = secrets.token_bytes(16)
        self._links: dict[str, tuple[str, Entry]] = {}
        self._cdn: _Server | None = None
        self._cdn_thread: threading.Thread | None = None
        #: Tracebacks of unexpected errors inside the server (a test fixture asserts none).
        self.server_errors: list[str] = []
        self._links_lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ----- content ---------------------------------------------------------------------------

    def add_commit(
        self,
        repo_id: str,
        files: Mapping[str, bytes | Path],
        *,
        branch: str = "main",
        lfs: bool | Collection[str] | None = None,
        message: str = "Upload folder using huggingface_hub",
    ) -> str:
        """Make ``files`` (the whole tree: repo path -> bytes or a file on disk) the new head of
        ``branch`` and return the 40-hex commit id, derived from repo, parent and content.

        Files given as paths are hard-linked (else copied) into the blob store and never read
        into memory, so do not rewrite them in place afterwards. ``lfs``: None = the Hub's rule
        (:data:`LFS_PATTERNS` or above :data:`LFS_THRESHOLD`), a bool for all files, or the
        exact set of LFS paths.
        """
        return self.repos.add_commit(repo_id, files, branch=branch, lfs=lfs, message=message)

    def grant(self, repo_id: str, token: str) -> None:
        """The account of ``token`` accepted ``repo_id``'s terms and was granted access."""
        self.tokens.add(token)
        self.granted.setdefault(repo_id, set()).add(token)

    def add_tag(self, repo_id: str, tag: str, commit: str) -> None:
        self.repos.set_ref(repo_id, "tags", tag, commit)

    def set_branch(self, repo_id: str, branch: str, commit: str) -> None:
        """Point ``branch`` at any existing commit (a force-push, e.g. upstream rewriting main)."""
        self.repos.set_ref(repo_id, "branches", branch, commit)

    def resolve(self, repo_id: str, revision: str) -> str | None:
        return self.repos.resolve(repo_id, revision)

    def files(self, repo_id: str, revision: str = "main") -> dict[str, Entry]:
        """The index of a revision: repo path -> size, sha256, git oid, lfs."""
        commit_id = self.repos.resolve(repo_id, revision)
        commit = self.repos.commit(repo_id, commit_id) if commit_id else None
        if commit is None:
            raise KeyError(f"{repo_id}@{revision}: no such revision")
        return dict(commit.files)

    # ----- hooks (the tests' stand-in overrides them) ----------------------------------------

    def plan_answer(self, *, method: str, repo_id: str | None, target: str,
                    stage: str) -> BodyPlan:
        """How to answer a request for ``target``: plainly, at ``stream_rate`` if set."""
        del method, repo_id, target
        if self.stream_rate is None or stage != "file":
            return BodyPlan()
        chunk = STREAM_CHUNK
        return BodyPlan(trickle=(0, chunk, chunk / self.stream_rate))

    def begin_request(self) -> None:
        """A request arrived."""

    def record(self, rec: RequestRecord) -> None:
        """A request was answered."""
        del rec

    def last_commit(self, commit: Commit, path: str, kind: str) -> Commit:
        """The oldest ancestor, in an unbroken line, where ``path`` is as it is in ``commit``."""

        def view(c: Commit) -> object:
            if kind == "file":
                e = c.files.get(path)
                return None if e is None else (e.sha256, e.lfs)
            return sorted((p, e.sha256) for p, e in c.files.items() if p.startswith(path + "/"))

        current = view(commit)
        found = commit
        while found.parent is not None:
            parent = self.repos.commit(found.repo_id, found.parent)
            if parent is None or view(parent) != current:
                break
            found = parent
        return found

    # ----- the CDN ---------------------------------------------------------------------------

    def cdn_url(self, repo_id: str, entry: Entry) -> str:
        """A signed URL for ``entry``'s bytes on the CDN, shaped like the Hub's LFS links."""
        if self._cdn is None:
            raise RuntimeError("the local hub's CDN is not serving")
        repo_hash = hashlib.sha256(repo_id.encode()).hexdigest()
        path = f"/repos/{repo_hash[:2]}/{repo_hash[2:4]}/{repo_hash}/{entry.sha256}"
        expires = str(int(time.time() + self.link_ttl))
        name = quote(entry.path.rsplit("/", 1)[-1])
        query = urlencode({
            "response-content-disposition": f"inline; filename*=UTF-8''{name};",
            "Expires": expires,
            "Key-Pair-Id": "K3ALOCALHUB",
        })
        signature = hmac.new(self._secret, f"{path}?{query}".encode(), "sha256").hexdigest()
        with self._links_lock:
            self._links[signature] = (repo_id, entry)
        host, port = self._cdn.server_address[:2]
        return f"http://{host}:{port}{path}?{query}&Signature={signature}"

    def cdn_link(self, path: str, query: str) -> tuple[str, Entry] | None:
        """(repo id, entry) a CDN request may read, or None: unsigned, tampered or expired."""
        unsigned, sep, signature = query.rpartition("&Signature=")
        if not sep:
            return None
        good = hmac.new(self._secret, f"{path}?{unsigned}".encode(), "sha256").hexdigest()
        if not hmac.compare_digest(good, signature):
            return None
        try:
            expires = int(dict(parse_qsl(unsigned)).get("Expires", "0"))
        except ValueError:
            return None
        if expires < time.time():
            return None
        with self._links_lock:
            return self._links.get(signature)

    @property
    def cdn_endpoint(self) -> str | None:
        if self._cdn is None:
            return None
        host, port = self._cdn.server_address[:2]
        return f"http://{host}:{port}"

    # ----- serving ---------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("the local hub is not serving; call start() or use serve()")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1 (port 0 = a free one) in a background thread; return the endpoint."""
        if self._server is not None:
            return self.endpoint
        if self.redirects:
            self._cdn = _Server(("127.0.0.1", 0), self, cdn=True)
            self._cdn_thread = _serve_in_thread(self._cdn, "localhub-cdn")
        self._server = _Server(("127.0.0.1", port), self)
        self._thread = _serve_in_thread(self._server, "localhub")
        return self.endpoint

    def stop(self) -> None:
        server, self._server = self._server, None
        cdn, self._cdn = self._cdn, None
        if cdn is not None:
            _stop(cdn, self._cdn_thread)
            self._cdn_thread = None
        if server is not None:
            _stop(server, self._thread)
            self._thread = None

    @contextmanager
    def serve(self, port: int = 0) -> Iterator[str]:
        endpoint = self.start(port)
        try:
            yield endpoint
        finally:
            self.stop()


def _serve_in_thread(server: _Server, name: str) -> threading.Thread:
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True
    )
    thread.start()
    return thread


def _stop(server: _Server, thread: threading.Thread | None) -> None:
    server.stopping.set()
    server.shutdown()
    # Keep-alive connections would leave their handler threads waiting for a next request.
    with server.live_lock:
        live = list(server.live)
    for conn in live:
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    server.server_close()
    if thread is not None:
        thread.join(timeout=5)
