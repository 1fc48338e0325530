"""Shared fixtures. Servers the tests need are started by fixture plugins under tests/fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3artifacts.store import FileStore

pytest_plugins: list[str] = []


@pytest.fixture
def file_store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "store")
