"""The code base stays lint-clean (ruff, configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_ruff_finds_nothing():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "k3artifacts", "flows", "bench", "tests"],
        cwd=REPO_ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
