"""The Kubernetes client with the configurations users really have, against a local API
stand-in that answers 401 without the right credential: an EKS-style exec credential plugin
(a small script printing an ExecCredential, run again when its token expires), a pod's
in-cluster service account (HTTPS, its CA, its namespace), and a hostile API (a trickled body,
nodes that are not nodes)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from k3artifacts.errors import BadAnswer, ConfigError, Unavailable
from k3artifacts.preflight import checks
from k3artifacts.preflight.kube import KubeAPI, list_nodes
from k3artifacts.serving.profiles import load_profile
from tests.faults.faultkit import send_slowly, serving
from tests.support.waiting import wait_until

EXEC_API = "client.authentication.k8s.io/v1beta1"
NODE = {"metadata": {"name": "gpu-a",
                     "labels": {"node.kubernetes.io/instance-type": "p6-b300.48xlarge"}},
        "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "8"},
                               "conditions": [{"type": "Ready", "status": "True"}]}}


class Api:
    """What the stand-in answers: GET /api/v1/nodes for ``token`` only, else 401."""

    def __init__(self, token: str):
        self.token = token
        self.items: list = [NODE]
        self.trickle = False
        self.seen: list[str | None] = []


def api_server(api: Api, tls: tuple[Path, Path] | None = None):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802 - the base class's name
            auth = self.headers.get("Authorization")
            api.seen.append(auth)
            scheme, _, token = (auth or "").partition(" ")
            if scheme.lower() != "bearer" or token != api.token:
                body = b'{"kind":"Status","code":401,"message":"Unauthorized"}'
                self.send_response(401)
            else:
                body = json.dumps({"kind": "NodeList", "items": api.items}).encode()
                self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if api.trickle:
                send_slowly(self.wfile, body)
            else:
                self.wfile.write(body)

    return serving(Handler, tls)


def kubeconfig(path: Path, server: str, user: dict, namespace: str | None = None) -> Path:
    context = {"cluster": "k3", "user": "k3", **({"namespace": namespace} if namespace else {})}
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "k3",
        "clusters": [{"name": "k3", "cluster": {"server": server}}],
        "users": [{"name": "k3", "user": user}],
        "contexts": [{"name": "k3", "context": context}]}))
    return path


def exec_plugin(tmp_path: Path, expires_in: dt.timedelta) -> tuple[dict, Path]:
    """A credential plugin as ``aws eks update-kubeconfig`` writes one: a command with args
    and env; it prints an ExecCredential and counts its runs."""
    runs = tmp_path / "plugin-runs"
    script = tmp_path / "get-token.py"
    expiry = (dt.datetime.now(dt.UTC) + expires_in).strftime("%Y-%m-%dT%H:%M:%SZ")
    script.write_text(
        "import json, os, sys\n"
        f"with open({str(runs)!r}, 'a') as f: f.write('run\\n')\n"
        "assert sys.argv[1:] == ['eks', 'get-token', '--cluster-name', 'k3']\n"
        f"print(json.dumps({{'apiVersion': {EXEC_API!r}, 'kind': 'ExecCredential',\n"
        f"    'status': {{'token': os.environ['K3A_TEST_TOKEN'],\n"
        f"                'expirationTimestamp': {expiry!r}}}}}))\n")
    user = {"exec": {"apiVersion": EXEC_API, "command": sys.executable,
                     "args": [str(script), "eks", "get-token", "--cluster-name", "k3"],
                     "env": [{"name": "K3A_TEST_TOKEN", "value": "exec-t0ken"}],
                     "interactiveMode": "Never"}}
    return user, runs


def test_an_exec_plugin_token_reaches_an_api_that_refuses_everything_else(tmp_path):
    api = Api("exec-t0ken")
    with api_server(api) as url:
        plain = kubeconfig(tmp_path / "none", url, {})
        with pytest.raises(Unavailable, match="refused the credential of kubeconfig"):
            list_nodes(plain)
        assert api.seen == [None]
        user, runs = exec_plugin(tmp_path, dt.timedelta(hours=1))
        config = kubeconfig(tmp_path / "eks", url, user, namespace="serving")
        kube = KubeAPI(config)
        assert kube.namespace == "serving"
        assert kube.call("GET", "/api/v1/nodes")["items"] == [NODE]
        assert kube.call("GET", "/api/v1/nodes")["items"] == [NODE]
    assert api.seen[1:] == ["Bearer exec-t0ken"] * 2
    # Valid for an hour: run once, its token reused.
    assert runs.read_text().count("run") == 1


def test_a_token_file_is_read_for_the_bearer_token(tmp_path):
    """A kubeconfig user with ``tokenFile`` (what a projected token or a CI secret mount
    gives): its content, trimmed as kubectl trims it, is the credential; a file holding a
    second line is refused by name, never sent as a header."""
    api = Api("file-t0ken")
    (tmp_path / "token").write_text("file-t0ken\n")
    with api_server(api) as url:
        nodes = list_nodes(kubeconfig(tmp_path / "k", url, {"tokenFile": str(tmp_path / "token")}))
    assert [n["metadata"]["name"] for n in nodes] == [NODE["metadata"]["name"]]
    assert api.seen == ["Bearer file-t0ken"]
    (tmp_path / "token").write_text("file-t0ken\nX-Injected: 1\n")
    with pytest.raises(ConfigError, match="token holds a line break"):
        list_nodes(kubeconfig(tmp_path / "k", "http://127.0.0.1:9",
                              {"tokenFile": str(tmp_path / "token")}))


def test_an_expiring_exec_token_is_fetched_again(tmp_path):
    """A token that expires within the client's skew (5 min) is renewed before each use."""
    api = Api("exec-t0ken")
    user, runs = exec_plugin(tmp_path, dt.timedelta(minutes=1))
    with api_server(api) as url:
        kube = KubeAPI(kubeconfig(tmp_path / "eks", url, user))
        kube.call("GET", "/api/v1/nodes")
        kube.call("GET", "/api/v1/nodes")
    assert runs.read_text().count("run") == 3  # loading, then once per call


