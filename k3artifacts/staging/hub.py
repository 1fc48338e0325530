"""The upstream: a Hugging Face Hub (or anything speaking its API), through huggingface_hub.

Metadata (commit resolution, listing with LFS sha256) goes through the real client, which
honours ``HF_ENDPOINT``, ``HF_TOKEN`` and the user's login. File bytes are streamed by
:mod:`k3artifacts.staging.download` from the URLs and headers this module builds, so that
they can be hashed as they arrive and resumed across processes (the client does neither:
huggingface_hub issues #3643 and #4196).
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlparse

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import build_hf_headers

from k3artifacts.errors import ConfigError, NotFound, Unavailable
from k3artifacts.revisions.refs import COMMIT
from k3artifacts.staging.download import RETRY_STATUS, RetryPolicy, retry_after

log = logging.getLogger(__name__)

#: Before the hub ever answered, a failure to connect is retried once, this soon.
FIRST_CONTACT_RETRY_S = 0.5


@dataclass(frozen=True)
class RemoteFile:
    """One listing entry, parsed once at the edge."""

    path: str
    size: int
    entry_type: str
    lfs_sha256: str | None
    git_oid: str | None


def check_endpoint(endpoint: str) -> str:
    """A typo in the endpoint is a configuration error, not a hub outage worth retrying."""
    parsed = urlparse(endpoint)
    try:
        parsed.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        parsed = parsed._replace(netloc="")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(
            f"hub endpoint {endpoint!r} is not a valid http(s) URL (scheme://host[:port])",
            hint="set --endpoint (or HF_ENDPOINT) to e.g. https://huggingface.co",
        )
    return endpoint


class HubSource:
    def __init__(
        self,
        endpoint: str | None = None,
        token: str | bool | None = None,
        retry: RetryPolicy | None = None,
    ):
        self.endpoint = check_endpoint(endpoint or constants.ENDPOINT).rstrip("/")
        self.token = token
        self.retry = retry or RetryPolicy()
        self.api = HfApi(endpoint=self.endpoint, token=token)
        #: Whether the hub has answered once. Before that, "cannot connect" means a wrong
        #: endpoint, no route or no DNS, which retrying for a minute will not change.
        self.contacted = False

    def _call(self, what: str, fn, *args, **kwargs):
        # The client retries some calls itself (tree listing) but not model_info: one 503 or
        # 429 while resolving the revision would otherwise fail a whole staging.
        attempt = 0
        while True:
            try:
                result = self._call_once(what, fn, *args, **kwargs)
                self.contacted = True
                return result
            except _Transient as exc:
                attempt += 1
                if exc.unreachable and not self.contacted:
                    if attempt >= 2:
                        raise self._unreachable(exc.cause) from None
                    time.sleep(FIRST_CONTACT_RETRY_S)
                    continue
                if exc.answered:
                    self.contacted = True
                if attempt >= self.retry.attempts:
                    raise exc.error from None
                delay = self.retry.delay(attempt - 1, exc.retry_after)
                log.warning("%s; attempt %d of %d, retrying in %.1fs",
                            exc.error, attempt, self.retry.attempts, delay)
                time.sleep(delay)

    def _unreachable(self, cause: BaseException | None) -> Unavailable:
        return Unavailable(
            f"hub at {self.endpoint} unavailable (first contact): {_reason(cause)}",
            hint="check the endpoint (set by --endpoint or HF_ENDPOINT; default "
            "https://huggingface.co), DNS, the route and proxy (HTTPS_PROXY) to it, then re-run",
        )

    def _call_once(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GatedRepoError as exc:
            raise NotFound(
                f"{what}: gated repository, access not granted ({exc})",
                hint="accept the model's terms on the Hub and set HF_TOKEN",
            ) from None
        except RepositoryNotFoundError:
            raise NotFound(
                f"{what}: repository not found at {self.endpoint}",
                hint="check the repo id, HF_ENDPOINT and HF_TOKEN",
            ) from None
        except RevisionNotFoundError:
            raise NotFound(
                f"{what}: revision not found", hint="check the branch, tag or commit"
            ) from None
        except EntryNotFoundError:
            raise NotFound(f"{what}: not found") from None
        except (HfHubHTTPError, httpx2.HTTPError, OSError) as exc:
            error = Unavailable(
                f"{what}: hub at {self.endpoint} unavailable: {exc}",
                hint="check network access to HF_ENDPOINT, then re-run (work done is kept)",
            )
            response = getattr(exc, "response", None)
            if isinstance(exc, HfHubHTTPError) and response is not None:
                if response.status_code not in RETRY_STATUS:
                    raise error from None
                raise _Transient(
                    error, retry_after(response.headers.get("Retry-After")), answered=True
                ) from None
            raise _Transient(error, None, cause=exc) from None

    def resolve(self, repo_id: str, revision: str) -> str:
        """Branch, tag or commit -> the 40-hex commit. Called once per staging."""
        info = self._call(f"{repo_id}@{revision}", self.api.model_info, repo_id, revision=revision)
        sha = info.sha
        if not sha or not COMMIT.match(sha):
            raise Unavailable(f"{repo_id}@{revision}: hub returned no commit sha ({sha!r})")
        return sha

    def list_files(self, repo_id: str, commit: str) -> list[RemoteFile]:
        entries = self._call(
            f"{repo_id}@{commit}",
            lambda: list(self.api.list_repo_tree(repo_id, revision=commit, recursive=True)),
        )
        files = []
        for entry in entries:
            if isinstance(entry, RepoFile):
                files.append(
                    RemoteFile(
                        path=entry.path,
                        size=int(entry.size),
                        entry_type="file",
                        lfs_sha256=entry.lfs.sha256 if entry.lfs else None,
                        git_oid=None if entry.lfs else entry.blob_id,
                    )
                )
        return sorted(files, key=lambda f: f.path)

    def file_url(self, repo_id: str, commit: str, path: str) -> str:
        return hf_hub_url(repo_id, path, revision=commit, endpoint=self.endpoint)

    def headers(self) -> dict[str, str]:
        return build_hf_headers(token=self.token, library_name="k3artifacts")


class _Transient(Exception):
    """A metadata call failed in a way a retry may fix; ``error`` is what to raise if not.

    ``answered``: the hub did answer (an HTTP status). ``unreachable``: no connection could be
    made at all (DNS, refused, TLS handshake)."""

    def __init__(
        self,
        error: Unavailable,
        retry_after: float | None,
        *,
        answered: bool = False,
        cause: BaseException | None = None,
    ):
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after
        self.answered = answered
        self.cause = cause
        self.unreachable = cause is not None and _is_unreachable(cause)


def _is_unreachable(exc: BaseException) -> bool:
    if isinstance(exc, httpx2.ConnectError):
        return True
    return isinstance(exc, (socket.gaierror, ConnectionRefusedError, ssl.SSLError))


def _reason(exc: BaseException | None) -> str:
    text = str(exc)
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, socket.gaierror) or "Name or service not known" in text:
            return f"the host name does not resolve ({text})"
        if isinstance(cause, ConnectionRefusedError) or "Connection refused" in text:
            return f"connection refused ({text})"
        if isinstance(cause, ssl.SSLError) or "SSL" in text or "certificate" in text:
            return f"TLS handshake failed ({text})"
        cause = cause.__cause__ or cause.__context__
    return text
