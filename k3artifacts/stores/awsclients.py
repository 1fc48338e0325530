"""botocore clients configured once: endpoint, retries, timeouts, and AWS errors as K3A errors.

Every usual boto3 setting is honoured (``AWS_PROFILE``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``,
credentials chain, ``AWS_ENDPOINT_URL_S3``, ``AWS_RETRY_MODE``, ``AWS_MAX_ATTEMPTS``, the shared
config file). On top of them:

* ``K3A_S3_ENDPOINT_URL`` (or an explicit ``endpoint_url``) points S3 at another server (moto,
  MinIO, a VPC endpoint); path-style addressing is used then, since such servers rarely resolve
  ``bucket.host`` names.
* Retries default to botocore's ``standard`` mode with 10 attempts: a 1.5 TB upload meets
  503 SlowDown and the odd 500 as a matter of course, and ``standard`` backs off with jitter on
  both. An explicit ``AWS_RETRY_MODE`` / ``AWS_MAX_ATTEMPTS`` (env or profile) wins.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import botocore.exceptions as bex
import botocore.session
from botocore.config import Config
from botocore.exceptions import DataNotFoundError
from botocore.loaders import JSONFileLoader, Loader

from k3artifacts.errors import ConfigError, K3AError, NotFound, Unavailable
from k3artifacts.settings import load

S3_ENDPOINT_ENV = "K3A_S3_ENDPOINT_URL"

log = logging.getLogger(__name__)

#: Before any answer from the endpoint, a failure to connect is retried once, this soon.
FIRST_CONTACT_RETRY_S = 0.5

DEFAULT_RETRY_MODE = "standard"
#: Attempts per request, the first included.
DEFAULT_MAX_ATTEMPTS = 10
CONNECT_TIMEOUT_S = 10
#: Time to wait for response bytes. A part upload is answered as soon as its bytes arrive, so
#: this does not bound how long a part may take to send.
READ_TIMEOUT_S = 120

_CONNECTION_ERRORS = (
    bex.EndpointConnectionError,
    bex.ConnectionClosedError,
    bex.ConnectTimeoutError,
    bex.ReadTimeoutError,
    bex.ProxyConnectionError,
    bex.SSLError,
)


def s3_endpoint(explicit: str | None = None) -> str | None:
    """The S3 endpoint to use: ``explicit``, else ``$K3A_S3_ENDPOINT_URL``, else boto3's own."""
    endpoint = explicit or load().s3_endpoint_url
    if endpoint is not None:
        check_endpoint(endpoint)
    return endpoint


def check_endpoint(endpoint: str) -> None:
    parsed = urlparse(endpoint)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(
            f"endpoint URL {endpoint!r} is not an http(s) URL with a host",
            hint=f"set {S3_ENDPOINT_ENV} (or --endpoint-url) to e.g. http://127.0.0.1:5000",
        )
    try:
        parsed.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise ConfigError(
            f"endpoint URL {endpoint!r} has a malformed port",
            hint="write the endpoint as scheme://host:port",
        ) from None


class _DictJSONFileLoader(JSONFileLoader):
    """botocore's model files parsed into plain dicts, which keep their order as the
    ``OrderedDict`` botocore asks for does: S3's model and the endpoint data (1.5 MB of JSON)
    parse in 13 ms of CPU rather than 31 on the 2-core machine."""

    def load_file(self, file_path: str) -> Any:
        for ext, opener in ((".json", open), (".json.gz", gzip.open)):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError), \
                    opener(file_path + ext, "rb") as fh:
                return json.loads(fh.read().decode("utf-8"))
        return None


class _KnownServices:
    """The services a loader has models for, asked one at a time: whether ``name`` is one
    looks in that service's directory alone."""

    def __init__(self, loader: _ModelLoader, type_name: str):
        self.loader, self.type_name = loader, type_name

    def __contains__(self, name: object) -> bool:
        try:
            return bool(self.loader.list_api_versions(name, self.type_name))
        except DataNotFoundError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(Loader.list_available_services(self.loader, self.type_name))


class _ModelLoader(Loader):
    """botocore's data loader, less a listing every client paid before its first request:
    to check that ``s3`` exists, botocore listed the directory of every service it knows
    (900 directories, twice: 25-30 ms of CPU a client on the 2-core machine, more wall time
    on a busy disk). Listing them all is left to whoever iterates."""

    FILE_LOADER_CLASS = _DictJSONFileLoader

    def list_available_services(self, type_name: str) -> Any:
        return _KnownServices(self, type_name)


_loaders: dict[str | None, Loader] = {}
_loaders_lock = threading.Lock()


