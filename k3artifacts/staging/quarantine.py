"""The quarantine: a staging worker's local directory where a revision is downloaded and
verified before any byte of it becomes visible to serving.

Layout, one directory per revision::

    <root>/<org>--<name>/<commit>/
        .lock              held by the one process staging this revision
        files/<path>       verified files, named as upstream
        partial/<id>.part  downloads in progress (resumable across processes)
        verified.jsonl     one FileRecord per verified file (append-only; a hint, see _append)

A file listed in ``verified.jsonl`` whose bytes are still there (same size and mtime) is not
downloaded or read again by a re-run.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from k3artifacts.errors import Conflict
from k3artifacts.revisions.hashing import hash_file
from k3artifacts.revisions.manifest import FileRecord
from k3artifacts.settings import default_quarantine
from k3artifacts.stores.revisions import RevisionStore


def quarantine_root_for(store: RevisionStore, explicit: str | Path | None) -> Path:
    """``explicit``, else beside a file store (publication is then a hard link), else
    ``$K3A_QUARANTINE`` or the user cache."""
    if explicit:
        return Path(explicit)
    return default_quarantine(store.local_root)


class VerifiedEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    record: FileRecord
    mtime_ns: int
    #: Tensor names of a safetensors file, kept so the index check needs no re-read on resume.
    tensors: list[str] | None = None
    #: Handed to the store and deleted here (bounded-window staging).
    stored: bool = False
    #: Store-side digests computed during the download (see Store.wanted_checksums).
    checksums: dict[str, str] = {}
    #: False for small files written without an fsync: a re-run re-hashes them before reuse,
    #: since after a power loss their size could be right and their bytes not.
    durable: bool = True


class Quarantine:
    def __init__(self, root: Path, repo_id: str, commit: str):
        self.dir = Path(root).absolute() / repo_id.replace("/", "--") / commit
        self.files = self.dir / "files"
        self.partial = self.dir / "partial"
        self._log = self.dir / "verified.jsonl"
        self._log_fd: int | None = None
        self._dirs: set[Path] = set()
        self._lock_fh = None
        self._write_lock = threading.Lock()

    def __enter__(self) -> Quarantine:
        self.files.mkdir(parents=True, exist_ok=True)
        self.partial.mkdir(exist_ok=True)
        fh = open(self.dir / ".lock", "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            fh.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise Conflict(
                    f"another k3a process is staging this revision (lock {self.dir / '.lock'})",
                    hint="wait for it to finish; its work is reused by the next run",
                ) from None
            raise
        self._lock_fh = fh
        return self

    def __exit__(self, *exc: object) -> None:
        with self._write_lock:
            if self._log_fd is not None:
                os.close(self._log_fd)
                self._log_fd = None
        if self._lock_fh is not None:
            fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    def final_path(self, path: str) -> Path:
        return self.files.joinpath(*path.split("/"))

    def part_path(self, path: str) -> Path:
        # Hashed names: an upstream path can never collide with or traverse out of partial/.
        return self.partial / (hashlib.sha256(path.encode()).hexdigest()[:32] + ".part")

    def verified(self) -> dict[str, VerifiedEntry]:
        """Entries of the log whose file is still present and unchanged."""
        entries: dict[str, VerifiedEntry] = {}
        if not self._log.exists():
            return entries
        for line in self._log.read_text().splitlines():
            try:
                entry = VerifiedEntry.model_validate_json(line)
            except ValueError:
                continue  # a line cut short by a crash; that file is simply redone
            path = entry.record.path
            if entry.stored:
                entries[path] = entry
                continue
            entries.pop(path, None)
            try:
                st = self.final_path(path).stat()
            except FileNotFoundError:
                continue
            if st.st_size != entry.record.size or st.st_mtime_ns != entry.mtime_ns:
                continue
            if not entry.durable and not self._intact(entry):
                continue
            entries[path] = entry
        return entries

    def _intact(self, entry: VerifiedEntry) -> bool:
        digests = hash_file(self.final_path(entry.record.path), xxh3=False).hexdigests()
        return digests.sha256 == entry.record.sha256

    def accept(
        self,
        record: FileRecord,
        part: Path,
        tensors: frozenset[str] | None,
        checksums: dict[str, str] | None = None,
        durable: bool = True,
    ) -> VerifiedEntry:
        """Move a verified partial file into files/ and log it."""
        final = self.final_path(record.path)
        if final.parent not in self._dirs:  # a syscall saved per file of a 2,000-file release
            final.parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(final.parent)
        os.replace(part, final)
        entry = VerifiedEntry(
            record=record,
            mtime_ns=final.stat().st_mtime_ns,
            tensors=sorted(tensors) if tensors is not None else None,
            checksums=checksums or {},
            durable=durable,
        )
        self._append(entry)
        return entry

    def mark_stored(self, entry: VerifiedEntry) -> None:
        """The store holds this file now: log that, then free the local disk."""
        self._append(entry.model_copy(update={"stored": True}))
        self.final_path(entry.record.path).unlink(missing_ok=True)

    def _append(self, entry: VerifiedEntry) -> None:
        """Append one line with a single ``write`` (O_APPEND: lines never interleave).

        Not fsynced: the log is a hint that saves work on a re-run, never the proof (the proof
        is the bytes, fsynced before their line is written or re-hashed on reuse, and their
        hashes). A line lost in a
        crash only means that file is fetched again. Syncing it cost one serialized fsync per
        file, the largest cost of staging thousands of small files.
        """
        line = (entry.model_dump_json() + "\n").encode()
        with self._write_lock:
            if self._log_fd is None:
                # Opened once and kept: an open and close per file costs as much as the write.
                self._log_fd = os.open(self._log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._log_fd, line)

    def discard(self, part: Path) -> None:
        part.unlink(missing_ok=True)

    def remove(self) -> None:
        """Drop the whole revision directory (after publication)."""
        shutil.rmtree(self.dir, ignore_errors=True)
