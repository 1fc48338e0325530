"""License capture: the license text and the model card's license metadata at a commit."""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from k3artifacts.revisions.manifest import LicenseRecord


def card_metadata(card: bytes) -> dict:
    """YAML front matter of a model card (README.md), or {} when it has none or it is broken."""
    text = card.decode("utf-8", errors="replace")
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        return {}
    try:
        data = yaml.safe_load(text[3:end])
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def capture(
    license_path: str | None, license_file: Path | None, card_file: Path | None
) -> LicenseRecord:
    text = sha = None
    if license_file is not None:
        raw = license_file.read_bytes()
        sha = hashlib.sha256(raw).hexdigest()
        text = raw.decode("utf-8", errors="replace")
    meta = card_metadata(card_file.read_bytes()) if card_file is not None else {}

    def field(name: str) -> str | None:
        value = meta.get(name)
        return None if value is None else str(value)

    return LicenseRecord(
        path=license_path,
        sha256=sha,
        text=text,
        card_license=field("license"),
        card_license_name=field("license_name"),
        card_license_link=field("license_link"),
    )
