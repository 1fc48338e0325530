"""Every environment variable k3a reads, named, typed, defaulted and documented once.

This module is the only reader of the environment: library code, the CLI and the flows ask
:func:`load` for values and never look at ``os.environ`` themselves (``tests/test_settings.py``
holds them to it). The reference page ``docs/reference/environment.md`` is generated from the
fields below; regenerate it with ``python -m k3artifacts.settings --markdown``.

The environment is input like any other: a malformed value is refused with its variable named
(:class:`~k3artifacts.errors.ConfigError`, exit 9), never half-applied. An empty value counts as
unset. Values are read when :func:`load` is called, not at import, so a test or a Prefect job
that changes the environment gets what it set.

No variable here names who is acting: who acts is the identity whose key signs
(``K3A_IDENTITY_KEY`` chooses the key, never whose it is: ``policy/acting.py``).
"""

from __future__ import annotations

import os
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)

from k3artifacts import bundled
from k3artifacts.errors import ConfigError, plain_validation_errors

MiB = 1024 * 1024

_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: str | int) -> int:
    """Sizes like ``64MiB``, ``4GiB``, ``1.5GB`` or plain bytes; ValueError otherwise."""
    if isinstance(value, int):
        return value
    text = str(value).strip().lower().replace(" ", "")
    number = text.rstrip("kmgtib")
    try:
        return int(float(number) * _SIZE_UNITS[text[len(number):]])
    except (ValueError, KeyError):
        raise ValueError(f"{value!r} is not a size like 64MiB, 4GiB or 1000000") from None


def default_workers() -> int:
    """Files staged at once: one per core, at least 2, at most 8.

    Staging is CPU-bound (sha256 of every byte): on this project's 2-core machine 2 workers
    reached 0.83-0.88 of cp's rate and 4 only 0.73 (bench/RESULTS.md). Beyond 8, parallel
    connections to the Hub's CDN stop adding throughput.
    """
    return min(8, max(2, os.cpu_count() or 2))


Size = Annotated[int, BeforeValidator(parse_size)]


def var(name: str, group: str, doc: str, *, default: Any = None, shown: str | None = None,
        **constraints: Any) -> Any:
    """A field read from the variable ``name``; ``group`` and ``doc`` make its reference entry,
    ``shown`` says the default (in Markdown) where it is computed."""
    extra = {"group": group, "shown_default": shown}
    return Field(default, validation_alias=name, description=doc, json_schema_extra=extra,
                 **constraints)


