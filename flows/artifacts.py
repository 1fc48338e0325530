"""How the flows write what a person reads in the Prefect UI: live artifacts and their cells.

A keyed ``create_*_artifact`` call makes a new *version* of the key (the artifacts page shows
the latest); :class:`LiveArtifact` instead creates one artifact and then PATCHes its data in
place (``PATCH /artifacts/{id}`` also updates the key's latest entry), so a run's progress and
files table are one artifact each, not hundreds of versions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from uuid import UUID

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float) -> str:
    """``1610612736`` -> ``1.5 GiB`` (binary units, as ``k3a stage`` prints them)."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def size(n: int) -> str:
    """A size a person reads and an auditor can check: ``1.5 GiB (1,610,612,736 bytes)``."""
    return f"{human_bytes(n)} ({n:,} bytes)"


def sha256(digest: str | None) -> str:
    """Digests shown the way registries and ``sha256sum`` users recognise them."""
    if not digest:
        return "none"
    return digest if digest.startswith("sha256:") else f"sha256:{digest}"


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {s:02d} s"
    hours, m = divmod(minutes, 60)
    return f"{hours} h {m:02d} min"


def _cell(value: object) -> str:
    # A pipe would end the cell, a newline the row.
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table with a real header row (the UI renders an empty one as a blank bar)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fields_table(pairs: Iterable[tuple[str, object]]) -> str:
    """Name/value facts as a two-column table headed ``field | value``."""
    return md_table(("field", "value"), pairs)


class LiveArtifact:
    """One keyed markdown or table artifact, created once and then updated in place."""

    def __init__(self, kind: str, key: str, data, description: str):
        if kind == "markdown":
            self.id: UUID = create_markdown_artifact(data, key=key, description=description)
        elif kind == "table":
            self.id = create_table_artifact(data, key=key, description=description)
        else:
            raise ValueError(f"no live artifact of kind {kind!r}")
        self.kind = kind

    def update(self, data) -> None:
        payload = data if self.kind == "markdown" else json.dumps(data)
        with get_client(sync_client=True) as client:
            client.update_artifact(self.id, ArtifactUpdate(data=payload))
