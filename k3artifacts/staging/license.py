"""License capture: the license text and the model card's license metadata at a commit.

The model card is upstream input, so its YAML front matter is parsed as hostile: bounded in
size and nesting, and refused when it uses anchors or aliases. ``yaml.safe_load`` expands
aliases, so a 334-byte card of nested aliases becomes hundreds of MB (a "billion laughs");
no real card needs them. A refused card is a :class:`~k3artifacts.errors.ReleaseRefused`
(exit 3) naming the file and the rule ``model-card``.

The license text is not copied into the manifest: it is a file of the revision, named by the
record's ``path`` and bound by its ``sha256`` (and the file's own record), and read from the
store when someone reviews it (``releases/reviews.py:license_text``). A 100 MB LICENSE makes
no 100 MB manifest.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from k3artifacts.errors import Refusal, ReleaseRefused
from k3artifacts.revisions.manifest import LicenseRecord

#: Front matter larger than this is refused (real cards' metadata is a few KB).
MAX_FRONT_MATTER = 64 << 10
#: Collections nested deeper than this are refused (real cards nest 3 or 4 deep).
MAX_DEPTH = 32
#: A license field longer than this is refused (an SPDX id, a name, a link).
MAX_FIELD = 1024

RULE = "model-card"


class _Refused(Exception):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases and deep nesting while composing, before
    anything is expanded or built."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(f"YAML alias *{event.anchor} in the front matter (aliases are "
                           "refused: they can expand without bound)")
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _Refused(f"YAML anchor &{anchor} in the front matter (anchors and aliases "
                           "are refused: they can expand without bound)")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"front matter nests deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def card_metadata(card: bytes, name: str = "README.md") -> dict:
    """YAML front matter of a model card (README.md), or {} when it has none or it is not
    YAML. Raise :class:`Refusal` for front matter that is too large, too deep, or uses
    anchors or aliases."""
    if not card.startswith(b"---"):
        return {}
    end = card.find(b"\n---", 3)
    if end < 0:
        return {}
    if end > MAX_FRONT_MATTER:
        raise Refusal(name, RULE, f"front matter is over {MAX_FRONT_MATTER:,} bytes")
    text = card[3:end].decode("utf-8", errors="replace")
    loader = _BoundedLoader(text)
    try:
        data = loader.get_single_data()
    except _Refused as exc:
        raise Refusal(name, RULE, str(exc)) from None
    except (yaml.YAMLError, RecursionError):
        return {}
    finally:
        loader.dispose()
    return data if isinstance(data, dict) else {}


def capture(
    license_path: str | None, license_file: Path | None, card_file: Path | None
) -> LicenseRecord:
    """The revision's license: its license file, else (a card whose metadata names a license:
    ``license:``, ``license_name:`` or ``license_link:``) the model card itself. The card is
    then the document a reviewer reads and the gate holds by sha256: its metadata alone is
    what upstream wrote as the license, and its prose usually says what the terms are. The
    text stays in the revision's file, read by its sha256; the record holds only the digest."""
    card_name = card_file.name if card_file is not None else "README.md"
    card = card_file.read_bytes() if card_file is not None else b""
    try:
        meta = card_metadata(card, card_name) if card_file is not None else {}
        fields = {name: _field(meta, name, card_name)
                  for name in ("license", "license_name", "license_link")}
    except Refusal as exc:
        raise ReleaseRefused([exc]) from None
    sha = None
    if license_file is not None:
        with open(license_file, "rb") as fh:
            sha = hashlib.file_digest(fh, "sha256").hexdigest()
    elif any(fields.values()):
        # The card's path in the revision is its name: a model card is README.md at the root.
        license_path, sha = card_name, hashlib.sha256(card).hexdigest()
    return LicenseRecord(
        path=license_path,
        sha256=sha,
        card_license=fields["license"],
        card_license_name=fields["license_name"],
        card_license_link=fields["license_link"],
    )


def _field(meta: dict, name: str, card_name: str) -> str | None:
    value = meta.get(name)
    if value is None:
        return None
    if isinstance(value, dict | list):
        raise Refusal(card_name, RULE, f"{name} is a YAML {type(value).__name__}, not a "
                      "string")
    text = str(value)
    if len(text) > MAX_FIELD:
        raise Refusal(card_name, RULE, f"{name} is {len(text):,} characters (at most "
                      f"{MAX_FIELD:,})")
    return text