class Settings(BaseModel):
    """The environment of one k3a process, as typed values.

    A plain model fed by :func:`load`, not pydantic-settings: importing that costs every
    command about 0.1-0.25 s before its first byte (issue 22), and all it did here was read
    flat variables by exact name."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    # ---- where things live ----------------------------------------------------------------
    store: str | None = var(
        "K3A_STORE", "Where things live",
        "Release store URL: `file:///path` (local disk or an FSx for Lustre mount) or "
        "`s3://bucket/prefix`. `--store` overrides it.",
        shown="`file://$XDG_DATA_HOME/k3artifacts/store`")
    policies: Path | None = var(
        "K3A_POLICIES", "Where things live",
        "Policy directory of a checkout (`s3/`, `iam/`): the bucket and role policies `k3a "
        "bootstrap` reads. It never judges a move nor says which release keys are trusted: the "
        "store's signed policy does (`k3a policy show`; change it with `k3a policy propose "
        "DIR`), and `--policies` is refused where it would.",
        shown="./policies if present, else the defaults shipped in the package")
    profiles_dir: Path | None = var(
        "K3A_PROFILES_DIR", "Where things live",
        "Directory of serving profiles (`<name>.yaml`) that `--profile NAME` looks in.",
        shown="the profiles shipped in the package (in a checkout: `manifests/profiles`)")
    quarantine: Path | None = var(
        "K3A_QUARANTINE", "Where things live",
        "Local download directory of `k3a stage` and the staging flow. Each file is checked "
        "there before it is published. `--quarantine` overrides it.",
        shown="beside a file store, else `$XDG_CACHE_HOME/k3artifacts/quarantine`")
    node_cache: Path | None = var(
        "K3A_NODE_CACHE", "Where things live",
        "The node cache `k3a pull` fills and `k3a cache` manages (a node's NVMe). "
        "`--root` overrides it.",
        shown="`$XDG_DATA_HOME/k3artifacts/node-cache`")
    xdg_data_home: Path | None = var(
        "XDG_DATA_HOME", "Where things live",
        "Base of the default store and node cache (the XDG base directory convention).",
        shown="`~/.local/share`")
    context: str | None = var(
        "K3A_CONTEXT", "Where things live",
        "The context of the config file (`$XDG_CONFIG_HOME/k3a/config.yaml`) to read the "
        "store, identity key and channel from; `k3a --context NAME` overrides it, and a "
        "variable or flag of its own overrides what the context says.",
        shown="the file's `current-context` (`k3a config use NAME`), else none")
    channel: str | None = var(
        "K3A_CHANNEL", "Where things live",
        "Default `--channel` of `k3a verify --signature` (whose trusted keys count) and "
        "`k3a eval run` (the channel evaluated for). The option overrides it.",
        shown="none (each command's own)")
    xdg_config_home: Path | None = var(
        "XDG_CONFIG_HOME", "Where things live",
        "Base of this client's own configuration: its personal signing key "
        "(`k3artifacts/keys/`) and the root of trust it pins for each store "
        "(`k3artifacts/trust/`). Both are refused when others can write them.",
        shown="`~/.config`")
    xdg_cache_home: Path | None = var(
        "XDG_CACHE_HOME", "Where things live",
        "Base of the default quarantine when the store is not a local directory.",
        shown="`~/.cache`")

    # ---- S3 and AWS -----------------------------------------------------------------------
    s3_endpoint_url: str | None = var(
        "K3A_S3_ENDPOINT_URL", "S3 and AWS",
        "S3 endpoint other than AWS's (a VPC endpoint, MinIO, SeaweedFS, moto). "
        "`--endpoint-url` overrides it where a command has one.",
        shown="boto3's own")
    s3_part_size: Size | None = var(
        "K3A_S3_PART_SIZE", "S3 and AWS",
        "Multipart part size and threshold for uploads and copies, e.g. `64MiB` (S3 needs at "
        "least 5 MiB); grown per file so no file needs more than 10,000 parts.",
        shown="uploads in `16MiB` parts from 16 MiB, copies in `64MiB` parts from 64 MiB",
        ge=5 * MiB)
    s3_concurrency: int | None = var(
        "K3A_S3_CONCURRENCY", "S3 and AWS",
        "Parts in flight per file during an S3 transfer.", shown="`8`", ge=1)
    s3_buffer: Size | None = var(
        "K3A_S3_BUFFER", "S3 and AWS",
        "Bytes of upload parts a process holds in memory at once, across all the files it "
        "sends, e.g. `512MiB`: what bounds the memory of staging to S3, whatever the number "
        "of files in flight.",
        shown="`192MiB`", ge=5 * MiB)
    kms_endpoint_url: str | None = var(
        "K3A_KMS_ENDPOINT_URL", "S3 and AWS",
        "KMS endpoint for a `kms:` identity key (a VPC endpoint, moto). It chooses which "
        "service signs, never whose signature counts: every signature is checked against the "
        "public key the policy names.",
        shown="boto3's own")
    aws_region: str | None = var(
        "AWS_REGION", "S3 and AWS",
        "boto3's region; k3a also records it in a tuple's S3 serving target when the client "
        "does not know the bucket's region.")
    aws_default_region: str | None = var(
        "AWS_DEFAULT_REGION", "S3 and AWS", "The older spelling of `AWS_REGION`.")
    aws_retry_mode: str | None = var(
        "AWS_RETRY_MODE", "S3 and AWS",
        "boto3's retry mode. When it (or `AWS_MAX_ATTEMPTS`, or the profile's `retry_mode` / "
        "`max_attempts`) is set, k3a keeps boto3's retries; otherwise it uses `standard` with "
        "10 attempts.")
    aws_max_attempts: str | None = var(
        "AWS_MAX_ATTEMPTS", "S3 and AWS", "boto3's attempts per request; see `AWS_RETRY_MODE`.")

    # ---- network: every HTTP peer k3a's own clients reach (k3artifacts/net/) ----------------
    http_connect_timeout: float = var(
        "K3A_HTTP_CONNECT_TIMEOUT", "Network",
        "Seconds to open a connection to any HTTP peer (the Hub and its CDN, a registry, "
        "Prometheus, the Kubernetes API, a vLLM `/metrics` page). Also how long a host that "
        "has not yet answered this process may take to send its first headers; it gets two "
        "tries, so a silent host fails in about twice this. `k3a stage --connect-timeout` "
        "overrides it.", default=10.0, gt=0)
    http_read_timeout: float = var(
        "K3A_HTTP_READ_TIMEOUT", "Network",
        "Seconds without a byte (headers or body) before a call or transfer is cut; a "
        "transfer is then resumed from the byte it reached. `k3a stage --read-timeout` "
        "overrides it.", default=60.0, gt=0)
    http_deadline: float = var(
        "K3A_HTTP_DEADLINE", "Network",
        "Seconds for a whole answer's headers, and for the whole of a small answer (a Hub API "
        "call, Prometheus, the Kubernetes API, a registry, a `/metrics` page): a peer that "
        "trickles bytes just fast enough to beat the read timeout is cut here.",
        default=60.0, gt=0)
    http_call_deadline: float = var(
        "K3A_HTTP_CALL_DEADLINE", "Network",
        "Seconds for one small call in all (Prometheus, the Kubernetes API, the Hub API, a "
        "registry), its retries and the waits between them included: a peer that trickles "
        "every answer is given up on here (exit 8), not after every attempt's deadline.",
        default=120.0, gt=0)
    http_attempts: int = var(
        "K3A_HTTP_ATTEMPTS", "Network",
        "Attempts of one call (idempotent methods only) or one transfer that bring no new "
        "byte, before giving up (exit 8). `k3a stage --retries` overrides it.",
        default=8, ge=1)
    http_backoff: float = var(
        "K3A_HTTP_BACKOFF", "Network",
        "Seconds before the first retry; each later retry waits twice as long (at most 60 s), "
        "with jitter.", default=1.0, ge=0)
    http_max_wait: float = var(
        "K3A_HTTP_MAX_WAIT", "Network",
        "The longest wait a server may ask for (`Retry-After`, or the Hub's `RateLimit` "
        "header's `t`); a longer one is waited this long, then the call is retried.",
        default=300.0, ge=0)
    http_min_rate: Size = var(
        "K3A_HTTP_MIN_RATE", "Network",
        "Rate floor of a transfer in bytes/s (e.g. `64KiB`), over `K3A_HTTP_RATE_WINDOW` "
        "seconds, counting every byte across reconnects: a slower transfer is cut and "
        "resumed, and 3 slow windows in a row fail it (exit 8). `k3a stage --min-rate` "
        "overrides it.", default=64 * 1024, shown="`64KiB`", ge=0)
    http_rate_window: float = var(
        "K3A_HTTP_RATE_WINDOW", "Network",
        "Seconds over which `K3A_HTTP_MIN_RATE` is measured. `k3a stage --rate-window` "
        "overrides it.", default=60.0, gt=0)
    ca_bundle: Path | None = var(
        "K3A_CA_BUNDLE", "Network",
        "PEM file of the certificate authorities every TLS peer of k3a's own HTTP clients is "
        "checked against (the Hub, registries, Prometheus, an endpoint; the Kubernetes API "
        "uses its kubeconfig's CA). OpenSSL's `SSL_CERT_FILE` works too.",
        shown="the system's trust store")
    kube_exec_timeout: float = var(
        "K3A_KUBE_EXEC_TIMEOUT", "Network",
        "Seconds a kubeconfig's exec credential plugin (`aws eks get-token`) may take to print "
        "its credential; past it the plugin is killed with every process it started and the "
        "command fails (exit 9).", default=60.0, gt=0)
    kube_service_account_dir: Path = var(
        "K3A_KUBE_SERVICE_ACCOUNT_DIR", "Network",
        "In a pod, with no `--kubeconfig`: the service account directory (`token`, `ca.crt`, "
        "`namespace`) k3a reaches the Kubernetes API with.",
        default=Path("/var/run/secrets/kubernetes.io/serviceaccount"))
    kubernetes_service_host: str | None = var(
        "KUBERNETES_SERVICE_HOST", "Network",
        "Set by Kubernetes in every pod: the API server's address, for the in-cluster "
        "configuration (with `KUBERNETES_SERVICE_PORT`).")
    kubernetes_service_port: str | None = var(
        "KUBERNETES_SERVICE_PORT", "Network",
        "Set by Kubernetes in every pod: the API server's port.")

    # ---- signing, registries, endpoints ----------------------------------------------------
    signing_key: str | None = var(
        "K3A_SIGNING_KEY", "Credentials",
        "Deprecated, read until k3artifacts 0.3.0 (2027-06-30), with a notice: the key "
        "`--signing-key` stands for when not given. Pass `--signing-key`, or set "
        "`K3A_IDENTITY_KEY` to the key (`k3a sign` signs with it).")
    signing_key_password: SecretStr | None = var(
        "K3A_SIGNING_KEY_PASSWORD", "Credentials",
        "Deprecated, read until k3artifacts 0.3.0 (2027-06-30), with a notice: the passphrase "
        "of the `--signing-key` file where `K3A_IDENTITY_KEY_PASSWORD` is unset.")
    identity_key: str | None = var(
        "K3A_IDENTITY_KEY", "Credentials",
        "Key this process signs with: its records (reviews, approvals, evidence, moves, policy "
        "and root changes) and, with `k3a sign`, releases (an ECDSA key of an identity holding "
        "the release role). A PEM private key file (ed25519, ECDSA P-256/P-384, not readable by "
        "others), `kms:KEY` (an AWS KMS ECC_NIST_P256 signing key: id, ARN or alias) or a "
        "`pkcs11:` URI. Whose key it is decides who acted (docs/policy-and-identity.md).",
        shown="this account's personal key, `$XDG_CONFIG_HOME/k3artifacts/keys/personal.pem` "
        "(`k3a key create`)")
    identity_key_password: SecretStr | None = var(
        "K3A_IDENTITY_KEY_PASSWORD", "Credentials",
        "Passphrase of an encrypted PEM key: `K3A_IDENTITY_KEY`'s, or `--signing-key`'s.")
    registry_username: str | None = var(
        "K3A_REGISTRY_USERNAME", "Credentials",
        "User for the container registry when k3a resolves an image tag to its digest; used "
        "with `K3A_REGISTRY_PASSWORD`, else the Docker config's `auths` entry.")
    registry_password: SecretStr | None = var(
        "K3A_REGISTRY_PASSWORD", "Credentials", "Password or token for `K3A_REGISTRY_USERNAME`.")
    docker_config: Path | None = var(
        "DOCKER_CONFIG", "Credentials",
        "Directory of the Docker `config.json` whose `auths` k3a reads (helpers are not run).",
        shown="`~/.docker`")
    endpoint_api_key: SecretStr | None = var(
        "K3A_ENDPOINT_API_KEY", "Credentials",
        "Bearer key for `k3a eval` / `k3a smoke` when vLLM runs with `--api-key`. "
        "`--api-key` overrides it.")

    # ---- output and runs ---------------------------------------------------------------------
    no_color: bool = var(
        "NO_COLOR", "Output and runs",
        "Any non-empty value: no colour in k3a's output (error lines, check results, the "
        "progress bar), as [no-color.org](https://no-color.org) asks.", default=False)
    log_format: Literal["text", "json"] = var(
        "K3A_LOG_FORMAT", "Output and runs",
        "Progress and log lines on stderr as `text` or one JSON object per line. "
        "`--log-format` overrides it.", default="text")
    progress_interval: float = var(
        "K3A_PROGRESS_INTERVAL", "Output and runs",
        "Seconds between progress lines when stderr is not a terminal (a Job, CI), and "
        "between updates of a flow's live artifacts. `--progress-interval` overrides it.",
        default=30.0, ge=0.05)
    now: datetime | None = var(
        "K3A_NOW", "Output and runs",
        "The time a store's signed freshness head is judged and issued at (an ISO 8601 "
        "instant with its offset), for drills and tests; unset: the system clock.")
    workers: int | None = var(
        "K3A_WORKERS", "Output and runs",
        "Files a Prefect staging flow downloads at once with its thread-pool runner "
        "(`k3a stage` has `--workers`).", shown="one per core, 2 to 8", ge=1)
    hash_in: Literal["threads", "processes"] | None = var(
        "K3A_HASH_IN", "Output and runs",
        "Where `k3a verify` and `k3a pull` hash files on this machine: `threads` of one "
        "process or `processes` (one per worker, each fed open files). Unset, k3a chooses by "
        "algorithm, workers and bytes as measured (processes from 1 GiB of xxh3-128; for "
        "sha256, beyond 8 workers or with 512 MiB each): set it where `python -m bench "
        "--only verify` shows the other side faster.",
        shown="chosen per run")
    dask_address: str | None = var(
        "K3A_DASK_ADDRESS", "Output and runs",
        "Dask scheduler (`tcp://host:8786`): a Prefect staging flow runs its per-file tasks "
        "on that cluster instead of a thread pool.")
    worker_image: str | None = var(
        "K3A_WORKER_IMAGE", "Output and runs",
        "Worker image (`repository@sha256:...`) that `prefect deploy` puts in "
        "`flows/prefect.yaml`'s job template. Read by Prefect when deploying, not by k3a.")

    # ---- fault points (tests only) -----------------------------------------------------------
    fault_pause: str | None = var(
        "K3A_FAULT_PAUSE", "Fault points (tests)",
        "`<point>[@<glob>]:<seconds>`: pause at the named point so a crash test can kill "
        "the process there (`k3artifacts/faultpoints.py` lists the points). The one switch "
        "for fault injection; unset, every point is a no-op.")
    fault_resume: Path | None = var(
        "K3A_FAULT_RESUME", "Fault points (tests)",
        "A file whose appearance ends a `K3A_FAULT_PAUSE` pause early.")

    @field_validator("no_color", mode="before")
    @classmethod
    def _any_value(cls, value: object) -> bool:
        return bool(value)  # "NO_COLOR=0" asks for no colour too: presence is what counts

    @field_validator("now")
    @classmethod
    def _zoned(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("give the instant with its offset (2026-07-01T00:00:00Z)")
        return value

    @field_validator("fault_pause")
    @classmethod
    def _fault_spec(cls, value: str | None) -> str | None:
        if value is not None:
            target, sep, seconds = value.rpartition(":")
            try:
                ok = bool(sep and target.partition("@")[0]) and float(seconds) >= 0
            except ValueError:
                ok = False
            if not ok:
                raise ValueError("expected <point>[@<glob>]:<seconds>")
        return value


#: The variables, in field order.
VARIABLES = tuple(str(f.validation_alias) for f in Settings.model_fields.values())

_last: tuple[tuple[Any, ...], Settings] | None = None


def load() -> Settings:
    """The settings of this process, read from the environment now.

    Validating costs about a millisecond and fault points ask once per file part, so the
    last answer is kept while the variables it was read from are unchanged."""
    global _last
    key = (*map(os.environ.get, VARIABLES), _chosen_context, _file_state(config_file()))
    if _last is not None and _last[0] == key:
        return _last[1]
    # An empty value counts as unset; names are matched exactly (case-sensitive).
    values = {name: value for name, value in zip(VARIABLES, key, strict=False) if value}
    # What the context says, under what the environment says (a flag overrides both).
    _, chosen = current_context()
    for name, value in ({} if chosen is None else chosen.variables()).items():
        values.setdefault(name, value)
    try:
        settings = Settings.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(
            f"bad environment: {_by_variable(exc)}",
            hint="fix or unset the variable (docs/reference/environment.md lists them)",
        ) from None
    _last = (key, settings)
    return settings


# ---- values derived from the variables ----------------------------------------------------------


# ---- the config file: named contexts ------------------------------------------------------

#: Largest config file read: a few contexts fit in a kilobyte.
MAX_CONFIG_BYTES = 1 << 20


class Context(BaseModel):
    """One named context of the config file: where a team's store is, which key signs, which
    channel it works with. A variable or flag of its own overrides each."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    store: str | None = Field(None, description="Store URL (`K3A_STORE`, `--store`).")
    identity_key: str | None = Field(
        None, alias="identity-key",
        description="Key records are signed with (`K3A_IDENTITY_KEY`): a PEM file, `kms:KEY`, "
        "`pkcs11:` URI.")
    channel: str | None = Field(None, description="Default `--channel` (`K3A_CHANNEL`).")

    def variables(self) -> dict[str, str]:
        """The variables this context stands in for, by name."""
        by_field = {"store": "K3A_STORE", "identity_key": "K3A_IDENTITY_KEY",
                    "channel": "K3A_CHANNEL"}
        return {by_field[name]: value for name, value in self.model_dump().items()
                if value is not None}


