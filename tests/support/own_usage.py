"""A child process's own peak memory and CPU time, not its parent's.

``wait4``'s ``ru_maxrss`` for a child started straight from a test or the benchmark runner is at
least the *parent's* resident size when it forked: Linux hands the address space's high-water
mark to the child (``vfork`` shares it, ``fork`` copies it) and keeps it across ``exec``. A
pytest or bench process of 130-220 MB therefore hid every smaller peak and made two peaks equal
whatever the children did (a flatness check that could not fail).

:func:`launched` puts a launcher in front of ``argv``: a bare interpreter (``-S``, about 8 MB)
that forks the real child from its own small address space, waits for it and writes the
child's rusage to a report file. The child keeps the caller's stdin, stdout and stderr, and the
launcher exits with the child's status (128 + N when a signal N ended it, as shells report).
The report's wall time runs from the fork to the child's end, so the launcher's own start
(10-20 ms) is in no figure.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

_LAUNCHER = """\
import json, os, sys, time
started = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as exc:
        os.write(2, f"{sys.argv[2]}: {exc}\\n".encode())
    os._exit(127)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - started
with open(sys.argv[1], "w") as fh:
    json.dump({"max_rss": usage.ru_maxrss * 1024, "cpu": usage.ru_utime + usage.ru_stime,
               "seconds": seconds}, fh)
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"""


@dataclass(frozen=True)
class Usage:
    max_rss: int  # bytes
    cpu_seconds: float
    seconds: float  # wall time, fork to exit


def launched(argv: list[str], report: Path) -> list[str]:
    """``argv`` run through the launcher, which writes the child's own usage to ``report``."""
    return [sys.executable, "-S", "-c", _LAUNCHER, str(report), *argv]


def read_usage(report: Path) -> Usage:
    data = json.loads(report.read_text())
    return Usage(max_rss=int(data["max_rss"]), cpu_seconds=float(data["cpu"]),
                 seconds=float(data["seconds"]))
