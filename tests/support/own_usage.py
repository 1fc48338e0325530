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
(10-20 ms) is in no figure. Beside it: the wall-clock time of the fork (a child that prints
when something happened can be timed from its own start), and the launcher's ``/proc/self/io``
counters over the wait, which are the child's and those of every process the child waited for
(the kernel adds a reaped child's counters to its parent's): ``rchar`` counts bytes passed by
``read`` calls, ``read_bytes`` bytes fetched from the disk, a mapped file's pages included.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

_LAUNCHER = """\
import json, os, sys, time
def io():
    with open("/proc/self/io") as fh:
        return {k: int(v) for k, v in (line.split(": ") for line in fh.read().splitlines())}
before = io()
wall = time.time()
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
after = io()
with open(sys.argv[1], "w") as fh:
    json.dump({"max_rss": usage.ru_maxrss * 1024, "cpu": usage.ru_utime + usage.ru_stime,
               "seconds": seconds, "started_at": wall,
               "io": {k: after[k] - before[k] for k in after}}, fh)
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"""


@dataclass(frozen=True)
class Usage:
    max_rss: int  # bytes
    cpu_seconds: float
    seconds: float  # wall time, fork to exit
    started_at: float = 0.0  # time.time() at the fork
    #: /proc/self/io counters of the child and the processes it reaped (rchar, read_bytes...).
    io: dict[str, int] = field(default_factory=dict)


def launched(argv: list[str], report: Path) -> list[str]:
    """``argv`` run through the launcher, which writes the child's own usage to ``report``."""
    return [sys.executable, "-S", "-c", _LAUNCHER, str(report), *argv]


def read_usage(report: Path) -> Usage:
    data = json.loads(report.read_text())
    return Usage(max_rss=int(data["max_rss"]), cpu_seconds=float(data["cpu"]),
                 seconds=float(data["seconds"]), started_at=float(data["started_at"]),
                 io=dict(data["io"]))
