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
#: Bidirectional formatting characters: they make a name read differently from what it is
#: ("Trojan Source"), in a terminal, a review page or a log.
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
                          "\u2066\u2067\u2068\u2069")
#: ext4, XFS, FSx for Lustre and overlayfs hold names of at most 255 bytes.
NAME_MAX_BYTES = 255
#: An S3 key holds 1024 bytes; the store's prefix, the repo id (96 + 1 + 96 at most on the
#: Hub) and the commit take up to 256 of them.
PATH_MAX_BYTES = 768


def path_refusal(path: str) -> Refusal | None:
    """A path that could escape the revision directory, or that we reserve, is refused."""

    def refuse(detail: str) -> Refusal:
        return Refusal(path, "unsafe-path", detail)

    if not path:
        return refuse("empty path")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in path):
        return refuse("control character (C0 or C1) in path")
    if any(c in BIDI_CONTROLS for c in path):
        return refuse("bidirectional override or isolate character in path")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        return refuse("path is not valid Unicode (a lone surrogate)")
    if len(encoded) > PATH_MAX_BYTES:
        return refuse(f"path of {len(encoded)} bytes; a store key holds {PATH_MAX_BYTES}")
    long = next((p for p in path.split("/") if len(p.encode()) > NAME_MAX_BYTES), None)
    if long is not None:
        return refuse(f"name {long[:40]!r}... of {len(long.encode())} bytes; file systems hold "
                      f"{NAME_MAX_BYTES}")
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
    entries = list(entries)
    # A name that is a file and also the directory of another file cannot be written out.
    parents = {
        path.rsplit("/", i)[0]: path
        for path, entry_type in entries if entry_type == "file"
        for i in range(1, path.count("/") + 1)
    }
    for path, entry_type in entries:
        if entry_type != "file":
            refusals.append(Refusal(path, "not-a-file", f"listing entry of type {entry_type!r}"))
            continue
        bad = path_refusal(path)
        if bad is not None:
            refusals.append(bad)
            continue
        if path in parents:
            refusals.append(Refusal(path, "file-and-directory",
                                    f"a file, and the directory of {parents[path]!r}"))
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