class ConfigFile(BaseModel):
    """``$XDG_CONFIG_HOME/k3a/config.yaml``: contexts by name and the one in use, as kubectl's
    contexts and AWS's profiles are kept."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    current_context: str | None = Field(None, alias="current-context")
    contexts: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")],
                   Context] = {}


_chosen_context: str | None = None


def choose_context(name: str | None) -> None:
    """``k3a --context NAME``: this process reads that context, whatever ``K3A_CONTEXT`` or
    the file's ``current-context`` say."""
    global _chosen_context
    _chosen_context = name


def config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "k3a" / "config.yaml"


def _file_state(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_mode


def read_config_file() -> ConfigFile:
    """The config file, checked: refused (ConfigError, exit 9) naming the file when anyone
    but its owner could write it (it chooses the key records are signed with and the store
    moves go to), when it is not this account's, or when it is not what it should be."""
    path = config_file()
    try:
        st = path.stat()
    except FileNotFoundError:
        return ConfigFile()  # without importing YAML: every command asks, most have no file
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}",
                          hint=f"check it (`ls -l {path}`)") from None
    fix = f"`chmod go-w {path}` (and `chown` it to yourself) if its content is yours"
    if st.st_uid != os.getuid():
        raise ConfigError(f"config file {path} belongs to uid {st.st_uid}, not to you: it "
                          "could choose your store and signing key", hint=fix)
    if st.st_mode & 0o022:
        raise ConfigError(f"config file {path} is writable by others (mode "
                          f"{st.st_mode & 0o777:o}): it could choose your store and signing "
                          "key", hint=fix)
    if st.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is {st.st_size} bytes: not a config file",
                          hint=f"check {path}")
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        return ConfigFile.model_validate(raw if raw is not None else {})
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not YAML: {str(exc)[:200]}",
                          hint=f"fix {path} (docs/reference/environment.md, 'Config file')"
                          ) from None
    except ValidationError as exc:
        raise ConfigError(f"config file {path}: {plain_validation_errors(exc)}",
                          hint=f"fix {path}: its keys are current-context and contexts "
                          "(each: store, identity-key, channel)") from None


