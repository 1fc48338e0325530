"""The HTTP face of the local hub: the subset of the Hugging Face Hub API that
``huggingface_hub`` 2.4 uses to resolve a revision, list files and download them, and the CDN
that serves LFS bytes on another origin, as huggingface.co does.

Routes of the hub (model repos only, ``org/name`` ids)::

    GET      /api/models/{org}/{name}[/revision/{rev}]      model_info (blobs=true -> sizes, LFS)
    GET      /api/models/{org}/{name}/tree/{rev}[/{path}]   list_repo_tree, Link-header pagination
    GET|HEAD /{org}/{name}/resolve/{rev}/{path}             small files: the bytes; LFS files:
                                                            302 to the CDN with X-Repo-Commit,
                                                            X-Linked-Etag, X-Linked-Size, ETag

and of the CDN (its own server, another port)::

    GET|HEAD /repos/{aa}/{bb}/{repo hash}/{sha256}?...&Expires=..&Signature=..   bytes, Range

The CDN answers like an S3 presigned URL behind CloudFront: a request carrying
``Authorization`` is refused with 400 (only one auth mechanism allowed), a bad or expired
signature with 403. Files are served straight from the blob store with ``sendfile`` (no copy
through Python) unless a fault has to alter the bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlencode

if TYPE_CHECKING:
    from k3artifacts.localhub import LocalHub

from k3artifacts.errors import Refusal
from k3artifacts.localhub.repos import Commit, Entry
from k3artifacts.staging.license import card_metadata

_READ_CHUNK = 1024 * 1024
_TREE_EXPAND_PAGE = 50  # the real Hub pages expanded listings by 50


@dataclass
class BodyPlan:
    """How to answer one request, as a test stand-in decided (by default: plainly). Offsets
    are relative to the body start, except transforms, which get the absolute file offset of
    the chunk they alter."""

    status: int | None = None  # answer this status (with retry_after) instead
    retry_after: int | None = None
    stall_before: float = 0.0
    stalls: list[tuple[int, float]] = field(default_factory=list)
    trickle: tuple[int, int, float] | None = None  # (after bytes, chunk, seconds between)
    json_edits: list[Callable[[Any], Any]] = field(default_factory=list)
    next_origin: str | None = None
    cut_at: int | None = None  # close the connection after this many body bytes
    short_by: int = 0  # close after body length minus this
    transforms: list[Callable[[int, bytearray], None]] = field(default_factory=list)
    whole: bool = False  # ignore Range and answer 200 with the whole body, as some proxies do
    header_trickle: float = 0.0  # send the status line and headers one byte every this long


@dataclass(frozen=True)
class RequestRecord:
    """One request as the hub answered it; ``target`` is the repo file path for ``resolve``
    requests and the URL path otherwise (the same string faults are matched against)."""

    method: str
    url: str
    query: str
    repo_id: str | None
    revision: str | None
    target: str
    range: str | None
    status: int
    bytes_sent: int
    #: "hub" or "cdn": which server answered.
    origin: str = "hub"
    #: Whether the request carried an Authorization header.
    authorization: bool = False
    #: time.monotonic() when the answer was complete.
    time: float = 0.0

    @property
    def is_file(self) -> bool:
        """A request for a file's bytes: on the CDN, or a resolve the hub answered itself
        (not with a redirect)."""
        return self.origin == "cdn" or ("/resolve/" in self.url and self.status not in (302, 307))


class HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.commit = commit


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, addr: tuple[str, int], state: LocalHub, *, cdn: bool = False):
        self.state = state
        self.stopping = threading.Event()
        self.live: set[socket.socket] = set()
        self.live_lock = threading.Lock()
        super().__init__(addr, _CdnHandler if cdn else _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError) or self.stopping.is_set():
            return  # a client going away mid-answer is normal (and exactly what faults cause)
        self.state.server_errors.append(traceback.format_exc())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    server_version = "k3a-localhub"
    sys_version = ""
    origin = "hub"

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in separate writes; with Nagle on, a small body waits for the
        # client's delayed ACK (~40 ms a file), which no real Hub or CDN adds.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.live_lock:
            self.server.live.add(self.connection)

    def finish(self) -> None:
        with self.server.live_lock:
            self.server.live.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base class name
        pass

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)

    def flush_headers(self) -> None:
        interval = self._plan.header_trickle
        if not interval:
            super().flush_headers()
            return
        data = b"".join(getattr(self, "_headers_buffer", []))
        self._headers_buffer = []
        for i in range(len(data)):
            if self.server.stopping.wait(interval):
                return
            self.wfile.write(data[i:i + 1])

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    # ----- dispatch --------------------------------------------------------------------------

    def _dispatch(self, *, head: bool) -> None:
        st = self.server.state
        self._status = 0
        self._sent = 0
        self._plan = BodyPlan()
        self._repo_id: str | None = None
        self._revision: str | None = None
        raw, _, query = self.path.partition("?")
        self._target = unquote(raw)
        self._query = query
        st.begin_request()
        try:
            try:
                self._check_auth(st.token)
                self._route(raw, head=head)
            except HubError as e:
                self._send_error(e, head=head)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception:
            st.server_errors.append(traceback.format_exc())
            self.close_connection = True
            if self._status == 0:
                self._send_json(500, {"error": "internal error in the local hub"}, head=head)
        finally:
            st.record(
                RequestRecord(
                    method=self.command,
                    url=raw,
                    query=query,
                    repo_id=self._repo_id,
                    revision=self._revision,
                    target=self._target,
                    range=self.headers.get("Range"),
                    status=self._status,
                    bytes_sent=self._sent,
                    origin=self.origin,
                    authorization="Authorization" in self.headers,
                    time=time.monotonic(),
                )
            )

    def _check_auth(self, token: str | None) -> None:
        st = self.server.state
        got = self.headers.get("Authorization")
        if got is not None and st.tokens and got.removeprefix("Bearer ") not in st.tokens:
            # huggingface.co answers a token it does not know so on any repo, public too.
            raise HubError(401, None, "Invalid credentials in Authorization header")
        if token is not None and got is None:
            # What the Hub says to an anonymous request for a private repo.
            raise HubError(401, "RepoNotFound", "Repository not found")

    def _check_gate(self, repo_id: str) -> None:
        """A gated repo's file: only for a token granted access, as huggingface.co serves it."""
        st = self.server.state
        if repo_id not in st.gated:
            return
        got = self.headers.get("Authorization")
        if got is None:
            raise HubError(401, "GatedRepo", f"Access to model {repo_id} is restricted. You "
                           "must have access to it and be authenticated to access it. Please "
                           "log in.")
        if got.removeprefix("Bearer ") not in st.granted.get(repo_id, set()):
            raise HubError(403, "GatedRepo", f"Access to model {repo_id} is restricted and you "
                           f"are not in the authorized list. Visit {st.endpoint}/{repo_id} to "
                           "ask for access.")

    def _route(self, raw: str, *, head: bool) -> None:
        if raw.startswith("/api/models/"):
            segs = raw[len("/api/models/") :].split("/")
            if len(segs) < 2 or not segs[0] or not segs[1]:
                raise HubError(404, None, "Not Found")
            self._repo_id = f"{unquote(segs[0])}/{unquote(segs[1])}"
            rest = segs[2:]
            if not rest or rest == [""]:
                self._model_info("main", head=head)
            elif rest[0] == "revision" and len(rest) >= 2:
                self._model_info(unquote("/".join(rest[1:])), head=head)
            elif rest[0] == "tree" and len(rest) >= 2:
                self._tree(unquote(rest[1]), unquote("/".join(rest[2:])), head=head)
            else:
                raise HubError(404, None, "Not Found")
            return
        segs = raw.lstrip("/").split("/")
        if len(segs) >= 5 and segs[2] == "resolve":
            self._repo_id = f"{unquote(segs[0])}/{unquote(segs[1])}"
            self._resolve_file(unquote(segs[3]), unquote("/".join(segs[4:])), head=head)
            return
        raise HubError(404, None, "Not Found")

    def _commit_for(self, revision: str) -> Commit:
        st = self.server.state
        repo_id = self._repo_id
        assert repo_id is not None
        self._revision = revision
        if not st.repos.repo_exists(repo_id):
            raise HubError(404, "RepoNotFound", "Repository not found")
        commit_id = st.repos.resolve(repo_id, revision)
        if commit_id is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        commit = st.repos.commit(repo_id, commit_id)
        assert commit is not None
        return commit

    def _faults(self, target: str, stage: str = "file") -> BodyPlan:
        self._target = target
        plan = self.server.state.plan_answer(
            method=self.command, repo_id=self._repo_id, target=target, stage=stage
        )
        self._plan = plan  # how this request's headers go out too (flush_headers)
        if plan.stall_before:
            self.server.stopping.wait(plan.stall_before)
        if plan.status is not None:
            headers = {} if plan.retry_after is None else {"Retry-After": str(plan.retry_after)}
            self._send_json(
                plan.status,
                {"error": f"injected fault: status {plan.status}"},
                head=False,
                headers=headers,
            )
            raise _Answered
        return plan

    # ----- API -------------------------------------------------------------------------------

    def _model_info(self, revision: str, *, head: bool) -> None:
        try:
            self._plan = self._faults(self._target)
        except _Answered:
            return
        commit = self._commit_for(revision)
        blobs = _truthy(dict(parse_qsl(self._query)).get("blobs"))
        siblings = []
        for e in commit.files.values():
            s: dict[str, Any] = {"rfilename": e.path}
            if blobs:
                s["blobId"] = e.git_oid
                s["size"] = e.size
                if e.lfs:
                    s["lfs"] = {"sha256": e.sha256, "size": e.size, "pointerSize": e.pointer_size}
            siblings.append(s)
        org = commit.repo_id.split("/", 1)[0]
        body: dict[str, Any] = {
            "_id": hashlib.sha1(commit.repo_id.encode()).hexdigest()[:24],
            "id": commit.repo_id,
            "modelId": commit.repo_id,
            "author": org,
            "sha": commit.id,
            "lastModified": commit.date,
            "createdAt": commit.date,
            "private": self.server.state.token is not None,
            "disabled": False,
            "gated": "auto" if commit.repo_id in self.server.state.gated else False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "library_name": "transformers",
            "pipeline_tag": "text-generation",
            "siblings": siblings,
            "usedStorage": sum(e.size for e in commit.files.values()),
        }
        card = self._card_data(commit)
        if card is not None:
            body["cardData"] = card
        self._send_json(200, body, head=head)

    def _card_data(self, commit: Commit) -> dict[str, Any] | None:
        readme = commit.files.get("README.md")
        if readme is None or readme.size > 1024 * 1024:
            return None
        # Parsed as the Hub's own bounded parser would: an alias bomb (a test's hostile card)
        # gets no cardData rather than hundreds of MB of JSON.
        try:
            return card_metadata(
                self.server.state.repos.blob_path(readme.sha256).read_bytes()) or None
        except Refusal:
            return None

    def _tree(self, revision: str, path: str, *, head: bool) -> None:
        try:
            self._plan = self._faults(self._target)
        except _Answered:
            return
        commit = self._commit_for(revision)
        query = parse_qsl(self._query, keep_blank_values=True)
        params = dict(query)
        recursive = _truthy(params.get("recursive"))
        expand = _truthy(params.get("expand"))
        entries = _tree_entries(commit, path, recursive=recursive)
        if entries is None:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on {revision}", commit.id)
        st = self.server.state
        page = min(st.page_size, _TREE_EXPAND_PAGE) if expand else st.page_size
        start = _decode_cursor(params.get("cursor"))
        chunk = entries[start : start + page]
        out = []
        for kind, name, value in chunk:
            if kind == "file":
                assert isinstance(value, Entry)
                item: dict[str, Any] = {
                    "type": "file",
                    "oid": value.git_oid,
                    "size": value.size,
                    "path": name,
                }
                if value.lfs:
                    item["lfs"] = {
                        "oid": value.sha256,
                        "size": value.size,
                        "pointerSize": value.pointer_size,
                    }
            else:
                item = {"type": "directory", "oid": value, "size": 0, "path": name}
            if expand:
                last = st.last_commit(commit, name, kind)
                item["lastCommit"] = {"id": last.id, "title": last.message, "date": last.date}
            out.append(item)
        headers = {}
        if start + page < len(entries):
            rest = [(k, v) for k, v in query if k != "cursor"]
            rest.append(("cursor", _encode_cursor(start + page)))
            host = self.headers.get("Host") or "{}:{}".format(*self.server.server_address[:2])
            raw = self.path.partition("?")[0]
            base = self._plan.next_origin or f"http://{host}"
            headers["Link"] = f'<{base}{raw}?{urlencode(rest)}>; rel="next"'
        self._send_json(200, out, head=head, headers=headers)

    # ----- files -----------------------------------------------------------------------------

    def _resolve_file(self, revision: str, path: str, *, head: bool) -> None:
        self._target = path
        commit = self._commit_for(revision)
        entry = commit.files.get(path)
        if entry is None:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on {revision}", commit.id)
        self._check_gate(commit.repo_id)
        st = self.server.state
        redirect = entry.lfs and st.redirects
        try:
            plan = self._faults(path, "resolve" if redirect else "file")
        except _Answered:
            return
        if redirect:
            self._redirect(commit, entry, head=head)
            return
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "ETag": f'"{entry.etag}"',
            "X-Repo-Commit": commit.id,
        }
        if entry.lfs:
            headers["X-Linked-Etag"] = f'"{entry.sha256}"'
            headers["X-Linked-Size"] = str(entry.size)
        self._send_file(entry, headers, plan, head=head)

    def _redirect(self, commit: Commit, entry: Entry, *, head: bool) -> None:
        """What huggingface.co answers for an LFS file: 302 to a signed CDN URL, with the
        file's identity in headers (the client cannot learn it from the CDN)."""
        location = self.server.state.cdn_url(commit.repo_id, entry)
        body = f"Found. Redirecting to {location}".encode()
        self.send_response(302)
        for k, v in {
            "Content-Type": "text/plain; charset=utf-8",
            "Content-Length": str(len(body)),
            "Location": location,
            "X-Repo-Commit": commit.id,
            "X-Linked-Etag": f'"{entry.sha256}"',
            "X-Linked-Size": str(entry.size),
            "ETag": f'"{entry.sha256}"',
            "Vary": "Origin, Accept",
        }.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)
            self._sent += len(body)

    def _send_file(self, entry: Entry, headers: dict[str, str], plan: BodyPlan, *,
                   head: bool) -> None:
        size = entry.size
        span = None if plan.whole else _parse_range(self.headers.get("Range"), size)
        if span == "unsatisfiable":
            headers["Content-Range"] = f"bytes */{size}"
            self._send_json(
                416, {"error": "Requested Range Not Satisfiable"}, head=head, headers=headers
            )
            return
        if span is None:
            status, start, length = 200, 0, size
        else:
            status, start, length = 206, span[0], span[1] - span[0] + 1
            headers["Content-Range"] = f"bytes {span[0]}-{span[1]}/{size}"
        self.send_response(status)
        headers["Content-Length"] = str(length)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        with open(self.server.state.repos.blob_path(entry.sha256), "rb") as f:
            self._send_body(f, start, length, plan)

    def _send_body(self, f: Any, start: int, length: int, plan: BodyPlan) -> None:
        limit = length
        if plan.cut_at is not None:
            limit = min(limit, plan.cut_at)
        if plan.short_by:
            limit = min(limit, max(length - plan.short_by, 0))
        fast = limit if plan.trickle is None else min(limit, plan.trickle[0])
        stalls = sorted((off, s) for off, s in plan.stalls if off < fast)
        pos = 0
        for off, seconds in [*stalls, (fast, 0.0)]:
            if off > pos:
                self._send_span(f, start + pos, off - pos, plan)
                pos = off
            if seconds:
                self.server.stopping.wait(seconds)
        if plan.trickle is not None:
            _, chunk, interval = plan.trickle
            while pos < limit and not self.server.stopping.is_set():
                n = min(chunk, limit - pos)
                self._send_span(f, start + pos, n, plan)
                pos += n
                self.server.stopping.wait(interval)
        if limit < length:
            # Promised Content-Length, delivered less: the client must see a broken transfer.
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _send_span(self, f: Any, offset: int, count: int, plan: BodyPlan) -> None:
        if not plan.transforms:
            sent = 0
            try:
                sent = self.connection.sendfile(f, offset, count)
            finally:
                self._sent += sent
            return
        end = offset + count
        while offset < end:
            buf = bytearray(os.pread(f.fileno(), min(_READ_CHUNK, end - offset), offset))
            if not buf:
                raise OSError("blob shorter than its index entry")
            for t in plan.transforms:
                t(offset, buf)
            self.connection.sendall(buf)
            self._sent += len(buf)
            offset += len(buf)

    # ----- plumbing --------------------------------------------------------------------------

    def _send_error(self, e: HubError, *, head: bool) -> None:
        headers = {"X-Error-Message": e.message.encode("ascii", "replace").decode("ascii")}
        if e.code:
            headers["X-Error-Code"] = e.code
        if e.commit:
            headers["X-Repo-Commit"] = e.commit
        self._send_json(e.status, {"error": e.message}, head=head, headers=headers)

    def _send_json(
        self, status: int, body: Any, *, head: bool, headers: dict[str, str] | None = None
    ) -> None:
        if status == 200:
            for edit in self._plan.json_edits:
                body = edit(body)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(data)
            self._sent += len(data)


