"""Named pause points for crash testing, set with ``K3A_FAULT_PAUSE=<point>[@<glob>]:<seconds>``.

The fault suite (tests/faults) kills ``k3a stage`` with SIGKILL at chosen points and checks that
no reader saw a partial revision and that a re-run completes, reusing what was verified. Some of
those points last microseconds (every byte of a file on disk but not yet checked; a revision
fully assembled but not yet renamed into view), so a test asks the process to wait there: when
the variable names the point (and ``<glob>`` matches the detail, e.g. a file path), the process
prints ``k3a: paused at <point> <detail>`` on stderr and sleeps for ``<seconds>``, or until the
file named by ``K3A_FAULT_RESUME`` exists (so a test can let it go on at a moment it chooses).
Unset, :func:`pause` returns at once; it changes nothing else, so it is harmless in production.

Points:
  ``downloaded``  a file's bytes are all in its partial file, before size/hash/header checks
  ``reused``      a file was copied from a published revision and logged, before the next one
  ``publish``     the store-side revision holds every file and the manifest, not yet visible
  ``move-pinned`` a promotion/rollback pinned the revision (detail: commit), before its gates
  ``gc-checked``  gc tombstoned a revision and found it unreachable (detail: commit), before
                  deleting it
  ``channel-move`` a channel move has read the pointer and is about to compare-and-swap it
                  (detail: the channel), so a test can move it first and see the race lost
  ``pull-part``   ``k3a pull`` wrote one part of a file (detail ``<path>#<part index>``)
  ``pull-planned`` ``k3a pull`` checked free space, before preallocating (detail: revision)
  ``references-checked`` an S3 revision's object records are written and the revisions it
                  reads objects of were found published (detail: commit), before its manifest
  ``load-file``   the verified load (``--load-format k3a``) is about to open a weights file
                  (detail: its path in the revision)
  ``load-read``   the verified load read all it reads of a file (detail: its path), before it
                  checks the file is still the one it opened
  ``load-agree``  a rank of the verified load read its files, before the ranks compare them
"""

from __future__ import annotations

import fnmatch
import sys
import time

from k3artifacts.settings import load


def armed() -> bool:
    """Whether any point may pause: a caller on a hot path asks once, not at every point
    (reading the settings costs a few hundred microseconds)."""
    return bool(load().fault_pause)


def pause(point: str, detail: str = "") -> None:
    settings = load()
    spec = settings.fault_pause
    if not spec:
        return
    target, _, seconds = spec.rpartition(":")
    name, _, glob = target.partition("@")
    if name != point or (glob and not fnmatch.fnmatchcase(detail, glob)):
        return
    print(f"k3a: paused at {point} {detail}", file=sys.stderr, flush=True)
    resume = settings.fault_resume
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline and not (resume and resume.exists()):
        time.sleep(0.05)
