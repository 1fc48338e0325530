"""Image references: parse them, and pin a tag to a digest once, when a tuple is made.

A tag is a mutable name: the image behind ``vllm:v0.12`` can change tomorrow. A release tuple
must name bytes, so every reference is resolved to ``repository@sha256:<digest>`` here and the
digest is what gets bound. Two ways to ask a registry:

* Amazon ECR hosts (``<account>.dkr.ecr.<region>.amazonaws.com``): boto3 ``batch_get_image``,
  which uses the caller's AWS credentials (and ``AWS_ENDPOINT_URL_ECR`` when set).
* Any other OCI registry: the distribution API, ``HEAD /v2/<name>/manifests/<ref>`` with the
  manifest media types in ``Accept`` -> ``Docker-Content-Digest``; bearer-token auth when the
  registry answers 401 with a ``WWW-Authenticate: Bearer`` challenge.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from k3artifacts.errors import BadAnswer, ConfigError, NotFound, Unavailable
from k3artifacts.net.calls import Answer, Peer, call
from k3artifacts.net.redact import redact_url
from k3artifacts.releases.tuples import DIGEST, ImageRef
from k3artifacts.settings import load

#: A manifest (or an index of them) is a few KB; a token answer less.
MAX_REGISTRY_ANSWER = 4 << 20
#: Everything a registry may hold under a tag: multi-arch indexes first, then single manifests.
MANIFEST_MEDIA_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
ECR_HOST = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$"
)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_HINT = "write the image as registry/repository:tag or registry/repository@sha256:<64 hex>"


@dataclass(frozen=True)
class ParsedImage:
    """An image reference split into its parts, Docker Hub shorthand expanded."""

    registry: str  # host[:port], as the runtime pulls from it
    name: str  # the repository path inside the registry
    tag: str | None
    digest: str | None

    @property
    def repository(self) -> str:
        return f"{self.registry}/{self.name}"

    @property
    def ecr(self) -> re.Match[str] | None:
        return ECR_HOST.match(self.registry)

    def __str__(self) -> str:
        text = self.repository
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_image(reference: str) -> ParsedImage:
    """Split ``reference`` the way the container runtime does.

    >>> parse_image("vllm/vllm-openai:v0.12.0")
    ParsedImage(registry='docker.io', name='vllm/vllm-openai', tag='v0.12.0', digest=None)
    >>> parse_image("127.0.0.1:5000/k3a/vllm@sha256:" + "0" * 64).registry
    '127.0.0.1:5000'
    """
    ref = reference.strip()
    if not ref or any(c.isspace() for c in ref):
        raise ConfigError(f"image reference {reference!r} is empty or has spaces", hint=_HINT)
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
        if not DIGEST.match(digest):
            raise ConfigError(
                f"image reference {reference!r}: digest must be sha256:<64 lowercase hex>",
                hint=_HINT,
            )
    tag = None
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        ref, tag = ref.rsplit(":", 1)
        if not _TAG.match(tag):
            raise ConfigError(f"image reference {reference!r}: invalid tag {tag!r}", hint=_HINT)
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, name = first, rest
    else:
        registry, name = DOCKER_HUB, ref
        if "/" not in name:
            name = f"library/{name}"
    if registry in ("index.docker.io", DOCKER_HUB_API):
        registry = DOCKER_HUB
    if not _NAME.match(name):
        raise ConfigError(
            f"image reference {reference!r}: repository {name!r} is not a valid name "
            "(lowercase letters, digits, separators . _ - /)",
            hint=_HINT,
        )
    if tag is None and digest is None:
        raise ConfigError(
            f"image reference {reference!r} has neither tag nor digest",
            hint="name the tag you mean (e.g. :v0.12.0); 'latest' is never implied",
        )
    return ParsedImage(registry=registry, name=name, tag=tag, digest=digest)


def pinned(parsed: ParsedImage, digest: str) -> ImageRef:
    return ImageRef(repository=parsed.repository, digest=digest, tag=parsed.tag)


def require_digest(reference: str) -> ImageRef:
    """Accept ``reference`` only if it already names a digest (offline tuple creation)."""
    parsed = parse_image(reference)
    if parsed.digest is None:
        raise ConfigError(
            f"image {reference} is a tag and no digest; a release tuple binds images by digest",
            hint="resolve it against the registry (drop --offline) or pass repository@sha256:...",
        )
    return pinned(parsed, parsed.digest)


# ---- registry credentials --------------------------------------------------------------------


def _docker_config_path() -> Path:
    root = load().docker_config
    return (root or Path.home() / ".docker") / "config.json"


def registry_credentials(registry: str) -> tuple[str, str] | None:
    """Basic credentials for ``registry``: K3A_REGISTRY_USERNAME/PASSWORD, else the Docker
    config's ``auths`` entry (what ``docker login`` writes). Credential helpers are not run."""
    settings = load()
    user, password = settings.registry_username, settings.registry_password
    if user and password:
        return user, password.get_secret_value()
    path = _docker_config_path()
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: unreadable Docker config: {exc}") from None
    keys = [registry, f"https://{registry}", f"http://{registry}"]
    if registry == DOCKER_HUB:
        keys.append("https://index.docker.io/v1/")
    for key in keys:
        entry = (config.get("auths") or {}).get(key)
        if entry and entry.get("auth"):
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            return user, password
    return None


