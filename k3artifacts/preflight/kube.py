"""The Kubernetes API as a kubeconfig reaches it: the current context's server, CA and bearer
token (or client certificate). Only ``GET /api/v1/nodes`` is asked."""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path
from typing import Any

import urllib3
import yaml

from k3artifacts.errors import ConfigError, Unavailable


def _named(items: list[dict[str, Any]], name: str, what: str, path: Path) -> dict[str, Any]:
    for item in items or []:
        if item.get("name") == name:
            return item.get(what) or {}
    raise ConfigError(f"kubeconfig {path} has no {what} named {name!r}")


class KubeAPI:
    """The API server of a kubeconfig's current context (server, CA, bearer token or client
    certificate), for the few calls k3a makes: list nodes, read and patch workloads."""

    def __init__(self, kubeconfig: Path):
        try:
            config = yaml.safe_load(kubeconfig.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read kubeconfig {kubeconfig}: {exc}") from None
        if not isinstance(config, dict) or not config.get("current-context"):
            raise ConfigError(f"kubeconfig {kubeconfig} names no current-context",
                              hint="kubectl config use-context CONTEXT")
        ctx = _named(config.get("contexts"), config["current-context"], "context", kubeconfig)
        cluster = _named(config.get("clusters"), ctx.get("cluster", ""), "cluster", kubeconfig)
        user = _named(config.get("users"), ctx.get("user", ""), "user", kubeconfig)
        self.server = str(cluster.get("server", "")).rstrip("/")
        if not self.server.startswith(("https://", "http://")):
            raise ConfigError(f"kubeconfig {kubeconfig}: cluster server {self.server!r} is not "
                              "a URL")
        self.headers = {"Accept": "application/json"}
        if user.get("token"):
            self.headers["Authorization"] = f"Bearer {user['token']}"
        # Certificates live as files for the life of this client (urllib3 reads paths).
        self._scratch = tempfile.TemporaryDirectory(prefix="k3a-kube-")
        pool_args: dict[str, Any] = {"timeout": urllib3.Timeout(connect=5, read=30),
                                     "retries": urllib3.Retry(total=2, backoff_factor=0.5,
                                                              allowed_methods=None)}
        if cluster.get("certificate-authority-data"):
            ca = Path(self._scratch.name, "ca.crt")
            ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
            pool_args.update(cert_reqs="CERT_REQUIRED", ca_certs=str(ca))
        elif cluster.get("certificate-authority"):
            pool_args.update(cert_reqs="CERT_REQUIRED", ca_certs=cluster["certificate-authority"])
        for key, field in (("client-certificate-data", "cert_file"),
                           ("client-key-data", "key_file")):
            if user.get(key):
                Path(self._scratch.name, key).write_bytes(base64.b64decode(user[key]))
                pool_args[field] = str(Path(self._scratch.name, key))
        self._http = urllib3.PoolManager(**pool_args)

    def call(self, method: str, path: str, body: bytes | None = None,
             content_type: str | None = None) -> dict[str, Any]:
        headers = dict(self.headers)
        if content_type:
            headers["Content-Type"] = content_type
        try:
            resp = self._http.request(method, f"{self.server}{path}", body=body, headers=headers)
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(f"Kubernetes API {self.server} cannot be reached: {exc}") from None
        if resp.status >= 300:
            raise Unavailable(f"Kubernetes API {self.server} answered HTTP {resp.status} to "
                              f"{method} {path}: {resp.data[:300]!r}",
                              hint="check the kubeconfig user's RBAC for this call")
        try:
            return dict(json.loads(resp.data))
        except (ValueError, TypeError):
            raise Unavailable(f"Kubernetes API {self.server}: {method} {path} answered no "
                              "JSON object") from None


def list_nodes(kubeconfig: Path) -> list[dict[str, Any]]:
    try:
        return list(KubeAPI(kubeconfig).call("GET", "/api/v1/nodes")["items"])
    except (KeyError, TypeError):
        raise Unavailable("Kubernetes API: /api/v1/nodes is not a NodeList") from None
