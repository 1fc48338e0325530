"""What a revision may contain, decided from the listing before any byte is downloaded."""

from __future__ import annotations

import posixpath
import unicodedata
from collections.abc import Iterable

from k3artifacts.errors import Refusal
from k3artifacts.revisions.manifest import META_DIR, FileKind

#: Weight formats that run arbitrary code when loaded (pickle and friends).
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
LICENSE_NAMES = ("license", "license.md", "license.txt", "licence", "licence.md", "copying")


def path_refusal(path: str) -> Refusal | None:
    """A path that could escape the revision directory, or that we reserve, is refused."""

    def refuse(detail: str) -> Refusal:
        return Refusal(path, "unsafe-path", detail)

    if not path:
        return refuse("empty path")
    if any(ord(c) < 0x20 or c == "\x7f" for c in path):
        return refuse("control character in path")
    if "\\" in path:
        return refuse("backslash in path (a Windows separator would escape on some readers)")
    if path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        return refuse("absolute path")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return refuse("'..', '.' or empty segment in path")
    if posixpath.normpath(path) != path:
        return refuse("path is not in normal form")
    if parts[0] == META_DIR:
        return refuse(f"{META_DIR}/ is reserved for k3artifacts' own metadata")
    return None


def listing_refusals(
    entries: Iterable[tuple[str, str]], *, allow_pickle: bool = False
) -> list[Refusal]:
    """Check ``(path, entry type)`` pairs of a revision listing against every listing rule."""
    refusals: list[Refusal] = []
    seen: dict[str, str] = {}
    for path, entry_type in entries:
        if entry_type != "file":
            refusals.append(Refusal(path, "not-a-file", f"listing entry of type {entry_type!r}"))
            continue
        bad = path_refusal(path)
        if bad is not None:
            refusals.append(bad)
            continue
        # Two names that differ only by case (or Unicode form) collide on case-insensitive
        # file systems and confuse every reader; one of them would silently win.
        folded = unicodedata.normalize("NFC", path).casefold()
        if folded in seen:
            refusals.append(
                Refusal(path, "duplicate-path", f"collides with {seen[folded]!r} ignoring case")
            )
            continue
        seen[folded] = path
        if path.lower().endswith(PICKLE_SUFFIXES) and not allow_pickle:
            refusals.append(
                Refusal(
                    path,
                    "pickle",
                    "pickle-family weights can run code when loaded; "
                    "pass --allow-pickle only if you have reviewed them",
                )
            )
    return refusals


def file_kind(path: str) -> FileKind:
    name = path.rsplit("/", 1)[-1].lower()
    if name.endswith(".safetensors"):
        return "weights"
    if name.endswith(".index.json"):
        return "index"
    if "/" not in path and name in LICENSE_NAMES:
        return "license"
    if name.endswith(".py"):
        return "code"
    if "/" not in path and name == "readme.md":
        return "card"
    if name.endswith((".json", ".yaml", ".yml", ".txt", ".model", ".tiktoken", ".jinja")):
        return "config"
    return "other"
