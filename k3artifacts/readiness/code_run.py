"""Running a model's code answer on a few inputs, in a sandbox: Debian's bubblewrap (``bwrap``),
a well-kept tool, not hooks of our own inside the interpreter that runs the answer.

What the sandbox is (:func:`command`):

* **a filesystem of its own**: an empty root holding, read-only, ``/usr`` (with the merged-usr
  links ``/bin``, ``/lib``, ...) and the Python installation (``sys.base_prefix``), a private
  ``/tmp`` (16 MiB tmpfs), a fresh ``/proc`` and a minimal ``/dev``. Nothing else of the host:
  no home directory, no credential file, no store, no checkout;
* **no network**: its own network namespace, loopback only;
* **its own processes**: PID, IPC, UTS and cgroup namespaces. bwrap's init is PID 1; when the
  answer's process exits, or k3a dies (``--die-with-parent``), every process it forked dies;
* **an empty environment**: bwrap is started with none and clears its own;
* **another uid, 65534, with no capability**: as root, bwrap sets the namespaces up and
  ``setpriv`` drops to uid and gid 65534 with no groups, no capabilities and no new
  privileges; as any other user, bwrap's user namespace maps 65534 onto the caller's uid,
  with no nested user namespace;
* **limits** (``prlimit``, on the answer's process and what it forks): CPU seconds, 512 MiB of
  address space, 1 MiB per file written (stdout and stderr are files here), 16 processes,
  64 open files, no core dump; and a wall-clock timeout.

Before the first answer runs, a probe runs in the same sandbox and reports what it sees (its
uid, its environment, its network interfaces, whether ``/usr`` is writable, its PID, its process
limit): any difference from the above and no code case runs (:class:`NoSandbox`, with the
reason), and the evaluation says so. The harness inside is five lines: read the inputs, run the
answer, call its function, print the results on a marked line. An answer can forge that line
and so cheat its own case; it cannot reach anything outside.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

MARK = "K3A-CODE-RESULT "
UID = 65534
MEMORY_BYTES = 512 << 20
FILE_BYTES = 1 << 20
TMP_BYTES = 16 << 20
PROCESSES = 16
OPEN_FILES = 64
#: What is read back of the sandbox's stdout and stderr.
OUTPUT_BYTES = 64 << 10
PROBE_TIMEOUT_S = 30.0

_HARNESS = r'''
import json, sys
spec = json.loads(sys.stdin.read())
namespace = {"__name__": "answer"}
exec(compile(spec["source"], "<answer>", "exec"), namespace)
results = [namespace[spec["entry"]](*args) for args in spec["inputs"]]
print("''' + MARK + r'''" + json.dumps(results), flush=True)
'''

_PROBE = r'''
import json, os, resource, socket
try:
    open("/usr/.k3a-sandbox-probe", "w")
    usr_writable = True
except OSError:
    usr_writable = False
with open("/tmp/probe", "w") as f:
    f.write("x")
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                  "env": sorted(os.environ), "pid": os.getpid(),
                  "interfaces": [name for _, name in socket.if_nameindex()],
                  "usr_writable": usr_writable,
                  "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0]}))
'''

#: Variables the interpreter or bwrap set inside on their own (never a value of the host's).
_OWN_ENV = {"PWD", "LC_CTYPE"}


class NoSandbox(Exception):
    """No isolation can be had here: the code cases are not run, and the report says why."""


@dataclass(frozen=True)
class Sandbox:
    """The tools found and checked: :meth:`argv` is the sandbox's command."""

    bwrap: str
    #: Only as root: what drops the answer's process to uid 65534.
    setpriv: str | None
    prlimit: str
    #: What isolates the code, for the report.
    description: str = ""

    def argv(self, cpu_seconds: int) -> list[str]:
        return command(self.bwrap, self.setpriv, self.prlimit, cpu_seconds)


