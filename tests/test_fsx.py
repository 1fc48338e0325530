"""``k3a fsx preload``. moto 5.2.5 implements FSx file systems but not data repository tasks
or associations (it answers 500), so the task request is checked against botocore's FSx model
and the CLI's checks before the task run against moto's file systems."""

from __future__ import annotations

import subprocess
from pathlib import Path

import boto3
import botocore.session
import pytest
from botocore.validate import validate_parameters

from k3artifacts.stores.fsx import PRELOAD_TASK_TYPE, covering_repository, preload_request
from tests.conftest import REPO_ROOT
from tests.support.ports import free_ports
from tests.support.revisions import REPO, publish, write_revision

COMMIT = "c" * 40


def test_preload_request_is_a_valid_import_task() -> None:
    request = preload_request("fs-0123456789abcdef0", f"s3://bkt/k3a/models/{REPO}/{COMMIT}")
    model = botocore.session.get_session().get_service_model("fsx")
    validate_parameters(request, model.operation_model("CreateDataRepositoryTask").input_shape)
    assert request["Type"] == PRELOAD_TASK_TYPE == "IMPORT_METADATA_FROM_REPOSITORY"
    assert request["Paths"] == [f"s3://bkt/k3a/models/{REPO}/{COMMIT}/"]


def test_covering_repository() -> None:
    path = f"s3://bkt/k3a/models/{REPO}/{COMMIT}"
    assocs = [
        {"DataRepositoryPath": "s3://bkt/k3a/releases", "Lifecycle": "AVAILABLE"},
        {"DataRepositoryPath": "s3://bkt/k3a/models/", "Lifecycle": "CREATING"},
        {"DataRepositoryPath": "s3://bkt/k3a", "Lifecycle": "AVAILABLE"},
    ]
    assert covering_repository(assocs, path) == "s3://bkt/k3a/"
    assert covering_repository(assocs[:2], path) is None
    # A sibling prefix that merely starts with the same letters does not cover it.
    assert covering_repository([{"DataRepositoryPath": "s3://bkt/k3"}], path) is None


@pytest.fixture
def fsx(moto_endpoint: str):
    return boto3.client("fsx", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture
def fsx_env(s3_env: dict[str, str], moto_endpoint: str) -> dict[str, str]:
    return {**s3_env, "AWS_ENDPOINT_URL_FSX": moto_endpoint}


def preload(cmd, env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, "fsx", "preload", *args], env=env, check=False, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.s3
def test_preload_checks_revision_and_file_system(k3a_cmd, fsx_env, fsx, s3_store, s3_url,
                                                 tmp_path: Path) -> None:
    ref = f"{REPO}@{COMMIT}"
    # The store is there (another revision is published); this one is not.
    publish(s3_store, "1" * 40, write_revision(tmp_path / "q0", {"config.json": b"{}"}))
    unpublished = preload(k3a_cmd, fsx_env, ref, "--file-system-id", "fs-0123456789abcdef0",
                          "--store", s3_url)
    assert unpublished.returncode == 7 and "not published" in unpublished.stderr

    publish(s3_store, COMMIT, write_revision(tmp_path / "q", {"config.json": b"{}"}))
    missing_fs = preload(k3a_cmd, fsx_env, ref, "--file-system-id", "fs-0123456789abcdef0",
                         "--store", s3_url)
    assert missing_fs.returncode == 7, missing_fs.stderr
    assert "fs-0123456789abcdef0" in missing_fs.stderr

    windows = fsx.create_file_system(
        FileSystemType="WINDOWS", StorageCapacity=32, SubnetIds=["subnet-0123456789abcdef0"],
        WindowsConfiguration={"ThroughputCapacity": 8})["FileSystem"]["FileSystemId"]
    not_lustre = preload(k3a_cmd, fsx_env, ref, "--file-system-id", windows, "--store", s3_url)
    assert not_lustre.returncode == 9 and "needs FSx for Lustre" in not_lustre.stderr

    (tmp_path / "store").mkdir()
    on_disk = preload(k3a_cmd, fsx_env, ref, "--file-system-id", windows,
                      "--store", f"file://{tmp_path}/store")
    assert on_disk.returncode == 9 and "--store s3://" in on_disk.stderr

    bad_ref = preload(k3a_cmd, fsx_env, f"{REPO}@main", "--file-system-id", windows)
    assert bad_ref.returncode == 2


@pytest.mark.s3
def test_an_unreachable_fsx_endpoint_names_the_settings_that_set_it(k3a_cmd, s3_env, s3_store,
                                                                     s3_url, tmp_path: Path):
    """The store is reachable (moto) and FSx is not: the hint names what points FSx elsewhere
    (the flag this command has, and boto3's variable), not the S3 store's settings."""
    publish(s3_store, COMMIT, write_revision(tmp_path / "q", {"config.json": b"{}"}))
    [closed] = free_ports(1)
    done = preload(k3a_cmd, {**s3_env, "AWS_ENDPOINT_URL_FSX": f"http://127.0.0.1:{closed}"},
                   f"{REPO}@{COMMIT}", "--file-system-id", "fs-0123456789abcdef0",
                   "--store", s3_url)
    assert done.returncode == 8, done.stderr
    assert "--fsx-endpoint-url / AWS_ENDPOINT_URL_FSX" in done.stderr, done.stderr
    assert "K3A_S3_ENDPOINT_URL" not in done.stderr and "Traceback" not in done.stderr


def test_the_help_points_at_the_guide_section_that_exists(k3a_cmd) -> None:
    shown = subprocess.run([*k3a_cmd, "fsx", "preload", "--help"], capture_output=True,
                           text=True, check=True).stdout
    assert 'docs/guides/s3-and-fsx.md, "FSx for Lustre"' in " ".join(shown.split())
    assert "\n## FSx for Lustre\n" in (REPO_ROOT / "docs/guides/s3-and-fsx.md").read_text()
