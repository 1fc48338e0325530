"""Defaults that come from the environment, in one place."""

from __future__ import annotations

import os
from pathlib import Path


def data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "k3artifacts"


def default_store_url() -> str:
    """``K3A_STORE`` or the embedded default: a local tree under the user's data directory."""
    return os.environ.get("K3A_STORE") or f"file://{data_home() / 'store'}"


def default_policies_dir() -> Path:
    """``K3A_POLICIES`` or ``./policies``: the checkout's policy data, reviewed like code."""
    return Path(os.environ.get("K3A_POLICIES") or "policies")


def default_quarantine(store_local_root: Path | None) -> Path:
    """``K3A_QUARANTINE``, else beside a file store (publication is then a hard link, no
    copy), else the user's cache directory."""
    if os.environ.get("K3A_QUARANTINE"):
        return Path(os.environ["K3A_QUARANTINE"])
    if store_local_root is not None:
        return store_local_root / ".k3a-quarantine"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "k3artifacts" / "quarantine"
