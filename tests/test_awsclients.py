"""Client configuration and what an unusable endpoint turns into."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from k3artifacts.errors import ConfigError, Unavailable
from k3artifacts.stores import awsclients
from k3artifacts.stores.s3 import S3Store


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nobody listens once the socket is closed


@pytest.mark.parametrize("endpoint", ["127.0.0.1:9000", "ftp://host", "http://", "http://h:x"])
def test_malformed_endpoint_is_a_config_error(endpoint: str) -> None:
    with pytest.raises(ConfigError) as err:
        awsclients.s3_client(endpoint)
    assert err.value.hint


def test_malformed_endpoint_from_env(monkeypatch) -> None:
    monkeypatch.setenv("K3A_S3_ENDPOINT_URL", "localhost:5000")
    with pytest.raises(ConfigError, match="localhost:5000"):
        S3Store.from_url("s3://k3a-bucket/p")


def test_unreachable_endpoint_is_unavailable(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # the operator's setting wins over ours
    store = S3Store.from_url("s3://k3a-bucket/p", endpoint_url=f"http://127.0.0.1:{closed_port()}")
    assert store.client.meta.config.retries.get("max_attempts") is None
    with pytest.raises(Unavailable) as err:
        store.read("releases/channels/production.json")
    assert "k3a-bucket" in str(err.value) and "endpoint" in (err.value.hint or "")


def test_retry_timeouts_and_addressing_defaults(monkeypatch) -> None:
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    client = awsclients.s3_client("http://127.0.0.1:1")
    config = client.meta.config
    assert config.retries == {"mode": "standard", "total_max_attempts": 10}
    assert (config.connect_timeout, config.read_timeout) == (10, 120)
    assert config.s3 == {"addressing_style": "path"}
    assert client.meta.region_name  # some region to sign with, even with none configured


def test_cli_reports_unreachable_store_with_exit_8(k3a_cmd, k3a_env) -> None:
    env = {**k3a_env, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
           "AWS_MAX_ATTEMPTS": "1", "AWS_CONFIG_FILE": "/nonexistent",
           "K3A_S3_ENDPOINT_URL": f"http://127.0.0.1:{closed_port()}"}
    out = subprocess.run(
        [*k3a_cmd, "fsx", "preload", f"org/name@{'a' * 40}", "--file-system-id", "fs-1",
         "--store", "s3://k3a-bucket/p"], env=env, check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 8, out.stderr
    assert "cannot reach the endpoint" in out.stderr and "next:" in out.stderr
    assert "Traceback" not in out.stderr


def test_an_s3_store_opens_without_boto3_or_s3transfer(k3a_env) -> None:
    """Every S3 command opens a store; only a staging upload or copy needs s3transfer, and
    nothing needs boto3's layer over botocore (issue 22: each costs every command's start)."""
    probe = ("import sys; from k3artifacts.stores.s3 import S3Store; "
             "S3Store.from_url('s3://k3a-bucket/p', endpoint_url='http://127.0.0.1:1'); "
             "print(sorted({'boto3', 's3transfer'} & {m.split('.')[0] for m in sys.modules}))")
    proc = subprocess.run([sys.executable, "-c", probe], env={**k3a_env, "AWS_CONFIG_FILE":
                          "/nonexistent"}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_missing_profile_is_a_config_error(monkeypatch) -> None:
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(ConfigError, match="no-such-profile") as err:
        awsclients.s3_client("http://127.0.0.1:1", profile="no-such-profile")
    assert "AWS_PROFILE" in (err.value.hint or "")


def test_the_shared_loader_reads_the_models_botocore_reads(tmp_path) -> None:
    """k3a's loader skips listing every service and parses into plain dicts: the same
    models and the same refusal of a service botocore does not know, AWS_DATA_PATH included."""
    from botocore.exceptions import UnknownServiceError
    from botocore.loaders import create_loader

    extra = tmp_path / "data" / "k3a-test" / "2026-01-01"
    extra.mkdir(parents=True)
    (extra / "service-2.json").write_text('{"metadata": {"protocol": "json"}, "b": 1, "a": 2}')
    ours, stock = awsclients._shared_loader(str(tmp_path / "data")), \
        create_loader(str(tmp_path / "data"))
    for service, kind in (("s3", "service-2"), ("s3", "endpoint-rule-set-1"),
                          ("kms", "service-2"), ("k3a-test", "service-2")):
        model = ours.load_service_model(service, kind)
        assert model == stock.load_service_model(service, kind)
        assert list(model) == list(stock.load_service_model(service, kind))  # same order
    assert ours.load_data("endpoints") == stock.load_data("endpoints")
    with pytest.raises(UnknownServiceError, match="no-such-service") as err:
        ours.load_service_model("no-such-service", "service-2")
    assert "s3, " in str(err.value) and "k3a-test" in str(err.value)  # the full listing