class _CdnHandler(_Handler):
    """The CDN's origin: bytes by sha256 under a signed URL, nothing else."""

    server_version = "k3a-localcdn"
    origin = "cdn"

    def _check_auth(self, token: str | None) -> None:
        del token
        if "Authorization" in self.headers:
            # What S3 says when a presigned URL also carries an Authorization header.
            raise HubError(400, "InvalidArgument", "Only one auth mechanism allowed; only the "
                           "X-Amz-Algorithm query parameter, Signature query string parameter "
                           "or the Authorization header should be specified")

    def _route(self, raw: str, *, head: bool) -> None:
        st = self.server.state
        link = st.cdn_link(raw, self._query)
        if link is None:
            raise HubError(403, "AccessDenied", "Access Denied")
        repo_id, entry = link
        self._repo_id = repo_id
        try:
            plan = self._faults(entry.path)
        except _Answered:
            return
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "ETag": f'"{entry.sha256}"',
            "Cache-Control": "public, max-age=604800, immutable",
            "X-Cache": "Miss from cloudfront",
        }
        self._send_file(entry, headers, plan, head=head)

    def _send_error(self, e: HubError, *, head: bool) -> None:
        body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{e.code}</Code>"
                f"<Message>{e.message}</Message></Error>").encode()
        self.send_response(e.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
            self._sent += len(body)


class _Answered(Exception):
    """A fault already answered this request."""


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


def _encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def _decode_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        return int(json.loads(base64.urlsafe_b64decode(cursor.encode()))["offset"])
    except (ValueError, KeyError, TypeError) as e:
        raise HubError(400, None, f"bad cursor: {cursor!r}") from e


def _tree_entries(
    commit: Commit, path: str, *, recursive: bool
) -> list[tuple[str, str, Entry | str]] | None:
    """Sorted (kind, path, Entry or tree oid) under ``path``; None when it is no directory."""
    prefix = path.strip("/") + "/" if path.strip("/") else ""
    files: dict[str, Entry] = {}
    dirs: dict[str, list[str]] = {}
    for name, entry in commit.files.items():
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix) :].split("/")
        for i in range(1, len(parts)):
            d = prefix + "/".join(parts[:i])
            dirs.setdefault(d, []).append(entry.git_oid)
            if not recursive:
                break
        if recursive or len(parts) == 1:
            files[name] = entry
    if prefix and not files and not dirs:
        return None
    out: list[tuple[str, str, Entry | str]] = [("file", n, e) for n, e in files.items()]
    for d, oids in dirs.items():
        oid = hashlib.sha1("\n".join(sorted(oids)).encode()).hexdigest()
        out.append(("directory", d, oid))
    out.sort(key=lambda t: t[1])
    return out


def _parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """(first, last) inclusive, "unsatisfiable", or None to ignore the header and send it all
    (what RFC 9110 allows for syntax we do not support, e.g. several ranges)."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, sep, last = header[len("bytes=") :].strip().partition("-")
    if not sep:
        return None
    try:
        if first == "":
            n = int(last)
            if n <= 0:
                return "unsatisfiable"
            return (max(size - n, 0), size - 1) if size else "unsatisfiable"
        a = int(first)
        b = int(last) if last else size - 1
    except ValueError:
        return None
    if a >= size:
        return "unsatisfiable"
    if b < a:
        return None
    return (a, min(b, size - 1))
