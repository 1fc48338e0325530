"""Fixtures of the fault suite."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture
def k3a_unprivileged(k3a_cmd: list[str]) -> list[str]:
    """``k3a`` as production runs it: file permission bits apply. As root (CI, this sandbox)
    the capabilities that bypass them are dropped, so a read-only directory stays read-only."""
    if os.geteuid() != 0:
        return k3a_cmd
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot drop CAP_DAC_OVERRIDE")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *k3a_cmd]
