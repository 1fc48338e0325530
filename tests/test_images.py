"""Pinning image references to digests against real registries on loopback."""

from __future__ import annotations

import json

import pytest

from k3artifacts.errors import ConfigError, NotFound
from k3artifacts.releases.tuples import ImageRef
from k3artifacts.serving.images import parse_image, require_digest, resolve_image

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("reference", "registry", "name", "tag", "digest"),
    [
        ("vllm/vllm-openai:v0.12.0", "docker.io", "vllm/vllm-openai", "v0.12.0", None),
        ("ubuntu:24.04", "docker.io", "library/ubuntu", "24.04", None),
        ("127.0.0.1:5000/k3a/vllm:b300", "127.0.0.1:5000", "k3a/vllm", "b300", None),
        (f"ghcr.io/org/img@{DIGEST}", "ghcr.io", "org/img", None, DIGEST),
        (f"localhost:5000/a/b:t@{DIGEST}", "localhost:5000", "a/b", "t", DIGEST),
        (
            "123456789012.dkr.ecr.us-west-2.amazonaws.com/serving/vllm:k3",
            "123456789012.dkr.ecr.us-west-2.amazonaws.com",
            "serving/vllm",
            "k3",
            None,
        ),
    ],
)
def test_parse(reference, registry, name, tag, digest):
    parsed = parse_image(reference)
    assert (parsed.registry, parsed.name, parsed.tag, parsed.digest) == (
        registry,
        name,
        tag,
        digest,
    )


def test_ecr_host_is_recognised():
    match = parse_image("123456789012.dkr.ecr.us-west-2.amazonaws.com/vllm:k3").ecr
    assert match and match["account"] == "123456789012" and match["region"] == "us-west-2"
    assert parse_image("registry.example.com/vllm:k3").ecr is None


@pytest.mark.parametrize(
    "reference",
    ["", "vllm/vllm-openai", "Upper/Case:tag", "repo@sha256:short", "repo:bad tag", "repo:-x"],
)
def test_bad_references_are_refused(reference):
    with pytest.raises(ConfigError):
        parse_image(reference)


def test_tag_only_image_is_refused_offline():
    with pytest.raises(ConfigError, match="tag and no digest"):
        require_digest("registry.example.com/vllm:k3")
    with pytest.raises(ConfigError, match="tag and no digest"):
        resolve_image("registry.example.com/vllm:k3", offline=True)
    assert resolve_image(f"registry.example.com/vllm@{DIGEST}", offline=True).digest == DIGEST


def test_a_tuple_image_cannot_hold_a_tag_alone():
    with pytest.raises(ValueError, match="tag k3 and no digest"):
        ImageRef.model_validate({"repository": "registry.example.com/vllm", "tag": "k3"})


def test_tag_resolves_to_the_pushed_digest(oci_registry):
    pushed = oci_registry.push("k3a/vllm", "k3-b300")
    ref = resolve_image(f"{oci_registry.host}/k3a/vllm:k3-b300")
    assert ref.digest == pushed.digest
    assert ref.repository == f"{oci_registry.host}/k3a/vllm"
    assert ref.tag == "k3-b300"
    assert ref.reference == f"{oci_registry.host}/k3a/vllm@{pushed.digest}"


def test_moving_a_tag_gives_a_new_digest(oci_registry):
    first = oci_registry.push("k3a/moving", "stable", layer=b"one")
    assert resolve_image(f"{oci_registry.host}/k3a/moving:stable").digest == first.digest
    second = oci_registry.push("k3a/moving", "stable", layer=b"two")
    assert second.digest != first.digest
    assert resolve_image(f"{oci_registry.host}/k3a/moving:stable").digest == second.digest
    # The old digest is still pinned and still resolvable: a tuple made earlier keeps its bytes.
    assert resolve_image(f"{oci_registry.host}/k3a/moving@{first.digest}").digest == first.digest


def test_tag_and_digest_must_agree(oci_registry):
    a = oci_registry.push("k3a/agree", "a", layer=b"a")
    oci_registry.push("k3a/agree", "b", layer=b"b")
    ok = resolve_image(f"{oci_registry.host}/k3a/agree:a@{a.digest}")
    assert (ok.tag, ok.digest) == ("a", a.digest)
    with pytest.raises(ConfigError, match="now points at"):
        resolve_image(f"{oci_registry.host}/k3a/agree:b@{a.digest}")


def test_unknown_tag_and_unknown_digest_cannot_be_pinned(oci_registry):
    oci_registry.push("k3a/known", "v1")
    with pytest.raises(NotFound, match="cannot pin"):
        resolve_image(f"{oci_registry.host}/k3a/known:v2")
    with pytest.raises(NotFound):
        resolve_image(f"{oci_registry.host}/k3a/known@{DIGEST}")


def test_bearer_token_auth(token_registry, monkeypatch):
    import urllib3

    pushed = token_registry.push("k3a/private", "k3")
    reference = f"{token_registry.host}/k3a/private:k3"
    anonymous = urllib3.request("HEAD", f"{token_registry.url}/v2/k3a/private/manifests/k3")
    assert anonymous.status == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer realm=")
    monkeypatch.setenv("K3A_REGISTRY_USERNAME", token_registry.token.user)
    monkeypatch.setenv("K3A_REGISTRY_PASSWORD", token_registry.token.password)
    assert resolve_image(reference).digest == pushed.digest


def test_bearer_token_auth_from_docker_config(token_registry, monkeypatch, tmp_path):
    import base64

    pushed = token_registry.push("k3a/private2", "k3")
    auth = base64.b64encode(f"{token_registry.token.user}:{token_registry.token.password}".encode())
    (tmp_path / "config.json").write_text(
        json.dumps({"auths": {token_registry.host: {"auth": auth.decode()}}})
    )
    monkeypatch.delenv("K3A_REGISTRY_USERNAME", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert resolve_image(f"{token_registry.host}/k3a/private2:k3").digest == pushed.digest


def test_bearer_token_refused_without_credentials(token_registry, monkeypatch, tmp_path):
    token_registry.push("k3a/private3", "k3")
    monkeypatch.delenv("K3A_REGISTRY_USERNAME", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # empty: no docker login
    with pytest.raises(ConfigError, match="refused the credentials"):
        resolve_image(f"{token_registry.host}/k3a/private3:k3")


def test_ecr_tag_resolves_through_boto3(moto_ecr, monkeypatch):
    for key, value in moto_ecr.env().items():
        monkeypatch.setenv(key, value)
    pushed = moto_ecr.push("serving/vllm", "k3-b300")
    ref = resolve_image(f"{moto_ecr.registry}/serving/vllm:k3-b300")
    assert ref.digest == pushed.digest
    assert ref.repository == f"{moto_ecr.registry}/serving/vllm"
    assert (
        resolve_image(f"{moto_ecr.registry}/serving/vllm@{pushed.digest}").digest == pushed.digest
    )
    with pytest.raises(NotFound):
        resolve_image(f"{moto_ecr.registry}/serving/vllm:absent")
    with pytest.raises(NotFound):
        resolve_image(f"{moto_ecr.registry}/serving/nothing-here:k3")