# ---- the distribution API --------------------------------------------------------------------


def _is_loopback(registry: str) -> bool:
    host = (
        registry.rsplit(":", 1)[0] if not registry.startswith("[") else registry[1:].split("]")[0]
    )
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="...",service="...",scope="..."`` -> ("bearer", {realm, service, scope})."""
    scheme, _, rest = header.strip().partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return scheme.lower(), params


class RegistryClient:
    """Just enough of the OCI distribution API to turn a reference into a digest."""

    def __init__(
        self,
        registry: str,
        *,
        insecure: bool = False,
        credentials: tuple[str, str] | None = None,
    ):
        self.registry = registry
        host = DOCKER_HUB_API if registry == DOCKER_HUB else registry
        # Plain http only where nobody else can be on the wire, or where the operator said so.
        scheme = "http" if insecure or _is_loopback(registry) else "https"
        self.base = f"{scheme}://{host}"
        self.peer = Peer(
            f"registry {registry}",
            hint="check the registry host and network; for a plain-http registry pass "
            "--insecure-registry HOST:PORT; with no registry at hand, give the image as "
            "REPO@sha256:<digest> and pass --offline (nothing is contacted)")
        self.credentials = credentials
        self._token: str | None = None

    def _basic(self) -> dict[str, str]:
        if not self.credentials:
            return {}
        raw = ":".join(self.credentials).encode()
        return {"Authorization": "Basic " + base64.b64encode(raw).decode()}

    def _request(self, method: str, url: str, headers: Mapping[str, str], *,
                 auth_origin: str | None = None) -> Answer:
        """Through the network layer: redirects followed with the credential kept on
        ``auth_origin`` (the registry), retries and deadlines by the settings' policy."""
        return call(method, url, self.peer, headers=headers, auth_origin=auth_origin or self.base,
                    limit=MAX_REGISTRY_ANSWER)

    def _fetch_token(self, params: dict[str, str], name: str) -> str:
        realm = params.get("realm")
        if not realm:
            raise BadAnswer(f"registry {self.registry}: Bearer challenge without a realm")
        fields = {
            "service": params.get("service", ""),
            "scope": params.get("scope") or f"repository:{name}:pull",
        }
        query = urlencode({k: v for k, v in fields.items() if v})
        url = f"{realm}{'&' if '?' in realm else '?'}{query}"
        realm = redact_url(realm)
        if not realm.startswith(("https://", "http://")):
            raise BadAnswer(f"registry {self.registry}: Bearer challenge with a realm that is "
                            f"not an http(s) URL: {realm[:200]!r}")
        # The credentials are for the token service the registry named.
        resp = self._request("GET", url, self._basic(), auth_origin=url)
        if resp.status in (401, 403):
            raise ConfigError(
                f"registry {self.registry}: token service {realm} refused the credentials "
                f"(HTTP {resp.status}) for {fields['scope']}",
                hint="set K3A_REGISTRY_USERNAME/K3A_REGISTRY_PASSWORD or `docker login` the "
                "registry",
            )
        if resp.status != 200:
            raise Unavailable(
                f"registry {self.registry}: token service {realm} answered HTTP {resp.status}"
            )
        try:
            body = json.loads(resp.body)
            token = body.get("token") or body["access_token"]
        except (ValueError, KeyError, AttributeError, RecursionError):
            token = None
        if not isinstance(token, str) or not token or not token.isprintable():
            raise BadAnswer(f"registry {self.registry}: token service {realm} sent no token")
        return token

    def _authorized(self, method: str, name: str, url: str, headers: dict[str, str]) -> Answer:
        bearer = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        resp = self._request(method, url, {**headers, **bearer})
        if resp.status != 401:
            return resp
        scheme, params = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
        if scheme == "bearer":
            self._token = self._fetch_token(params, name)
            return self._request(method, url, {**headers, "Authorization": f"Bearer {self._token}"})
        if scheme == "basic" and self.credentials:
            return self._request(method, url, {**headers, **self._basic()})
        return resp

    def manifest_digest(self, name: str, reference: str) -> str:
        """The digest the registry serves for ``name`` at ``reference`` (a tag or a digest)."""
        url = f"{self.base}/v2/{name}/manifests/{reference}"
        headers = {"Accept": ", ".join(MANIFEST_MEDIA_TYPES)}
        resp = self._authorized("HEAD", name, url, headers)
        digest = resp.headers.get("Docker-Content-Digest") if resp.status == 200 else None
        if resp.status == 200 and not digest:
            # Some registries answer HEAD without the header; the digest is then that of the
            # exact bytes GET returns (which is what a runtime pulling by digest checks).
            resp = self._authorized("GET", name, url, headers)
            if resp.status == 200:
                digest = "sha256:" + hashlib.sha256(resp.body).hexdigest()
        if resp.status == 200 and digest and DIGEST.match(digest):
            return digest
        where = (
            f"{self.registry}/{name}:{reference}"
            if ":" not in reference
            else f"{self.registry}/{name}@{reference}"
        )
        if resp.status == 404:
            raise NotFound(
                f"image {where} is not in the registry; cannot pin it to a digest",
                hint="check the repository and tag (push the image first)",
            )
        if resp.status in (401, 403):
            raise ConfigError(
                f"registry refused access to {where} (HTTP {resp.status})",
                hint="set K3A_REGISTRY_USERNAME/K3A_REGISTRY_PASSWORD or `docker login` the "
                "registry",
            )
        if resp.status == 200:
            raise BadAnswer(f"registry answered {where} with an unusable digest "
                            f"{str(digest)[:100]!r}")
        raise Unavailable(f"registry answered HTTP {resp.status} for {where}")