def _python() -> tuple[str, list[str]]:
    """The base interpreter (a virtual environment's is a link to it, or a copy that needs its
    ``pyvenv.cfg``) and the installation directories it reads."""
    base = os.path.realpath(sys.base_prefix)
    exe = os.path.realpath(sys.executable)
    if not exe.startswith(base + os.sep):
        named = Path(base, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
        exe = str(named) if named.is_file() else exe
    dirs = sorted({base, os.path.realpath(sys.base_exec_prefix)})
    return exe, [d for d in dirs if not d.startswith("/usr/") and d != "/usr"]


def _root_links() -> list[str]:
    """The merged-usr links (``/bin -> usr/bin``), or read-only binds where a system keeps
    real directories there."""
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def command(bwrap: str, setpriv: str | None, prlimit: str, cpu_seconds: int) -> list[str]:
    """The sandbox's argv up to (not including) the interpreter's arguments."""
    exe, prefixes = _python()
    root = os.geteuid() == 0
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv"]
    if root:
        # Privileged bwrap keeps CAP_SETUID/SETGID/SETPCAP for setpriv alone, which drops
        # them all with the uid: the answer runs as 65534 outside as well as in.
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                 "--cap-add", "CAP_SETPCAP"]
    else:
        argv += ["--unshare-user", "--disable-userns", "--uid", str(UID), "--gid", str(UID)]
    argv += ["--ro-bind", "/usr", "/usr", *_root_links()]
    for prefix in prefixes:
        # Directories above it are made traversable here (bwrap would copy the host's modes:
        # a prefix under /root would stay out of uid 65534's reach).
        for parent in reversed(Path(prefix).parents[:-1]):
            argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", prefix, prefix]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp",
             "--remount-ro", "/", "--chdir", "/tmp", "--"]
    if root:
        assert setpriv is not None
        argv += [setpriv, f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    argv += [prlimit, f"--cpu={cpu_seconds}", f"--as={MEMORY_BYTES}", f"--fsize={FILE_BYTES}",
             f"--nproc={PROCESSES}", f"--nofile={OPEN_FILES}", "--core=0", "--", exe]
    return argv


def _tool(name: str, *, inside: bool = True) -> str:
    found = shutil.which(name)
    if found is None:
        raise NoSandbox(f"{name} is not installed (Debian: apt-get install "
                        f"{'bubblewrap' if name == 'bwrap' else 'util-linux'})")
    found = os.path.realpath(found)
    if inside and not found.startswith("/usr/"):
        raise NoSandbox(f"{found} runs inside the sandbox, which holds only /usr of the host")
    return found


def _run(argv: list[str], stdin: bytes, timeout_s: float) -> tuple[int | None, str, str]:
    """(exit status or None on timeout, stdout, stderr): each read back at most
    :data:`OUTPUT_BYTES`, from files the sandbox cannot grow past :data:`FILE_BYTES`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            done = subprocess.run(argv, input=stdin, stdout=out, stderr=err, env={},
                                  timeout=timeout_s, close_fds=True)
            status: int | None = done.returncode
        except subprocess.TimeoutExpired:
            status = None  # bwrap was killed: --die-with-parent and its PID namespace take the rest
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read(OUTPUT_BYTES).decode("utf-8", "replace"))
    return status, texts[0], texts[1]


def _judge_probe(status: int | None, out: str, err: str) -> str | None:
    """Why the probe's sandbox is not the one :func:`command` asks for (None: it is)."""
    if status != 0:
        last = (err.strip().splitlines() or [f"exit status {status}"])[-1]
        return f"the sandbox does not start here: {last[:300]}"
    try:
        seen = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"the sandbox's probe printed {out[:200]!r}"
    wrong = []
    if (seen["uid"], seen["gid"], seen["groups"]) != (UID, UID, []):
        wrong.append(f"uid {seen['uid']} gid {seen['gid']} groups {seen['groups']}")
    if set(seen["env"]) - _OWN_ENV:
        wrong.append(f"environment variables {sorted(set(seen['env']) - _OWN_ENV)}")
    if seen["interfaces"] != ["lo"]:
        wrong.append(f"network interfaces {seen['interfaces']}")
    if seen["usr_writable"]:
        wrong.append("/usr writable")
    if seen["pid"] > 8:
        wrong.append(f"PID {seen['pid']} (no PID namespace of its own)")
    if seen["nproc"] != PROCESSES:
        wrong.append(f"process limit {seen['nproc']}")
    return f"the sandbox leaks: {', '.join(wrong)}" if wrong else None


@cache
def _checked(bwrap: str, setpriv: str | None, prlimit: str) -> Sandbox:
    box = Sandbox(bwrap, setpriv, prlimit)
    status, out, err = _run([*box.argv(int(PROBE_TIMEOUT_S)), "-I", "-S", "-c", _PROBE], b"",
                            PROBE_TIMEOUT_S)
    problem = _judge_probe(status, out, err)
    if problem is not None:
        raise NoSandbox(problem)
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True,
                             env={}, timeout=PROBE_TIMEOUT_S).stdout.strip()
    return Sandbox(bwrap, setpriv, prlimit, (
        f"{version or 'bubblewrap'} ({'setpriv' if setpriv else 'user namespace'}): uid "
        f"{UID}, empty environment, no network, read-only /usr and Python, private /tmp, own "
        f"PID namespace; {MEMORY_BYTES >> 20} MiB, {FILE_BYTES >> 20} MiB per file, "
        f"{PROCESSES} processes"))


