"""Shared fixtures. Servers the tests need are started by fixture plugins under tests/fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3artifacts.stores.file import FileStore

pytest_plugins: list[str] = [
    "tests.fixtures.any_store",
    "tests.fixtures.identities",
    "tests.fixtures.localhub",
    "tests.fixtures.moto_server",
    "tests.fixtures.registry",
    "tests.fixtures.revisions",
    "tests.fixtures.releases",
    "tests.fixtures.channel_moves",
    "tests.fixtures.prefect_api",
    "tests.fixtures.s3_fault_proxy",
    "tests.fixtures.seaweedfs",
    "tests.fixtures.softhsm",
]


@pytest.fixture(autouse=True)
def _private_config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's personal key and pinned roots (``XDG_CONFIG_HOME``) are the test's own,
    the same directory :func:`k3a_env` gives a `k3a` subprocess: never the account's."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / "config"))


@pytest.fixture
def file_store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "store")


REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def k3a_env(tmp_path: Path) -> dict[str, str]:
    """Environment for running ``k3a`` in a subprocess: this checkout first on the path, and a
    private HOME so no default store or cache outside tmp_path is touched."""
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["HOME"] = str(tmp_path / "home")
    env["XDG_DATA_HOME"] = str(tmp_path / "home" / "data")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "home" / "config")
    env["HF_HUB_DISABLE_XET"] = "1"
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env.pop("K3A_STORE", None)
    return env


@pytest.fixture
def k3a_cmd() -> list[str]:
    """argv prefix for the CLI in a subprocess (works installed or from a checkout)."""
    import sys

    return [sys.executable, "-m", "k3artifacts"]