def _shared_loader(data_path: str | None) -> Loader:
    """One botocore data loader per process (per data path). Each session would otherwise
    parse S3's service model and the endpoint rules again for every client, about 0.1 s a
    client; a pull makes two and every command pays it before its first byte (issue 22). The
    loader only caches botocore's own read-only JSON, so sessions keep their own credentials
    and configuration. ``data_path`` is ``AWS_DATA_PATH``, read as botocore's
    ``create_loader`` reads it."""
    with _loaders_lock:
        loader = _loaders.get(data_path)
        if loader is None:
            extra = None if data_path is None else [
                os.path.expanduser(os.path.expandvars(p)) for p in data_path.split(os.pathsep)]
            loader = _loaders[data_path] = _ModelLoader(extra_search_paths=extra)
        return loader


def session(profile: str | None = None, region: str | None = None) -> botocore.session.Session:
    """A botocore session, as boto3 would make it for ``profile`` and ``region``. boto3 itself
    is not imported: it brings s3transfer and its resource layer, which only a staging
    upload uses (about 0.1 s of every command's start on 2 cores, issue 22)."""
    core = botocore.session.Session(profile=profile)
    if region is not None:
        core.set_config_variable("region", region)
    try:
        data_path = core.get_config_variable("data_path")
    except bex.ProfileNotFound as exc:
        raise ConfigError(
            str(exc), hint="name a profile from ~/.aws/config, or unset AWS_PROFILE"
        ) from None
    core.register_component("data_loader", _shared_loader(data_path))
    return core


def _retry_settings(sess: botocore.session.Session) -> dict[str, Any]:
    """Our retry defaults, unless the operator configured retries the usual boto3 way."""
    scoped = sess.get_scoped_config()  # the profile's section of ~/.aws/config
    settings = load()
    configured = (
        settings.aws_retry_mode
        or settings.aws_max_attempts
        or scoped.get("retry_mode")
        or scoped.get("max_attempts")
    )
    if configured:
        return {}
    return {"retries": {"mode": DEFAULT_RETRY_MODE, "total_max_attempts": DEFAULT_MAX_ATTEMPTS}}


def client(
    service: str,
    *,
    endpoint_url: str | None = None,
    profile: str | None = None,
    region: str | None = None,
    max_pool_connections: int = 32,
    sign_payload: bool | None = None,
) -> Any:
    """A botocore client for ``service`` with our retries and timeouts. ``sign_payload=False``
    (S3): bodies are sent as ``UNSIGNED-PAYLOAD`` also over plain HTTP, for requests whose
    integrity a signed checksum header carries (see ``S3RevisionWriter.part_client``)."""
    if endpoint_url is not None:
        check_endpoint(endpoint_url)
    sess = session(profile, region)
    options: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "read_timeout": READ_TIMEOUT_S,
        # s3transfer runs up to max_concurrency threads per transfer: give each a connection.
        "max_pool_connections": max_pool_connections,
        **_retry_settings(sess),
    }
    s3: dict[str, Any] = {}
    if service == "s3" and endpoint_url is not None:
        s3["addressing_style"] = "path"
    if service == "s3" and sign_payload is not None:
        s3["payload_signing_enabled"] = sign_payload
    if s3:
        options["s3"] = s3
    region_name = sess.get_config_variable("region")
    if region_name is None and endpoint_url is not None:
        # A custom endpoint (moto, MinIO) needs some region to sign with; AWS itself does not
        # get here because an endpoint was named explicitly.
        region_name = "us-east-1"
    try:
        return sess.create_client(
            service, endpoint_url=endpoint_url, region_name=region_name, config=Config(**options)
        )
    except bex.NoRegionError:
        raise ConfigError(
            f"no AWS region configured for {service}",
            hint="set AWS_REGION (or AWS_DEFAULT_REGION), or region= in your AWS profile",
        ) from None
    except ValueError as exc:  # botocore rejects malformed endpoints / regions with ValueError
        raise ConfigError(f"cannot configure the {service} client: {exc}") from None


def s3_client(
    endpoint_url: str | None = None, profile: str | None = None, region: str | None = None
) -> Any:
    return client("s3", endpoint_url=s3_endpoint(endpoint_url), profile=profile, region=region)


