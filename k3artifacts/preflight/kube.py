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


def list_nodes(kubeconfig: Path) -> list[dict[str, Any]]:
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
    server = str(cluster.get("server", "")).rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise ConfigError(f"kubeconfig {kubeconfig}: cluster server {server!r} is not a URL")
    headers = {"Accept": "application/json"}
    if user.get("token"):
        headers["Authorization"] = f"Bearer {user['token']}"
    with tempfile.TemporaryDirectory() as scratch:
        pool_args: dict[str, Any] = {"timeout": urllib3.Timeout(connect=5, read=30),
                                     "retries": urllib3.Retry(total=2, backoff_factor=0.5)}
        if cluster.get("certificate-authority-data"):
            ca = Path(scratch, "ca.crt")
            ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
            pool_args.update(cert_reqs="CERT_REQUIRED", ca_certs=str(ca))
        elif cluster.get("certificate-authority"):
            pool_args.update(cert_reqs="CERT_REQUIRED", ca_certs=cluster["certificate-authority"])
        for key, field in (("client-certificate-data", "cert_file"),
                           ("client-key-data", "key_file")):
            if user.get(key):
                Path(scratch, key).write_bytes(base64.b64decode(user[key]))
                pool_args[field] = str(Path(scratch, key))
        try:
            resp = urllib3.PoolManager(**pool_args).request("GET", f"{server}/api/v1/nodes",
                                                            headers=headers)
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(f"Kubernetes API {server} cannot be reached: {exc}") from None
    if resp.status != 200:
        raise Unavailable(f"Kubernetes API {server} answered HTTP {resp.status} to GET "
                          "/api/v1/nodes", hint="the kubeconfig's user needs `list nodes`")
    try:
        return list(json.loads(resp.data)["items"])
    except (ValueError, KeyError, TypeError):
        raise Unavailable(f"Kubernetes API {server}: /api/v1/nodes is not a NodeList") from None
