"""The staging subscriber interface: progress bars, Prefect artifacts and counters are all
observers of one staging run, not code woven into its loops (the s3transfer pattern).

Kept apart from :mod:`.engine` so a progress display imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from k3artifacts.revisions.manifest import FileRecord
    from k3artifacts.staging.hub import RemoteFile


class StageObserver:
    """Progress and bookkeeping subscriber; every method is optional to override.

    Called from worker threads: implementations must be thread-safe.
    """

    def planned(self, files: list[RemoteFile], reused: set[str]) -> None: ...

    def file_started(self, path: str, size: int) -> None: ...

    def advance(self, path: str, nbytes: int) -> None: ...

    def file_done(self, record: FileRecord, reused: bool) -> None: ...

    def file_failed(self, path: str, error: BaseException) -> None:
        """``path`` was refused (a :class:`~k3artifacts.errors.Refusal`) or could not be
        fetched; the run will fail once running files finish."""

    def note(self, message: str) -> None: ...
