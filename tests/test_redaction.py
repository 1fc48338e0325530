"""A credential in a URL (an endpoint typed with its password, a presigned link's signature)
is never printed, logged, put in ``--json`` output or stored: stage's ``--endpoint``,
``K3A_S3_ENDPOINT_URL``, and the endpoint an evaluation record names."""

from __future__ import annotations

import json
import logging
import subprocess

import pytest

from k3artifacts.net.redact import redact_text, redact_url, url_secrets
from k3artifacts.reporting.logs import configure_logging
from k3artifacts.serving.render.common import served_names
from k3artifacts.stores.file import FileStore
from tests.support.openai_server import start
from tests.support.ports import free_ports
from tests.support.releases import Releases

SECRET = "S3CRET-pw"


@pytest.mark.parametrize("url,shown", [
    (f"http://admin:{SECRET}@host:8000/v1", "http://admin:***@host:8000/v1"),
    ("https://host/x?token=abc&page=2", "https://host/x?token=***&page=2"),
    ("https://cdn/f?X-Amz-Signature=ab12&X-Amz-Credential=AKIA%2F1&X-Amz-Expires=60",
     "https://cdn/f?X-Amz-Signature=***&X-Amz-Credential=***&X-Amz-Expires=60"),
    ("https://blob/f?sv=2024&sig=Zm9v&se=2026", "https://blob/f?sv=2024&sig=***&se=2026"),
    ("https://token@host/x", "https://token@host/x"),
    ("https://host/plain", "https://host/plain"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown


def test_url_secrets_are_the_password_and_credential_values_as_written_and_decoded():
    assert url_secrets("http://ops:p%40ss-word@h:1/v1?token=t0k&page=2") == {
        "p%40ss-word", "p@ss-word", "t0k"}
    assert url_secrets("https://token@host/x?page=2") == frozenset()


def test_redact_text_finds_every_url():
    text = (f"hub at http://u:{SECRET}@h:1 unavailable: "
            f"redirected to 'https://cdn/x?Signature={SECRET}&a=1'")
    assert SECRET not in redact_text(text)
    assert "http://u:***@h:1" in redact_text(text) and "Signature=***&a=1" in redact_text(text)


def test_log_lines_are_redacted(capsys):
    configure_logging("text")
    logging.getLogger("k3artifacts.test").warning("retrying http://u:%s@h/x", SECRET)
    err = capsys.readouterr().err
    assert "http://u:***@h/x" in err and SECRET not in err


def _closed_port() -> int:
    (port,) = free_ports(1)
    return port


def test_stage_endpoint_password_is_not_printed(k3a_cmd, k3a_env, tmp_path):
    endpoint = f"http://ops:{SECRET}@127.0.0.1:{_closed_port()}"
    run = subprocess.run([*k3a_cmd, "stage", "org/name", "--endpoint", endpoint, "--json",
                          "--store", f"file://{tmp_path / 'store'}", "-q"],
                         env=k3a_env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 8, run.stderr
    assert SECRET not in run.stdout + run.stderr
    assert "hub at http://ops:***@127.0.0.1" in json.loads(run.stdout)["error"]


def test_s3_endpoint_password_is_not_printed(k3a_cmd, k3a_env):
    env = {**k3a_env, "K3A_S3_ENDPOINT_URL": f"http://ops:{SECRET}@127.0.0.1:{_closed_port()}",
           "AWS_ACCESS_KEY_ID": "k3a", "AWS_SECRET_ACCESS_KEY": "k3a", "AWS_REGION": "us-east-1"}
    run = subprocess.run([*k3a_cmd, "revision", "list", "org/name", "--store", "s3://bucket/k3",
                          "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 8, run.stderr
    assert SECRET not in run.stdout + run.stderr
    assert "http://ops:***@127.0.0.1" in json.loads(run.stdout)["error"]


def test_evaluation_records_name_the_endpoint_without_its_password(tmp_path, k3a_cmd, k3a_env):
    store = FileStore(tmp_path / "store")
    release = Releases(store, tmp_path / "scratch").release()
    server = start(served_names(release), tmp_path / "openai.log")
    try:
        url = server.url.replace("http://", f"http://ops:{SECRET}@")
        run = subprocess.run([*k3a_cmd, "smoke", url, "--tuple", release.id,
                              "--max-concurrency", "1", "--json", "--store", store.url],
                             env=k3a_env, capture_output=True, text=True, timeout=300)
    finally:
        server.stop()
    assert run.returncode == 0, run.stderr
    assert SECRET not in run.stdout + run.stderr
    report = json.loads(run.stdout)["report"]
    assert report["endpoint"] == server.url.replace("http://", "http://ops:***@")
    stored = [p.read_text() for p in (tmp_path / "store").rglob("*.json")]
    assert stored and not [text for text in stored if SECRET in text]


def _stored_texts(store_root) -> list[str]:
    return [p.read_text(errors="replace") for p in store_root.rglob("*") if p.is_file()]


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_a_dead_endpoint_with_a_password_is_not_printed_or_stored(tmp_path, k3a_cmd, k3a_env,
                                                                  as_json):
    """The connection error names the endpoint: its password is in no detail, message or
    record."""
    store = FileStore(tmp_path / "store")
    release = Releases(store, tmp_path / "scratch").release()
    url = f"http://user:SECRETPASS@127.0.0.1:{_closed_port()}/v1"
    run = subprocess.run([*k3a_cmd, "smoke", url, "--tuple", release.id, "--retries", "0",
                          "--max-concurrency", "1", "--store", store.url,
                          *(["--json"] if as_json else [])],
                         env=k3a_env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 8, run.stderr
    assert "SECRETPASS" not in run.stdout + run.stderr
    assert "user:***@127.0.0.1" in run.stdout + run.stderr
    stored = _stored_texts(tmp_path / "store")
    assert any("user:***@127.0.0.1" in text for text in stored)
    assert not [text for text in stored if "SECRETPASS" in text]


def test_an_error_body_echoing_the_url_with_its_password_is_not_printed_or_stored(
        tmp_path, k3a_cmd, k3a_env):
    """Every completion answers 500 with a body quoting the URL it was sent to, userinfo
    included: each check's detail, the sweep's first error and the messages keep the rest of
    the text, never the password (nor the API key, which came in as a command-line option)."""
    store = FileStore(tmp_path / "store")
    release = Releases(store, tmp_path / "scratch").release()
    server = start(served_names(release), tmp_path / "openai.log", echo_url=True)
    try:
        url = server.url.replace("http://", "http://user:SECRETPASS@")
        run = subprocess.run([*k3a_cmd, "smoke", url, "--tuple", release.id, "--retries", "0",
                              "--max-concurrency", "1", "--api-key", "APIKEY-0123456789",
                              "--json", "--store", store.url],
                             env=k3a_env, capture_output=True, text=True, timeout=300)
    finally:
        server.stop()
    assert run.returncode == 5, run.stderr
    said = run.stdout + run.stderr
    report = json.loads(run.stdout)["report"]
    chat = next(c for c in report["checks"] if c["name"] == "chat")
    assert chat["detail"].startswith("HTTP 500: upstream failed for http://")
    assert "upstream failed" in report["sweep"]["points"][0]["first_error"]
    stored = _stored_texts(tmp_path / "store")
    assert any("upstream failed for http://" in text for text in stored)
    for secret in ("SECRETPASS", "APIKEY-0123456789"):
        assert secret not in said
        assert not [text for text in stored if secret in text]


def test_a_huge_text_from_outside_is_cut_to_a_bound_after_its_secrets():
    """An answer (or an error page) of a megabyte keeps 1 KiB in the record, and a secret that
    straddles the cut is replaced whole before cutting, so no prefix of it survives."""
    from k3artifacts.readiness.redact import MAX_BYTES, REDACTED, Redactor

    secret = "tok-" + "s" * 40
    text = "é" * (MAX_BYTES // 2 - 10) + secret + "x" * 1_000_000
    kept = Redactor([secret])(text)
    head, _, tail = kept.partition("... (")
    assert len(head.encode()) <= MAX_BYTES and tail.endswith(" bytes cut)")
    assert REDACTED in head and "tok-" not in kept and "ss" not in kept
    assert Redactor([secret])("short answer") == "short answer"
