"""The upstream: a Hugging Face Hub (or anything speaking its API).

Metadata (commit resolution, the recursive tree listing with LFS sha256) is fetched here
through the network layer (:mod:`k3artifacts.net`), as the file bytes are, so every Hub call
has a connect and a read timeout and a deadline over the whole answer, 429/5xx are retried
after ``Retry-After`` or the Hub's ``RateLimit`` header, and the token never leaves the Hub's
origin: a tree listing whose ``Link: next`` points at another host is
followed without ``Authorization`` (``huggingface_hub``'s ``paginate`` would send it). The
endpoint and token are found as ``huggingface_hub`` finds them (``HF_ENDPOINT``, ``HF_TOKEN``,
the user's login). Every listing field is checked at this edge: a malformed one is refused
with the file named (``[listing]``, exit 3), never carried further.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urljoin, urlparse

from huggingface_hub import constants
from huggingface_hub.utils import build_hf_headers

from k3artifacts.errors import (
    BadAnswer,
    ConfigError,
    NotFound,
    Refusal,
    ReleaseRefused,
    Unavailable,
)
from k3artifacts.net.attempt import host_of, origin
from k3artifacts.net.calls import Peer, call
from k3artifacts.net.policy import RetryPolicy
from k3artifacts.net.redact import redact_url
from k3artifacts.revisions.refs import COMMIT
from k3artifacts.staging.download import Expected
from k3artifacts.staging.hub_refusals import credentials_refused

log = logging.getLogger(__name__)

#: Largest metadata answer read (a tree page of 1000 entries is ~300 KB).
MAX_METADATA_BYTES = 32 << 20
#: Most listing entries accepted for one revision (Kimi K3 has a few hundred files).
MAX_ENTRIES = 100_000
MAX_PAGES = 1_000
SHA256 = re.compile(r"^[0-9a-f]{64}$")
GIT_OID = re.compile(r"^[0-9a-f]{40}$")
#: The longest listed path worth looking at; rules.path_refusal decides what is acceptable.
MAX_LISTED_PATH = 4096
#: The largest file size believed (1 TiB; the Hub's LFS files are at most 50 GB). A listed
#: size is upstream's word, checked before anything (a range plan, a preallocation, a file
#: offset) is sized from it.
MAX_LISTED_SIZE = 1 << 40

UNAVAILABLE_HINT = ("check network access to the endpoint, then re-run (work done is kept); "
                    "--connect-timeout / --read-timeout (K3A_HTTP_*) tune how long a silent "
                    "hub is waited on")
UNREACHABLE_HINT = ("check the endpoint (set by --endpoint or HF_ENDPOINT; default "
                    "https://huggingface.co), DNS, the route and proxy (HTTPS_PROXY) to it, "
                    "then re-run")


@dataclass(frozen=True)
class RemoteFile:
    """One listing entry, parsed once at the edge."""

    path: str
    size: int
    entry_type: str
    lfs_sha256: str | None
    git_oid: str | None

    def expected(self, commit: str) -> Expected:
        return Expected(commit=commit, sha256=self.lfs_sha256)


def check_endpoint(endpoint: str) -> str:
    """A typo in the endpoint is a configuration error, not a hub outage worth retrying."""
    parsed = urlparse(endpoint)
    try:
        parsed.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        parsed = parsed._replace(netloc="")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(
            f"hub endpoint {redact_url(endpoint)!r} is not a valid http(s) URL "
            "(scheme://host[:port])",
            hint="set --endpoint (or HF_ENDPOINT) to e.g. https://huggingface.co",
        )
    return endpoint


class PinContradicted(ReleaseRefused):
    hint = ("the hub no longer serves that commit under its own id: check the repo id and "
            "endpoint; never stage the other commit in its place")


class HubSource:
    def __init__(
        self,
        endpoint: str | None = None,
        token: str | bool | None = None,
        retry: RetryPolicy | None = None,
    ):
        self.endpoint = check_endpoint(endpoint or constants.ENDPOINT).rstrip("/")
        #: The endpoint as messages show it (a password in it is not).
        self.shown = redact_url(self.endpoint)
        self.token = token
        self.retry = retry or RetryPolicy()

    # ----- calls -----------------------------------------------------------------------------

    def _call(self, what: str, url: str) -> tuple[Any, dict[str, str]]:
        """GET ``url`` as JSON through the network layer: the token only to the hub's origin
        (same-origin redirects, a renamed repo, are followed as the official client does),
        retries by the policy, the whole answer within its deadline."""
        peer = Peer(f"{what}: hub at {self.shown}", UNAVAILABLE_HINT, UNREACHABLE_HINT)
        answer = call("GET", url, peer, headers=self.headers(), policy=self.retry,
                      auth_origin=self.endpoint, limit=MAX_METADATA_BYTES)
        headers = {k.lower(): v for k, v in answer.headers.items()}
        if answer.status != 200:
            self._raise_for(what, answer.status, headers, answer.url)
        try:
            return json.loads(answer.body), headers
        except (ValueError, RecursionError):
            raise BadAnswer(f"{what}: the answer of the hub at {self.shown} "
                            f"({host_of(answer.url)}) is not JSON") from None

    def _raise_for(self, what: str, status: int, headers: dict[str, str], url: str) -> None:
        code = headers.get("x-error-code", "")
        message = headers.get("x-error-message", "")[:300]
        repo_id = what.partition("@")[0]
        refused = credentials_refused(what, status, headers, f"{self.shown}/{repo_id}")
        if refused is not None:
            raise refused
        if code == "RepoNotFound" or status == 401:
            raise NotFound(f"{what}: repository not found at {self.shown}",
                           hint="check the repo id, HF_ENDPOINT and HF_TOKEN")
        if code == "RevisionNotFound":
            raise NotFound(f"{what}: revision not found", hint="check the branch, tag or commit")
        if code == "EntryNotFound" or status == 404:
            raise NotFound(f"{what}: not found at {self.shown} ({message or status})")
        raise Unavailable(f"{what}: hub at {self.shown} unavailable: HTTP {status} from "
                          f"{host_of(url)}" + (f" ({message})" if message else ""),
                          hint=UNAVAILABLE_HINT)

    # ----- what the engine asks --------------------------------------------------------------

    def resolve(self, repo_id: str, revision: str) -> str:
        """Branch, tag or commit -> the 40-hex commit. Called once per staging.

        A revision given as a commit is a pin: the hub must answer that very commit."""
        what = f"{repo_id}@{revision}"
        url = (f"{self.endpoint}/api/models/{repo_id}/revision/{quote(revision, safe='')}")
        info, _ = self._call(what, url)
        sha = info.get("sha") if isinstance(info, dict) else None
        if not isinstance(sha, str) or not COMMIT.match(sha):
            raise BadAnswer(f"{what}: hub at {self.shown} returned no commit sha "
                            f"({str(sha)[:80]!r})")
        if COMMIT.match(revision) and sha != revision:
            raise PinContradicted([Refusal(
                what, "pinned-commit",
                f"pinned commit {revision} but the hub at {self.shown} answered commit {sha}",
            )])
        return sha

    def list_files(self, repo_id: str, commit: str) -> list[RemoteFile]:
        """Every file of ``commit``, each field checked; refused as a whole if any is bad."""
        what = f"{repo_id}@{commit}"
        url: str | None = (f"{self.endpoint}/api/models/{repo_id}/tree/{quote(commit, safe='')}?"
                           + urlencode({"recursive": "true", "expand": "false"}))
        files: list[RemoteFile] = []
        refusals: list[Refusal] = []
        count = pages = 0
        while url is not None:
            pages += 1
            page, headers = self._call(what, url)
            if not isinstance(page, list):
                raise ReleaseRefused([Refusal(what, "listing", "the tree listing is not a list")])
            count += len(page)
            if count > MAX_ENTRIES or pages > MAX_PAGES:
                raise ReleaseRefused([Refusal(
                    what, "listing", f"more than {MAX_ENTRIES} entries or {MAX_PAGES} pages")])
            for index, raw in enumerate(page):
                parsed = parse_entry(raw, count - len(page) + index)
                if isinstance(parsed, Refusal):
                    refusals.append(parsed)
                elif parsed is not None:
                    files.append(parsed)
            url = self._next_page(what, url, headers.get("link"))
        if refusals:
            raise ReleaseRefused(refusals)
        return sorted(files, key=lambda f: f.path)

    def _next_page(self, what: str, current: str, link: str | None) -> str | None:
        target = _next_link(link)
        if target is None:
            return None
        target = urljoin(current, target)
        if urlparse(target).scheme not in ("http", "https"):
            raise ReleaseRefused([Refusal(
                what, "listing", f"next page is not an http(s) URL: {redact_url(target)[:200]!r}")])
        if origin(target) != origin(self.endpoint):
            log.warning("%s: the listing continues on %s; the token is not sent there",
                        what, host_of(target))
        return target

    def file_url(self, repo_id: str, commit: str, path: str) -> str:
        # As huggingface_hub's hf_hub_url spells a model's file (whose module, imported for
        # this line, was 20-25 ms of every staging process's start).
        return f"{self.endpoint}/{repo_id}/resolve/{quote(commit, safe='')}/{quote(path)}"

    def headers(self) -> dict[str, str]:
        return build_hf_headers(token=self.token, library_name="k3artifacts")


def parse_entry(raw: Any, index: int) -> RemoteFile | Refusal | None:
    """One tree entry -> a file, None (a directory), or the refusal naming what is wrong."""
    if not isinstance(raw, dict):
        return Refusal(f"<entry {index}>", "listing", f"not an object: {str(raw)[:80]!r}")
    if raw.get("type") == "directory":
        return None  # its files are listed too (recursive); they are what is checked
    path = raw.get("path")
    if not isinstance(path, str) or not path or len(path) > MAX_LISTED_PATH:
        shown = path[:120] + "..." if isinstance(path, str) and len(path) > 120 else path
        return Refusal(f"<entry {index}>", "listing", f"bad path {shown!r}")

    def bad(detail: str) -> Refusal:
        return Refusal(path, "listing", detail)

    kind = raw.get("type")
    if kind != "file":
        return Refusal(path, "not-a-file", f"listing entry of type {str(kind)[:40]!r}")
    size = raw.get("size")
    if type(size) is not int or size < 0:
        return bad(f"size is {str(size)[:40]!r}, not a non-negative integer")
    if size > MAX_LISTED_SIZE:
        return bad(f"size {str(size)[:40]} is beyond any file the Hub serves (at most "
                   f"{MAX_LISTED_SIZE} bytes are believed)")
    oid = raw.get("oid")
    if not isinstance(oid, str) or not GIT_OID.match(oid):
        return bad(f"oid {str(oid)[:80]!r} is not a 40-hex git blob id")
    lfs = raw.get("lfs")
    if lfs is None:
        return RemoteFile(path=path, size=size, entry_type="file", lfs_sha256=None, git_oid=oid)
    if not isinstance(lfs, dict):
        return bad(f"lfs is {str(lfs)[:40]!r}, not an object")
    sha = lfs.get("oid", lfs.get("sha256"))
    if not isinstance(sha, str) or not SHA256.match(sha):
        return bad(f"lfs oid {str(sha)[:80]!r} is not a 64-hex sha256")
    lfs_size = lfs.get("size", size)
    if type(lfs_size) is not int or lfs_size != size:
        return bad(f"lfs size {str(lfs_size)[:40]!r} differs from the entry's size {size}")
    return RemoteFile(path=path, size=size, entry_type="file", lfs_sha256=sha, git_oid=None)


def _next_link(link: str | None) -> str | None:
    """The ``rel="next"`` target of a Link header (RFC 8288), as GitHub and the Hub write it."""
    if not link:
        return None
    for part in link.split(","):
        target, _, params = part.partition(";")
        target = target.strip()
        if target.startswith("<") and target.endswith(">") and re.search(
            r'rel\s*=\s*"?next"?', params
        ):
            return target[1:-1]
    return None
