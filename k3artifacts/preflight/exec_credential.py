"""A kubeconfig's exec credential plugin (``aws eks get-token``), run with a deadline.

The official client runs the plugin with no timeout: a plugin that never returns (an SSO login
waiting for a browser, a hung STS call, a wrapper script stuck on a lock) would hang k3a with
it. So the plugin is run here instead: its command, arguments, environment and working
directory are still read by the client's own ``ExecProvider`` (what the Kubernetes project
keeps in step with kubectl), but the process is ours, started in its own session so that on
the deadline (``K3A_KUBE_EXEC_TIMEOUT``) it is killed with every process it started, and
refused by name (:class:`ConfigError`, exit 9, like every other plugin failure). It is run
without a terminal (``spec.interactive`` false): a prompt would only wait for the deadline.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
from typing import Any

from k3artifacts.errors import ConfigError, shown
from k3artifacts.settings import load

#: Run the plugin again this long before its token expires (the official client's skew).
RENEW_BEFORE = dt.timedelta(minutes=5)
#: Seconds a killed plugin's pipes are still read for, in case a process it started left its
#: session and holds them open.
_DRAIN_S = 2.0


class ExecPlugin:
    """The plugin of one kubeconfig user: its credential now, and again before it expires."""

    def __init__(self, exec_config: Any, cwd: str | None, cluster: Any, source: str):
        from kubernetes.config.exec_provider import ExecProvider

        # Reads command, args, env and provideClusterInfo as kubectl does; raises the
        # client's ConfigException for a malformed entry (the caller names the kubeconfig).
        self._provider = ExecProvider(exec_config, cwd, cluster)
        self.source = source
        self.command = shown(shlex.join(str(a) for a in self._provider.args))
        self._status: dict[str, Any] = {}
        self._expiry: dt.datetime | None = None

    def status(self) -> dict[str, Any]:
        """The ExecCredential's ``status`` (``token``, or ``clientCertificateData`` and
        ``clientKeyData``), run again when the last one is about to expire."""
        if not self._status or (self._expiry is not None
                                and self._expiry - RENEW_BEFORE <= dt.datetime.now(dt.UTC)):
            self._status = self._run()
            self._expiry = self._expires(self._status)
        return self._status

    def authorization(self) -> str | None:
        token = self.status().get("token")
        return f"Bearer {token}" if token else None

    def certificate_fields(self) -> dict[str, str]:
        """A client certificate credential as a kubeconfig user's fields, for the client's
        loader to write where TLS can use it; nothing for a token."""
        status = self.status()
        if status.get("token"):
            return {}

        def encoded(pem: str) -> str:
            return base64.b64encode(pem.encode()).decode()
        return {"client-certificate-data": encoded(status["clientCertificateData"]),
                "client-key-data": encoded(status["clientKeyData"])}

    def _run(self) -> dict[str, Any]:
        deadline = load().kube_exec_timeout
        provider = self._provider
        request: dict[str, Any] = {"apiVersion": provider.api_version, "kind": "ExecCredential",
                                   "spec": {"interactive": False}}
        if provider.cluster is not None:
            request["spec"]["cluster"] = dict(provider.cluster.value)
            for extension in provider.cluster.value.get("extensions") or []:
                if extension.get("name") == "client.authentication.k8s.io/exec":
                    request["spec"]["cluster"]["config"] = extension.get("extension")
                    break
        env = {**provider.env, "KUBERNETES_EXEC_INFO": json.dumps(request)}
        try:
            process = subprocess.Popen(
                provider.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, cwd=provider.cwd, env=env, start_new_session=True)
        except OSError as exc:
            raise self._refused(f"could not be started: {exc}") from None
        try:
            stdout, stderr = process.communicate(timeout=deadline)
        except subprocess.TimeoutExpired:
            _kill_session(process)
            raise self._refused(f"did not answer within {deadline:g} s; it was stopped with "
                                "every process it started") from None
        if process.returncode != 0:
            said = shown(stderr.decode("utf-8", "replace").strip()[-500:])
            raise self._refused(f"exited with status {process.returncode}"
                                + (f": {said}" if said else ""))
        return self._parse(stdout)

    def _parse(self, stdout: bytes) -> dict[str, Any]:
        try:
            answer = json.loads(stdout)
        except (ValueError, RecursionError):
            answer = None
        if not isinstance(answer, dict) or answer.get("kind") != "ExecCredential":
            raise self._refused("printed no ExecCredential")
        if answer.get("apiVersion") != self._provider.api_version:
            raise self._refused(f"answered apiVersion {str(answer.get('apiVersion'))[:100]!r}, "
                                f"not the {self._provider.api_version!r} the kubeconfig asks "
                                "for")
        status = answer.get("status")
        if not isinstance(status, dict):
            raise self._refused("printed an ExecCredential without a status")
        token = status.get("token")
        certificate = [status.get(k) for k in ("clientCertificateData", "clientKeyData")]
        if not (isinstance(token, str) and token) and not all(
                isinstance(v, str) and v for v in certificate):
            raise self._refused("printed an ExecCredential with neither a token nor a client "
                                "certificate and key")
        return status

    def _expires(self, status: dict[str, Any]) -> dt.datetime | None:
        stamp = status.get("expirationTimestamp")
        if stamp is None:
            return None  # valid until the API server says otherwise, as kubectl takes it
        try:
            expiry = dt.datetime.fromisoformat(str(stamp))
        except ValueError:
            expiry = None
        if expiry is None or expiry.tzinfo is None:
            raise self._refused(f"printed an expirationTimestamp {str(stamp)[:60]!r} that is "
                                "not an RFC 3339 time")
        return expiry

    def _refused(self, what: str) -> ConfigError:
        return ConfigError(
            f"{self.source}: the user's exec credential plugin (`{self.command}`) {what}",
            hint=f"run the plugin's command yourself (`{self.command}`): it must print an "
            "ExecCredential without asking for input (for `aws eks get-token`, log in first "
            "with `aws sso login` or check the AWS profile); K3A_KUBE_EXEC_TIMEOUT sets how "
            "long it may take")


def _kill_session(process: subprocess.Popen[bytes]) -> None:
    """Kill the plugin and every process it started (its session's process group), reap it,
    and stop reading its pipes shortly after even if something it started still holds them."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        process.communicate(timeout=_DRAIN_S)
    except subprocess.TimeoutExpired:
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        process.wait()
