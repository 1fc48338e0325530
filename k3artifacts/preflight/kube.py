"""The Kubernetes API as a kubeconfig (or a pod's service account) reaches it: the few calls
k3a makes (list nodes; read and patch workloads), sent through the network layer with the
target's CA, client certificate and bearer token (:mod:`.kubeconfig`). Every answer is read
within the settings' deadline and bounded in size; one that is not a JSON object is refused
(:class:`BadAnswer`, exit 8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from k3artifacts.errors import BadAnswer, Unavailable
from k3artifacts.net.calls import Peer, call
from k3artifacts.net.pool import make_pool
from k3artifacts.net.redact import redact_url
from k3artifacts.preflight.kubeconfig import load_target

#: A NodeList of 5,000 nodes is a few tens of MB.
MAX_ANSWER = 256 << 20


class KubeAPI:
    """The API server of a kubeconfig's current context (or ``context``), or with no
    kubeconfig the in-cluster service account's."""

    def __init__(self, kubeconfig: Path | None = None, *, context: str | None = None):
        self.target = load_target(kubeconfig, context)
        self.server = self.target.server
        #: The context's namespace (the service account's, in a pod).
        self.namespace = self.target.namespace
        self.shown = redact_url(self.server)
        self._pool = make_pool(ca_certs=self.target.ca_file, cert_file=self.target.cert_file,
                               key_file=self.target.key_file, verify=self.target.verify,
                               server_hostname=self.target.tls_server_name)
        self._peer = Peer(f"Kubernetes API {self.shown}",
                          hint=f"check the API server of {self.target.source} and the route "
                          "to it")

    def call(self, method: str, path: str, body: bytes | None = None,
             content_type: str | None = None) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        authorization = self.target.authorization()
        if authorization:
            headers["Authorization"] = authorization
        if content_type:
            headers["Content-Type"] = content_type
        # Every call k3a makes is idempotent, its patches too (a server-side apply or a merge
        # patch of the same body leaves the same object): each may be retried.
        answer = call(method, f"{self.server}{path}", self._peer, headers=headers, body=body,
                      pool=self._pool, auth_origin=self.server, limit=MAX_ANSWER,
                      idempotent=True)
        if answer.status == 401:
            raise Unavailable(
                f"Kubernetes API {self.shown} refused the credential of {self.target.source} "
                f"(HTTP 401 to {method} {path})",
                hint="check the kubeconfig user (an exec plugin's token, a token file, a "
                "client certificate) with `kubectl auth whoami`")
        if answer.status >= 300:
            raise Unavailable(f"Kubernetes API {self.shown} answered HTTP {answer.status} to "
                              f"{method} {path}: {answer.body[:300]!r}",
                              hint="check the kubeconfig user's RBAC for this call")
        try:
            document = json.loads(answer.body)
        except (ValueError, RecursionError):
            document = None
        if not isinstance(document, dict):
            raise BadAnswer(f"Kubernetes API {self.shown}: {method} {path} answered no JSON "
                            "object")
        return document


def list_nodes(kubeconfig: Path | None) -> list[Any]:
    """The items of ``GET /api/v1/nodes`` (each checked by its reader, not here)."""
    items = KubeAPI(kubeconfig).call("GET", "/api/v1/nodes").get("items")
    if not isinstance(items, list):
        raise BadAnswer("Kubernetes API: /api/v1/nodes is not a NodeList (no list of items)")
    return items
