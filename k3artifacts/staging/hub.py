"""The upstream: a Hugging Face Hub (or anything speaking its API), through huggingface_hub.

Metadata (commit resolution, listing with LFS sha256) goes through the real client, which
honours ``HF_ENDPOINT``, ``HF_TOKEN`` and the user's login. File bytes are streamed by
:mod:`k3artifacts.staging.download` from the URLs and headers this module builds, so that
they can be hashed as they arrive and resumed across processes (the client does neither:
huggingface_hub issues #3643 and #4196).
"""

from __future__ import annotations

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

    def _call(self, what: str, fn, *args, **kwargs):
        # The client retries some calls itself (tree listing) but not model_info: one 503 or
        # 429 while resolving the revision would otherwise fail a whole staging.
        attempt = 0
        while True:
            try:
                return self._call_once(what, fn, *args, **kwargs)
            except _Transient as exc:
                attempt += 1
                if attempt >= self.retry.attempts:
                    raise exc.error from None
                time.sleep(self.retry.delay(attempt - 1, exc.retry_after))

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
                raise _Transient(error, retry_after(response.headers.get("Retry-After"))) from None
            raise _Transient(error, None) from None

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
    """A metadata call failed in a way a retry may fix; ``error`` is what to raise if not."""

    def __init__(self, error: Unavailable, retry_after: float | None):
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after
