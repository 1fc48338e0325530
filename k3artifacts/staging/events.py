"""The staging subscriber interface: progress bars, Prefect artifacts and counters are all
observers of one staging run, not code woven into its loops (the s3transfer pattern).

Kept apart from :mod:`.engine` so a progress display imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from k3artifacts.revisions.manifest import FileRecord
    from k3artifacts.staging.hub import RemoteFile
    from k3artifacts.staging.plan import StagePlan


class StageObserver:
    """Progress and bookkeeping subscriber; every method is optional to override.

    Called from worker threads: implementations must be thread-safe.
    """

    def planned(
        self, files: list[RemoteFile], reused: set[str], plan: StagePlan | None = None
    ) -> None:
        """Before any byte moves: every file, those that need no download (``reused``), and
        the plan saying for each whether it is downloaded, reused from which published
        revision, or already present."""

    def file_started(self, path: str, size: int) -> None: ...

    def file_resumed(self, path: str, offset: int) -> None:
        """``path`` continues from ``offset`` bytes a killed run left in its partial file
        (those bytes are re-hashed and then reported through :meth:`advance` as usual)."""

    def advance(self, path: str, nbytes: int) -> None: ...

    def file_done(self, record: FileRecord, reused: bool) -> None: ...

    def file_failed(self, path: str, error: BaseException) -> None:
        """``path`` was refused (a :class:`~k3artifacts.errors.Refusal`) or could not be
        fetched; the run will fail once running files finish."""

    def note(self, message: str) -> None: ...