def current_context() -> tuple[str | None, Context | None]:
    """The context this process reads (flag, else ``K3A_CONTEXT``, else the file's
    ``current-context``) and what it says; ConfigError for one the file does not hold."""
    config = read_config_file()
    name = _chosen_context or os.environ.get("K3A_CONTEXT") or config.current_context
    if name is None:
        return None, None
    if name not in config.contexts:
        known = ", ".join(sorted(config.contexts)) or "none"
        raise ConfigError(f"no context {name!r} in {config_file()} (contexts: {known})",
                          hint="`k3a config list` shows them; `k3a config set-context NAME "
                          "--store URL` makes one")
    return name, config.contexts[name]


def context_values() -> dict[str, tuple[str | None, str]]:
    """What a context stands in for, as this process reads it, and where each value comes
    from (``environment (VAR)``, ``context NAME`` or ``default``), for `k3a config show`."""
    name, context = current_context()
    given = {} if context is None else context.variables()
    settings = load()
    shown: dict[str, tuple[str | None, str]] = {}
    for field, variable in (("store", "K3A_STORE"), ("identity_key", "K3A_IDENTITY_KEY"),
                            ("channel", "K3A_CHANNEL")):
        value = getattr(settings, field)
        if os.environ.get(variable):
            source = f"environment ({variable})"
        elif variable in given:
            source = f"context {name}"
        else:
            source = "default"
        shown[field] = (default_store_url() if field == "store" else value, source)
    return shown


