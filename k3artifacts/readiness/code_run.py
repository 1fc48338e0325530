"""Running a model's code answer on a few inputs, contained: a separate ``python -I`` (no user
site, no environment, no script directory on the path) in an empty temporary directory, with
resource limits (CPU seconds, address space, no file may grow past 0 bytes, no core dumps), an
audit hook installed before the answer runs that refuses sockets, subprocesses and opening
files for writing, and a wall-clock timeout. The answer's return values come back as JSON on
a marked line; anything else it prints is ignored."""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
import tempfile
from typing import Any

MARK = "K3A-CODE-RESULT "
MEMORY_BYTES = 512 * 1024 * 1024

_HARNESS = r'''
import json, os, sys
spec = json.loads(sys.stdin.read())
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
REFUSED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.fork",
           "os.spawn", "os.kill", "os.remove", "os.rename", "os.rmdir", "os.mkdir",
           "os.chmod", "os.chown", "os.truncate", "shutil.", "ctypes.", "pty.", "webbrowser.")
def audit(event, args):
    if event.startswith(REFUSED):
        raise PermissionError("refused in the code check: " + event)
    if event == "open" and len(args) >= 3:
        mode, flags = args[1], args[2] or 0
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or flags & WRITE:
            raise PermissionError("refused in the code check: writing " + str(args[0]))
sys.addaudithook(audit)
namespace = {"__name__": "answer"}
exec(compile(spec["source"], "<answer>", "exec"), namespace)
entry = namespace[spec["entry"]]
print("''' + MARK + r'''" + json.dumps([entry(*args) for args in spec["inputs"]]), flush=True)
'''


def _limits(cpu_seconds: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def source_of(answer: str) -> str:
    """The code in an answer: the first fenced block if there is one, else the whole text."""
    fenced = re.search(r"```[a-zA-Z0-9_+-]*\n(.*?)```", answer, re.DOTALL)
    return fenced.group(1) if fenced else answer


def run_cases(answer: str, entry: str, cases: list[tuple[list[Any], Any]],
              timeout_s: float) -> tuple[bool, str]:
    spec = json.dumps({"source": source_of(answer), "entry": entry,
                       "inputs": [args for args, _ in cases]})
    with tempfile.TemporaryDirectory(prefix="k3a-code-") as empty:
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-c", _HARNESS], input=spec, capture_output=True,
                text=True, cwd=empty, env={}, timeout=timeout_s,
                preexec_fn=lambda: _limits(int(timeout_s) + 1))  # noqa: PLW1509 - rlimits
        except subprocess.TimeoutExpired:
            return False, f"{entry} did not finish within {timeout_s:g} s"
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)), None)
    if proc.returncode != 0 or line is None:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"{entry} failed: {last[:200]}"
    got = json.loads(line[len(MARK):])
    wrong = [f"{entry}({', '.join(map(repr, args))}) = {g!r}, expected {want!r}"
             for (args, want), g in zip(cases, got, strict=True)
             if json.loads(json.dumps(want)) != g]
    if wrong:
        return False, "; ".join(wrong[:3])
    return True, f"{entry} right on {len(cases)} input(s)"