def sandbox() -> Sandbox:
    """The checked sandbox of this machine; :class:`NoSandbox` with the reason where there is
    none (bwrap missing, namespaces refused, a probe that sees more than it should)."""
    if not sys.platform.startswith("linux"):
        raise NoSandbox(f"bubblewrap needs Linux, this is {sys.platform}")
    root = os.geteuid() == 0
    return _checked(_tool("bwrap", inside=False), _tool("setpriv") if root else None,
                    _tool("prlimit"))


def source_of(answer: str) -> str:
    """The code in an answer: the first fenced block if there is one, else the whole text."""
    fenced = re.search(r"```[a-zA-Z0-9_+-]*\n(.*?)```", answer, re.DOTALL)
    return fenced.group(1) if fenced else answer


def run_cases(box: Sandbox, answer: str, entry: str, cases: list[tuple[list[Any], Any]],
              timeout_s: float, *, scrub: Callable[[str], str] = str) -> tuple[bool, str]:
    """Run ``entry`` of ``answer`` on each case's arguments in ``box``: (passed, detail).
    ``scrub``: applied to what the code printed before any of it is cut for the detail."""
    spec = json.dumps({"source": source_of(answer), "entry": entry,
                       "inputs": [args for args, _ in cases]}).encode()
    argv = [*box.argv(int(timeout_s) + 1), "-I", "-S", "-c", _HARNESS]
    status, out, err = _run(argv, spec, timeout_s)
    out, err = scrub(out), scrub(err)
    if status is None:
        return False, f"{entry} did not finish within {timeout_s:g} s"
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith(MARK)), None)
    if status != 0 or line is None:
        last = (err.strip().splitlines() or [f"no output (exit status {status})"])[-1]
        return False, f"{entry} failed: {last[:200]}"
    try:
        got = json.loads(line[len(MARK):])
    except ValueError:
        return False, f"{entry} printed a result line that is not JSON"
    if not isinstance(got, list) or len(got) != len(cases):
        return False, f"{entry} printed {len(got) if isinstance(got, list) else 'no'} result(s) " \
            f"for {len(cases)} input(s)"
    wrong = [f"{entry}({', '.join(map(repr, args))}) = {g!r}, expected {want!r}"
             for (args, want), g in zip(cases, got, strict=True)
             if json.loads(json.dumps(want)) != g]
    if wrong:
        return False, "; ".join(wrong[:3])
    return True, f"{entry} right on {len(cases)} input(s)"
