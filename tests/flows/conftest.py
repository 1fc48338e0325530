"""Flow tests: every test here runs against the session's Prefect API (tests/fixtures/prefect_api)."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.prefect)


@pytest.fixture(autouse=True)
def _prefect(prefect_api: str) -> str:
    return prefect_api
