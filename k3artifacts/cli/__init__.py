"""The ``k3a`` command line, an adapter over the library: one module per command group (the
group itself in :mod:`k3artifacts.cli.app`; the generated reference pages in
:mod:`k3artifacts.cli.manual`), each parsing, resolving who acts and the settings, calling one of
the library's entry points and showing its result, ``--json`` and errors included. No policy
lookups, record writes or checks of its own: an import contract keeps it from the records, the
gates and the stores' insides.

This module handles Ctrl-C and a closed stdout from the program's first statement: it imports
nothing heavier than :mod:`signal`, so the interrupt handler is in place before click, pydantic
or any command module is imported, and Ctrl-C in the first second exits 130 like Ctrl-C an hour
into a stage.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
from typing import Any

#: Exit code of a run stopped by Ctrl-C (SIGINT), as shells report it.
INTERRUPTED = 130
RESUME_HINT = "re-run the same command to resume: partial and verified files are kept"
RETRY_HINT = "nothing half-written is visible to readers; re-run the same command"

_interrupt_hint = RETRY_HINT


def set_interrupt_hint(hint: str) -> None:
    """What Ctrl-C tells the operator to do next, from now on in this process."""
    global _interrupt_hint
    _interrupt_hint = hint


def _interrupted(signum: int, frame: Any) -> None:
    # Straight to the file descriptor: a worker thread may hold sys.stderr's lock mid-line.
    with contextlib.suppress(OSError):  # stderr may be a pipe nobody reads any more
        os.write(2, f"\nerror: interrupted (Ctrl-C)\nnext: {_interrupt_hint}\n".encode())
    # At once, as a crash would: waiting for running transfers to drain could take an hour
    # at a multi-GB shard, and every write is already crash-safe (partial files are a prefix,
    # records are created or swapped atomically, a revision is visible only with its manifest).
    os._exit(INTERRUPTED)


class _ClosedPipeTolerant(io.TextIOWrapper):
    """stdout (or stderr) that outlives its reader: once ``k3a ... | head -1`` has closed the
    pipe, the rest of the output goes to /dev/null and the command finishes its work and
    exits with its own code (a stage whose summary nobody reads has still published)."""

    def write(self, text: str) -> int:
        try:
            return super().write(text)
        except BrokenPipeError:
            self._discard_from_now_on()
            return super().write(text)

    def flush(self) -> None:
        try:
            super().flush()
        except BrokenPipeError:
            self._discard_from_now_on()
            super().flush()

    def _discard_from_now_on(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.fileno())
        os.close(devnull)


def _tolerant(stream: Any) -> Any:
    if not isinstance(stream, io.TextIOWrapper) or isinstance(stream, _ClosedPipeTolerant):
        return stream
    # The original wrapper stays referenced by sys.__stdout__ / sys.__stderr__, so it never
    # closes the buffer they share.
    stream.flush()
    return _ClosedPipeTolerant(
        stream.buffer,
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=stream.line_buffering,
        write_through=stream.write_through,
    )


def main() -> None:
    signal.signal(signal.SIGINT, _interrupted)
    sys.stdout = _tolerant(sys.stdout)
    sys.stderr = _tolerant(sys.stderr)
    # botocore imports urllib3.contrib.pyopenssl only to reach urllib3's SSLContext as it was
    # before any injection, and takes urllib3.util.ssl_.SSLContext when that import fails:
    # the same class in a process that injects nothing, as this one. Where pyOpenSSL is
    # installed (the pkcs11 extra) the import loads OpenSSL and cryptography.x509, 20-30 ms of
    # every S3 command's start on 2 cores (issue 22). Signing imports what it uses itself.
    sys.modules.setdefault("urllib3.contrib.pyopenssl", None)  # type: ignore[arg-type]
    from k3artifacts.cli.app import cli

    try:
        cli(prog_name="k3a")
    finally:
        # The interpreter's exit walks every object still alive in its final collections:
        # with an S3 client and pydantic's schemas that took 0.15-0.25 s of each command on
        # 2 cores (issue 22). The process is ending: nothing it holds needs collecting.
        # (Imported here: in this package the name ``gc`` is the command module cli/gc.py.)
        import gc

        gc.freeze()


def __getattr__(name: str) -> Any:
    # `from k3artifacts.cli import cli` (tests, CliRunner) without importing click here.
    if name == "cli":
        from k3artifacts.cli.app import cli

        return cli
    raise AttributeError(name)