def error_code(exc: bex.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def http_status(exc: bex.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


_NOT_FOUND_CODES = {"NoSuchBucket", "NoSuchKey", "NotFound", "404", "FileSystemNotFound"}
_AUTH_CODES = {
    "AccessDenied",
    "AccessDeniedException",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "UnrecognizedClientException",
}


#: Failures that mean "this endpoint cannot be reached at all" when nothing ever answered:
#: a name that does not resolve, a refused connection, a TLS handshake that fails.
_UNREACHABLE = (bex.EndpointConnectionError, bex.SSLError, bex.ProxyConnectionError)


def fail_fast_until_connected(client: Any) -> None:
    """Make ``client`` give up after one quick retry while its endpoint has never answered.

    botocore's retry policy (10 attempts, backoff up to 20 s) suits an endpoint that worked
    and hiccups; for a mistyped endpoint or a missing route it means minutes of silence
    before the same error. Once any response arrives, the policy applies unchanged, and each
    retry of a failure is logged.
    """
    state = {"connected": False}
    lock = threading.Lock()
    endpoint = client.meta.endpoint_url
    # None when retries were configured the usual boto3 way (env, profile): then unknown here.
    most = (client.meta.config.retries or {}).get("total_max_attempts")

    def retry_note(attempts: int) -> str:
        if most is not None and attempts >= most:
            return f"attempt {attempts} of {most}, giving up"
        return f"attempt {attempts}" + (f" of {most}" if most else "") + "; retrying per policy"

    def needs_retry(response=None, caught_exception=None, attempts=1, operation=None, **_):
        if response is not None and caught_exception is None:
            with lock:
                state["connected"] = True
            status = response[0].status_code if response[0] is not None else 0
            if status >= 500 or status in (429, 503):
                log.warning("S3 %s at %s: HTTP %s on %s",
                            operation.name, endpoint, status, retry_note(attempts))
            return None
        if caught_exception is None:
            return None
        with lock:
            connected = state["connected"]
        if not connected and isinstance(caught_exception, _UNREACHABLE):
            if attempts >= 2:
                raise unreachable(endpoint, caught_exception)
            return FIRST_CONTACT_RETRY_S
        log.warning("S3 %s at %s: %s on %s",
                    operation.name, endpoint, caught_exception, retry_note(attempts))
        return None

    service = client.meta.service_model.service_id.hyphenize()
    client.meta.events.register_first(f"needs-retry.{service}", needs_retry)


def unreachable(endpoint: str, exc: Exception) -> Unavailable:
    return Unavailable(
        f"S3: cannot reach the endpoint {endpoint} (no answer yet, retried once): {exc}",
        hint=f"check the endpoint: it is set by {S3_ENDPOINT_ENV} (or AWS_ENDPOINT_URL_S3, "
        "AWS_REGION for AWS itself); then check DNS, the route and TLS to it",
    )


#: Where the S3 endpoint is set, for a hint naming what to check.
S3_ENDPOINT_SETTINGS = f"--endpoint-url / {S3_ENDPOINT_ENV} / AWS_ENDPOINT_URL_S3"


def translate(exc: bex.BotoCoreError | bex.ClientError, what: str, *,
              endpoint_settings: str = S3_ENDPOINT_SETTINGS) -> K3AError:
    """A K3A error (with exit code and next step) for an AWS failure while doing ``what``, its
    hint naming ``endpoint_settings``: the flag and variables that set the service's endpoint."""
    if isinstance(exc, _CONNECTION_ERRORS):
        return Unavailable(
            f"{what}: cannot reach the endpoint ({exc})",
            hint=f"check the network and the endpoint ({endpoint_settings}); transient "
            "failures were already retried",
        )
    if isinstance(exc, (bex.NoCredentialsError, bex.PartialCredentialsError)):
        return ConfigError(
            f"{what}: no usable AWS credentials ({exc})",
            hint="set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run on a role",
        )
    if isinstance(exc, bex.ProfileNotFound):
        return ConfigError(f"{what}: {exc}", hint="name a profile from ~/.aws/config")
    if isinstance(exc, bex.ClientError):
        code, status = error_code(exc), http_status(exc)
        message = exc.response.get("Error", {}).get("Message", "") or str(exc)
        if code in _NOT_FOUND_CODES or status == 404:
            return NotFound(f"{what}: {code or status}: {message}")
        if code == "NotImplemented" or status == 501:
            # The server does not support what we asked: retrying cannot help, and "re-run
            # later" would send the operator to wait for an outage that is not one.
            return ConfigError(
                f"{what}: {code or status}: {message}",
                hint="the S3 server does not implement this request (a gateway or S3 clone "
                "lacking a feature k3a needs); use AWS S3 or a server that implements it",
            )
        if code in _AUTH_CODES or status == 403:
            return ConfigError(
                f"{what}: {code or status}: {message}",
                hint="the credentials in use lack this permission; see policies/ for the role "
                "each k3a command expects",
            )
        if status >= 500 or code in ("SlowDown", "Throttling", "ThrottlingException"):
            return Unavailable(
                f"{what}: {code or status}: {message} (still failing after retries)",
                hint="the service is throttling or failing; re-run later, the work is resumable",
            )
        return K3AError(f"{what}: {code or status}: {message}")
    return Unavailable(f"{what}: {exc}", hint="re-run; the work is resumable")


@contextlib.contextmanager
def aws_errors(what: str, *, endpoint_settings: str = S3_ENDPOINT_SETTINGS) -> Iterator[None]:
    """Translate botocore failures raised inside the block; K3A errors pass through."""
    try:
        yield
    except (bex.BotoCoreError, bex.ClientError) as exc:
        raise translate(exc, what, endpoint_settings=endpoint_settings) from exc