def no_color() -> bool:
    """Whether ``NO_COLOR`` asks for plain output. Answered even when another variable is
    malformed, so that the report of that variable is plain too."""
    try:
        return load().no_color
    except ConfigError:
        return bool(os.environ.get("NO_COLOR"))


def data_home() -> Path:
    return (load().xdg_data_home or Path.home() / ".local" / "share") / "k3artifacts"


def config_home() -> Path:
    """This client's configuration directory: personal keys and pinned roots of trust."""
    return (load().xdg_config_home or Path.home() / ".config") / "k3artifacts"


def default_store_url() -> str:
    """``K3A_STORE`` or the embedded default: a local tree under the user's data directory."""
    return load().store or f"file://{data_home() / 'store'}"


def default_policies_dir() -> Path:
    """``K3A_POLICIES``, else ``./policies`` when there is one (the checkout's policy data,
    reviewed like code), else the defaults shipped in the package."""
    local = Path("policies")
    return load().policies or (local if local.is_dir() else bundled.POLICIES)


def default_node_cache() -> Path:
    """``K3A_NODE_CACHE``, else a directory under the user's data home (tests, laptops)."""
    return load().node_cache or data_home() / "node-cache"


def default_quarantine(store_local_root: Path | None) -> Path:
    """``K3A_QUARANTINE``, else beside a file store (publication is then a hard link, no
    copy), else the user's cache directory."""
    settings = load()
    if settings.quarantine is not None:
        return settings.quarantine
    if store_local_root is not None:
        return store_local_root / ".k3a-quarantine"
    return (settings.xdg_cache_home or Path.home() / ".cache") / "k3artifacts" / "quarantine"