def test_a_failing_exec_plugin_is_a_named_refusal(tmp_path):
    user = {"exec": {"apiVersion": EXEC_API, "command": sys.executable,
                     "args": ["-c", "import sys; sys.exit('no SSO session')"]}}
    config = kubeconfig(tmp_path / "eks", "http://127.0.0.1:9", user)
    with pytest.raises(ConfigError, match="exec credential plugin .* exited with status 1: no SSO session") as err:
        KubeAPI(config)
    assert "aws eks get-token" in err.value.hint


@pytest.mark.timeout(30)  # before the plugin had a deadline, this test hung here
def test_a_plugin_that_never_answers_is_killed_with_its_children_at_the_deadline(
        tmp_path, monkeypatch):
    """``aws eks get-token`` stuck (an SSO login waiting, a hung STS call): the plugin and what
    it started are killed at K3A_KUBE_EXEC_TIMEOUT and the command fails by name (exit 9)."""
    monkeypatch.setenv("K3A_KUBE_EXEC_TIMEOUT", "1")
    pids = tmp_path / "pids"
    script = tmp_path / "get-token.sh"
    script.write_text(f"sleep 3600 &\necho $$ $! > {pids}.tmp\nmv {pids}.tmp {pids}\nwait\n")
    user = {"exec": {"apiVersion": EXEC_API, "command": "/bin/sh",
                     "args": [str(script), "eks", "get-token"]}}
    config = kubeconfig(tmp_path / "eks", "http://127.0.0.1:9", user)
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        KubeAPI(config)
    assert time.monotonic() - started < 10
    assert err.value.exit_code == 9
    assert "exec credential plugin" in str(err.value)
    assert "did not answer within 1 s; it was stopped" in str(err.value)
    assert f"{script} eks get-token" in err.value.hint
    assert "K3A_KUBE_EXEC_TIMEOUT" in err.value.hint
    plugin, child = (int(p) for p in pids.read_text().split())
    wait_until(lambda: not _alive(plugin) and not _alive(child),
               "the plugin and its child to be gone", timeout=10)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_a_plugin_answer_that_is_no_credential_is_refused_by_name(tmp_path):
    user = {"exec": {"apiVersion": EXEC_API, "command": sys.executable,
                     "args": ["-c", "print('{\"kind\": \"ExecCredential\"}')"]}}
    config = kubeconfig(tmp_path / "eks", "http://127.0.0.1:9", user)
    with pytest.raises(ConfigError, match="exec credential plugin .* answered apiVersion"):
        KubeAPI(config)


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "api.crt", tmp_path / "api.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_in_cluster_service_account(tmp_path, monkeypatch):
    cert, key = _self_signed(tmp_path)
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("sa-t0ken")
    (account / "ca.crt").write_bytes(cert.read_bytes())
    (account / "namespace").write_text("inference\n")
    api = Api("sa-t0ken")
    with api_server(api, tls=(cert, key)) as url:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", url.rsplit(":", 1)[1])
        monkeypatch.setenv("K3A_KUBE_SERVICE_ACCOUNT_DIR", str(account))
        kube = KubeAPI(None)
        assert kube.server == url and kube.namespace == "inference"
        assert list_nodes(None) == [NODE]
        # The CA is the account's: the same server is refused against another one.
        other = tmp_path / "other"
        other.mkdir()
        (account / "ca.crt").write_bytes(_self_signed(other)[0].read_bytes())
        monkeypatch.setenv("K3A_HTTP_ATTEMPTS", "1")
        with pytest.raises(Unavailable, match="TLS handshake failed"):
            list_nodes(None)