# ---- ECR -------------------------------------------------------------------------------------


def ecr_digest(parsed: ParsedImage) -> str:
    """Ask ECR, with the caller's AWS credentials, which digest ``parsed`` names."""
    import boto3
    import botocore.exceptions

    match = parsed.ecr
    assert match is not None
    image_id = {"imageDigest": parsed.digest} if parsed.digest else {"imageTag": parsed.tag}
    try:
        client = boto3.client("ecr", region_name=match["region"])
        resp = client.batch_get_image(
            registryId=match["account"],
            repositoryName=parsed.name,
            imageIds=[image_id],
            acceptedMediaTypes=list(MANIFEST_MEDIA_TYPES),
        )
    except botocore.exceptions.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "RepositoryNotFoundException":
            raise NotFound(
                f"ECR repository {parsed.name} does not exist in {parsed.registry}",
                hint="check the account, region and repository name",
            ) from None
        raise Unavailable(f"ECR {parsed.registry}: {exc}") from None
    except botocore.exceptions.NoCredentialsError:
        raise ConfigError(
            f"no AWS credentials to ask ECR about {parsed}",
            hint="configure AWS credentials (profile, role or env) that may ecr:BatchGetImage",
        ) from None
    except botocore.exceptions.BotoCoreError as exc:
        raise Unavailable(f"ECR {parsed.registry} unreachable: {exc}") from None
    images = resp.get("images") or []
    if not images:
        reason = (resp.get("failures") or [{}])[0].get("failureReason", "not found")
        raise NotFound(
            f"image {parsed} is not in ECR ({reason}); cannot pin it to a digest",
            hint="check the tag (push the image first)",
        )
    digest = images[0]["imageId"]["imageDigest"]
    if not DIGEST.match(digest):
        raise Unavailable(f"ECR answered {parsed} with an unusable digest {digest!r}")
    return digest


# ---- the one entry point ---------------------------------------------------------------------


def resolve_image(
    reference: str,
    *,
    insecure_registries: Iterable[str] = (),
    offline: bool = False,
) -> ImageRef:
    """Pin ``reference`` to a digest, asking its registry once.

    A tag is resolved; a digest is checked to exist (a typo would otherwise make a tuple that
    can never start); ``repo:tag@digest`` must agree. ``offline`` contacts nothing and accepts
    digests only.
    """
    if offline:
        return require_digest(reference)
    parsed = parse_image(reference)
    if parsed.ecr:
        found = ecr_digest(parsed)
        if parsed.tag and parsed.digest:
            _agree(parsed, ecr_digest(ParsedImage(parsed.registry, parsed.name, parsed.tag, None)))
    else:
        client = RegistryClient(
            parsed.registry,
            insecure=parsed.registry in set(insecure_registries),
            credentials=registry_credentials(parsed.registry),
        )
        found = client.manifest_digest(parsed.name, parsed.digest or parsed.tag or "")
        if parsed.tag and parsed.digest:
            _agree(parsed, client.manifest_digest(parsed.name, parsed.tag))
    if parsed.digest and found != parsed.digest:
        raise ConfigError(
            f"registry returned {found} for {parsed}, which names {parsed.digest}",
            hint="the registry rewrote the manifest; pin the digest the registry serves",
        )
    return pinned(parsed, found)


def _agree(parsed: ParsedImage, tagged: str) -> None:
    if tagged != parsed.digest:
        raise ConfigError(
            f"image {parsed}: tag {parsed.tag} now points at {tagged}, not {parsed.digest}",
            hint="drop the tag to pin the digest you gave, or drop the digest to pin the tag",
        )
