"""Defaults that come from the environment, in one place."""

from __future__ import annotations

import os
from pathlib import Path

#: The checkout this package runs from (an editable install): where ``manifests/`` and
#: ``policies/`` are found when no environment variable points elsewhere.
CHECKOUT_ROOT = Path(__file__).resolve().parent.parent


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


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: str | int) -> int:
    """Sizes like ``64MiB``, ``4GiB``, ``1.5GB`` or plain bytes; ValueError otherwise."""
    if isinstance(value, int):
        return value
    text = str(value).strip().lower().replace(" ", "")
    number = text.rstrip("kmgtib")
    try:
        return int(float(number) * _SIZE_UNITS[text[len(number):]])
    except (ValueError, KeyError):
        raise ValueError(f"{value!r} is not a size like 64MiB, 4GiB or 1000000") from None


def default_workers() -> int:
    """Files staged at once: one per core, at least 2, at most 8.

    Staging is CPU-bound (sha256 of every byte): on this project's 2-core machine 2 workers
    reached 0.83-0.88 of cp's rate and 4 only 0.73 (bench/RESULTS.md). Beyond 8, parallel
    connections to the Hub's CDN stop adding throughput.
    """
    return min(8, max(2, os.cpu_count() or 2))