#: A variable whose name holds one of these holds a secret (AWS_SECRET_ACCESS_KEY,
#: AWS_SESSION_TOKEN, HF_TOKEN, K3A_REGISTRY_PASSWORD, K3A_ENDPOINT_API_KEY, ...).
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
#: Shorter values are not treated as secrets: blanking every "true" or "1" in a model's answer
#: would hide what it said and protect nothing.
MIN_SECRET_LENGTH = 8


def _ini_values(path: Path, *, secret_names_only: bool) -> set[str]:
    """The values of an AWS shared config or credentials file (``name = value`` lines)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    found = set()
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and (not secret_names_only or _SECRET_NAME.search(name)):
            found.add(value.strip())
    return found


def secret_values() -> frozenset[str]:
    """Values this process holds that nothing it prints or stores may contain: every variable
    whose name says key, token, secret, password or credential; every value in the AWS
    credentials files (``~/.aws/credentials`` and ``AWS_SHARED_CREDENTIALS_FILE``: a variable
    pointing elsewhere does not make the file in the home directory any less secret); and the
    secret-named values of the AWS config files (``~/.aws/config``, ``AWS_CONFIG_FILE``)."""
    found = {value.strip() for name, value in os.environ.items() if _SECRET_NAME.search(name)}
    aws = Path.home() / ".aws"
    for path in {aws / "credentials", Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or
                                           aws / "credentials")}:
        found |= _ini_values(path, secret_names_only=False)
    for path in {aws / "config", Path(os.environ.get("AWS_CONFIG_FILE") or aws / "config")}:
        found |= _ini_values(path, secret_names_only=True)
    return frozenset(v for v in found if len(v) >= MIN_SECRET_LENGTH)


def _by_variable(exc: ValidationError) -> str:
    # Name the variable the person set, not the field behind it.
    text = plain_validation_errors(exc)
    for name, field in Settings.model_fields.items():
        text = text.replace(f"{name}:", f"{field.validation_alias}:")
    return text


def markdown() -> str:
    """``docs/reference/environment.md``: every variable, grouped, in declaration order."""
    lines = [
        "# Environment variables",
        "",
        "<!-- Generated from k3artifacts/settings.py by "
        "`python -m k3artifacts.settings --markdown`; tests/test_settings.py fails when they "
        "differ. Edit the settings, not this page. -->",
        "",
        "Every variable k3a reads, read in one place (`k3artifacts/settings.py`). An empty value "
        "counts as unset; a malformed one is refused (exit 9) naming the variable. A command "
        "line option, where there is one, wins over its variable.",
        "",
        "Named contexts (a team's staging and production stores) live in "
        "`$XDG_CONFIG_HOME/k3a/config.yaml` (`k3a config set-context NAME --store URL`, "
        "`k3a config use NAME`, `list`, `show`): each context's `store`, `identity-key` and "
        "`channel` stand in for `K3A_STORE`, `K3A_IDENTITY_KEY` and `K3A_CHANNEL`. The context "
        "read is `k3a --context NAME ...`, else `K3A_CONTEXT`, else the file's "
        "`current-context`; a flag wins over its variable, a variable over the context, the "
        "context over the default. The file is refused (exit 9, naming it) when anyone but its "
        "owner may write it, when another account owns it, or when it holds a key it should "
        "not or a value of the wrong type.",
        "",
        "No variable names who is acting: who acts is the identity of the store's policy "
        "whose key signs (`K3A_IDENTITY_KEY` chooses the key, never whose it is); `LOGNAME`, "
        "`USER` and the like are never read for it, and no cloud service is asked.",
        "",
        "Libraries k3a uses read their own variables as usual: boto3 (`AWS_PROFILE`, "
        "`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL_S3`, ...), huggingface_hub (`HF_TOKEN`, "
        "`HF_ENDPOINT`, `HF_HUB_CACHE`, ...) and Prefect (`PREFECT_API_URL`, ...). The "
        "`K3A_TUPLE_ID`, `K3A_WEIGHTS`, ... of the serving image (`docker/serving`) are "
        "written into the image by `k3a docker build-args`, for whoever inspects a pod; "
        "k3a does not read them.",
        "",
        "The value of every variable whose name contains `KEY`, `TOKEN`, `SECRET`, `PASSWORD` "
        "or `CREDENTIAL` (8 characters or more), every value in the AWS credentials files "
        "(`~/.aws/credentials` and `AWS_SHARED_CREDENTIALS_FILE`) and the secret-named ones "
        "of the AWS config files (`~/.aws/config`, `AWS_CONFIG_FILE`) are cut out of what an "
        "endpoint or a model's code answered before `k3a smoke` / `k3a eval run` print or "
        "record it.",
    ]
    group = None
    for field in Settings.model_fields.values():
        extra = field.json_schema_extra or {}
        assert isinstance(extra, dict)
        if extra["group"] != group:
            group = extra["group"]
            lines += ["", f"## {group}"]
        default = extra["shown_default"] or (
            None if field.default is None else f"`{field.default}`")
        lines += ["", f"### `{field.validation_alias}`", "", str(field.description)]
        if default is not None:
            lines += ["", f"Default: {default}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv != ["--markdown"]:
        print("usage: python -m k3artifacts.settings --markdown  (prints "
              "docs/reference/environment.md)", file=sys.stderr)
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