def test_no_kubeconfig_outside_a_pod_is_a_named_refusal(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(ConfigError, match="no kubeconfig, and not in a pod") as err:
        KubeAPI(None)
    assert "--kubeconfig" in err.value.hint


def test_a_trickled_api_body_fails_within_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setenv("K3A_HTTP_DEADLINE", "1")
    monkeypatch.setenv("K3A_HTTP_READ_TIMEOUT", "5")
    monkeypatch.setenv("K3A_HTTP_ATTEMPTS", "2")
    monkeypatch.setenv("K3A_HTTP_BACKOFF", "0.01")
    api = Api("t0ken")
    api.trickle = True
    with api_server(api) as url:
        config = kubeconfig(tmp_path / "k", url.replace("http://", "http://ops:pw@"),
                            {"token": "t0ken"})
        started = time.monotonic()
        with pytest.raises(Unavailable) as err:
            list_nodes(config)
    assert time.monotonic() - started < 10
    assert "not complete within its deadline (after 2 attempts)" in str(err.value)
    assert "ops:***@" in str(err.value) and "pw@" not in str(err.value)


#: The packaged B300 profile: one p6-b300.48xlarge node with 8 GPUs.
RESOURCES = load_profile("p6-b300-tp8").serving


@pytest.mark.parametrize("items,words", [
    ([{**NODE, "status": {"allocatable": {"nvidia.com/gpu": "8.5k"}}}],
     "node gpu-a's allocatable nvidia.com/gpu is '8.5k', not a whole number of GPUs"),
    ([{**NODE, "status": {"allocatable": {"nvidia.com/gpu": "1e3"}}}], "'1e3', not a whole"),
    ([{**NODE, "status": {"allocatable": {"nvidia.com/gpu": "99999"}}}], "'99999', not a whole"),
    (["not a node"], "node 0 is 'not a node', not an object"),
    ([{**NODE, "metadata": ["x"]}], "node 0's metadata is \"['x']\", not an object"),
    ([{**NODE, "status": {"conditions": ["Ready"]}}], "conditions are not a list of objects"),
], ids=["8.5k", "1e3", "too-many", "item-string", "metadata-list", "conditions-strings"])
def test_nodes_that_are_not_nodes_fail_the_check_by_name(tmp_path, items, words):
    api = Api("t0ken")
    api.items = items
    with api_server(api) as url:
        nodes = list_nodes(kubeconfig(tmp_path / "k", url, {"token": "t0ken"}))
    with pytest.raises(BadAnswer, match="Kubernetes API: "):
        checks.node_health(nodes, RESOURCES)
    outcome = checks.guarded("node_health", lambda: checks.node_health(nodes, RESOURCES))
    assert not outcome.passed and words in outcome.reason
