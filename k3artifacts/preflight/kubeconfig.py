"""Where the Kubernetes API is and who k3a is to it, found as kubectl finds it.

Read with the official ``kubernetes`` client's config loaders, not a parser of our own: they
are what the Kubernetes project keeps in step with kubectl, and they cover every way a user
authenticates: exec credential plugins (``aws eks get-token`` writes
``users[].user.exec``: its ExecCredential's ``status.token`` is the bearer token, run again
once its ``expirationTimestamp`` is near; the plugin is read by the client but run by
:mod:`.exec_credential`, with a deadline), token and token files, client certificates (files
or ``-data``), auth providers, the current context and its namespace, and a pod's in-cluster
service account (re-read as it rotates). ``lightkube`` and ``kr8s`` read kubeconfigs too, but
their authentication is bound to their own httpx transports; the official loaders hand back
plain values (server, CA file, certificate files, a token getter) that our own network layer
(:mod:`k3artifacts.net`) sends with. Only those loaders are imported, and only by the commands
that talk to a cluster (``k3a preflight``, ``k3a rollback --single-node``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3artifacts.errors import ConfigError
from k3artifacts.preflight.exec_credential import ExecPlugin
from k3artifacts.settings import load

KUBECONFIG_HINT = ("check the kubeconfig (`kubectl --kubeconfig PATH config view`); for EKS "
                   "write it with `aws eks update-kubeconfig --name CLUSTER`")


@dataclass(frozen=True)
class KubeTarget:
    """An API server and the credential to reach it with."""

    server: str
    namespace: str
    #: What it was read from, for messages: a kubeconfig and context, or the service account.
    source: str
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    verify: bool
    tls_server_name: str | None
    #: The ``Authorization`` value for the next request (None: a client certificate only); an
    #: exec plugin is run again here once its token is about to expire.
    authorization: Callable[[], str | None]


def load_target(kubeconfig: Path | None, context: str | None = None) -> KubeTarget:
    """The target of ``kubeconfig``'s current context (or ``context``); with no kubeconfig,
    the service account of the pod k3a runs in."""
    from kubernetes.client import Configuration
    from kubernetes.config.config_exception import ConfigException

    config = Configuration()
    plugin: ExecPlugin | None = None
    try:
        if kubeconfig is None:
            namespace, source = _in_cluster(config)
        else:
            namespace, source, plugin = _from_file(config, kubeconfig, context)
    except ConfigException as exc:
        raise ConfigError(f"{kubeconfig or 'in-cluster configuration'}: {exc}",
                          hint=KUBECONFIG_HINT) from None
    if getattr(config, "proxy", None):
        raise ConfigError(f"{source}: the cluster's proxy-url is not supported",
                          hint="reach the API server directly (a VPC route or a port-forward)")
    server = str(config.host or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise ConfigError(f"{source}: cluster server {server[:200]!r} is not a URL",
                          hint=KUBECONFIG_HINT)

    def authorization() -> str | None:
        if plugin is not None:
            return plugin.authorization()
        try:
            value = config.get_api_key_with_prefix("BearerToken", alias="authorization")
        except ConfigException as exc:
            raise ConfigError(f"{source}: the credential cannot be renewed: {exc}",
                              hint=KUBECONFIG_HINT) from None
        # A token file ends in a newline more often than not; kubectl trims it (client-go's
        # TrimSpace), the Python client does not. What is left must fit in a header.
        value = value.strip() if value else value
        if value and not value.isprintable():
            raise ConfigError(f"{source}: the user's token holds a line break or a control "
                              "character", hint=KUBECONFIG_HINT)
        return value

    return KubeTarget(
        server=server, namespace=namespace, source=source, ca_file=config.ssl_ca_cert,
        cert_file=config.cert_file, key_file=config.key_file, verify=bool(config.verify_ssl),
        tls_server_name=getattr(config, "tls_server_name", None), authorization=authorization)


def _from_file(config: Any, path: Path,
               context: str | None) -> tuple[str, str, ExecPlugin | None]:
    import yaml
    from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

    try:
        merged = KubeConfigMerger(str(path)).config
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc}") from None
    if merged is None or (context is None and not merged.safe_get("current-context")):
        raise ConfigError(f"kubeconfig {path} names no current-context",
                          hint="kubectl config use-context CONTEXT")
    try:
        loader = KubeConfigLoader(config_dict=merged, active_context=context)
        chosen = loader.current_context
        source = f"kubeconfig {path} (context {chosen.get('name')!r})"
        plugin = _exec_plugin(merged, chosen, source)
        loader.load_and_set(config)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"kubeconfig {path} is malformed ({type(exc).__name__}: {exc})",
                          hint=KUBECONFIG_HINT) from None
    namespace = (chosen.get("context") or {}).get("namespace") or "default"
    return str(namespace), source, plugin


def _exec_plugin(merged: Any, chosen: dict[str, Any], source: str) -> ExecPlugin | None:
    """The context user's exec plugin, run once (with its deadline) and taken out of the user
    entry so the client's loader never runs it itself; None if the user has none, or a
    credential the client prefers to it (an auth provider or a token, as kubectl does)."""
    users = merged["users"] if "users" in merged else None
    user_name = (chosen.get("context") or {}).get("user")
    entry = users.get_with_name(user_name, safe=True) if users and user_name else None
    user = entry.value.get("user") if entry else None
    if not isinstance(user, dict) or not user.get("exec") or any(
            key in user for key in ("auth-provider", "token", "tokenFile")):
        return None
    cluster_name = (chosen.get("context") or {}).get("cluster")
    cluster = merged["clusters"].get_with_name(cluster_name)["cluster"]
    cwd = str(Path(entry.path).resolve().parent) if entry.path else None
    plugin = ExecPlugin(entry["user"]["exec"], cwd, cluster, source)
    fields = plugin.certificate_fields()
    # The loader shares this dict (the merged kubeconfig's user entry): it loads the
    # credential from what is left, the plugin's certificate if it gave one.
    del user["exec"]
    user.update(fields)
    return plugin


def _in_cluster(config: Any) -> tuple[str, str]:
    from kubernetes.config.incluster_config import (
        SERVICE_HOST_ENV_NAME,
        SERVICE_PORT_ENV_NAME,
        InClusterConfigLoader,
    )

    settings = load()
    if not (settings.kubernetes_service_host and settings.kubernetes_service_port):
        raise ConfigError("no kubeconfig, and not in a pod (KUBERNETES_SERVICE_HOST and "
                          "KUBERNETES_SERVICE_PORT are unset)",
                          hint="pass --kubeconfig PATH (or set KUBECONFIG)")
    account = settings.kube_service_account_dir
    InClusterConfigLoader(
        token_filename=str(account / "token"), cert_filename=str(account / "ca.crt"),
        environ={SERVICE_HOST_ENV_NAME: settings.kubernetes_service_host,
                 SERVICE_PORT_ENV_NAME: settings.kubernetes_service_port},
    ).load_and_set(config)
    try:
        namespace = (account / "namespace").read_text().strip() or "default"
    except FileNotFoundError:
        namespace = "default"
    return namespace, f"in-cluster service account {account}"
