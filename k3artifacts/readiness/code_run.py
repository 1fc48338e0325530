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
  privileges; as any other account (a login, a CI runner), bwrap's user namespace maps 65534
  onto the caller's uid, with no nested user namespace;
* **limits** (``prlimit``, on the answer's process and what it forks): CPU seconds, 512 MiB of
  address space, 1 MiB per file written (stdout and stderr are files here), 16 processes,
  64 open files, no core dump; and a wall-clock timeout.

**An account's groups.** A process that is not root cannot drop its supplementary groups, in a
user namespace or out of one (``setgroups`` is refused there): inside, they show as the
overflow gid (65534), and the kernel still grants them whatever they grant on any file the
sandbox shows. So no file inside can be a way to them: before the first answer runs, as any
account but root, every file and directory the sandbox shows (``/usr``, the Python
installation) is checked from outside (:func:`identity_grants`), where owners and groups are
the real ones, and one that opens to the account's uid or one of its groups more than to
everyone refuses the sandbox. What the account's identity opens beyond that (its home, the
store, credential files) is not in the sandbox's filesystem at all.

Before the first answer runs, a probe runs in the same sandbox and reports what it sees (its
uid and groups, its environment, its network interfaces, the root directory's entries, whether
``/usr`` is writable, its PID, its process limit): any difference from the above and no code
case runs (:class:`NoSandbox`, with the reason and the next step), and the evaluation says so.

**The verdict is k3a's.** The answer's process receives its source, the entry's name and the
inputs, never the expected values; the harness inside calls the function on each input and
writes the values, with a nonce drawn for this run, to a file k3a gave it (not stdout or
stderr, which only feed the detail). k3a compares them with the expected values in its own
process. An answer that prints a result line of its own, or writes anything to any descriptor,
and exits before its function has returned leaves no reply with the nonce and fails. The
answer's code shares the harness's process, so code written to reach into the harness could
still send values of its own for the inputs it was given; they are judged like any answer's
values, against expected values it never saw.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Any

UID = 65534
MEMORY_BYTES = 512 << 20
FILE_BYTES = 1 << 20
TMP_BYTES = 16 << 20
PROCESSES = 16
OPEN_FILES = 64
#: What is read back of the sandbox's stdout and stderr.
OUTPUT_BYTES = 64 << 10
PROBE_TIMEOUT_S = 30.0
#: Paths named in a refusal, at most.
NAMED = 3

INSTALL = "install bubblewrap (Debian and Ubuntu: apt-get install bubblewrap; Fedora: dnf " \
    "install bubblewrap)"
USER_NAMESPACES = (
    "allow unprivileged user namespaces where k3a runs: on a machine, sysctl "
    "user.max_user_namespaces above 0 (older Debian kernels: kernel.unprivileged_userns_clone=1; "
    "Ubuntu 24.04: kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile "
    "granting `userns` to /usr/bin/bwrap); in a Kubernetes pod, a seccomp profile that lets "
    "unshare and clone make user namespaces (securityContext.seccompProfile type Unconfined or "
    "a Localhost profile: RuntimeDefault refuses them) and AppArmor unconfined, on nodes that "
    "allow them; or run the evaluation where they are allowed")

_SEE_WHY = "run `bwrap --unshare-all --ro-bind / / true` as this account to see why " \
    "bubblewrap fails here"

#: The harness, in the answer's process: it calls the entry on each input and writes the
#: values, with the run's nonce, to the descriptor named by its argument.
_HARNESS = r"""
import json, os, sys
def main(fd):
    spec = json.loads(sys.stdin.read())
    nonce = spec.pop("nonce")
    namespace = {"__name__": "answer"}
    exec(compile(spec["source"], "<answer>", "exec"), namespace)
    values = [namespace[spec["entry"]](*args) for args in spec["inputs"]]
    with os.fdopen(fd, "w") as channel:
        channel.write(json.dumps({"nonce": nonce, "values": values}))
main(int(sys.argv[1]))
"""

_PROBE = r"""
import json, os, resource, socket, sys
try:
    open("/usr/.k3a-sandbox-probe", "w")
    usr_writable = True
except OSError:
    usr_writable = False
with open("/tmp/probe", "w") as f:
    f.write("x")
with open("/proc/sys/kernel/overflowgid") as f:
    overflow = int(f.read())
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                  "overflowgid": overflow, "env": sorted(os.environ), "pid": os.getpid(),
                  "interfaces": [name for _, name in socket.if_nameindex()],
                  "usr_writable": usr_writable,
                  "listing": {d: sorted(os.listdir(d)) for d in json.loads(sys.argv[1])},
                  "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0]}))
"""

#: Variables the interpreter or bwrap set inside on their own (never a value of the host's).
_OWN_ENV = {"PWD", "LC_CTYPE"}
#: What bwrap says when the kernel or the container refuses it a namespace.
_NAMESPACE_REFUSED = re.compile(r"namespace|uid map|gid map|setgroups|No permissions",
                                re.IGNORECASE)


class NoSandbox(Exception):
    """No isolation can be had here: the code cases are not run, and the report says why;
    ``next_step``: what gives this machine one."""

    def __init__(self, reason: str, next_step: str):
        super().__init__(reason)
        self.next_step = next_step


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


_ROOT_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _root_links() -> list[str]:
    """The merged-usr links (``/bin -> usr/bin``), or read-only binds where a system keeps
    real directories there."""
    args: list[str] = []
    for name in _ROOT_DIRS:
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def shown() -> list[str]:
    """The host's trees the sandbox shows (read-only): ``/usr``, the real directories among
    ``/bin``, ``/lib``, ..., and the Python installation."""
    return ["/usr", *(f"/{n}" for n in _ROOT_DIRS
                      if os.path.isdir(f"/{n}") and not os.path.islink(f"/{n}")), *_python()[1]]


def layout() -> dict[str, list[str]]:
    """What the sandbox's directories hold, as its probe must find them: the root's entries,
    and each directory above the Python installation holding only the way to it."""
    root = {"usr", "proc", "dev", "tmp", *(n for n in _ROOT_DIRS if os.path.islink(f"/{n}")
                                           or os.path.isdir(f"/{n}"))}
    seen: dict[str, set[str]] = {"/": root}
    for prefix in _python()[1]:
        parts = Path(prefix).parts
        root.add(parts[1])
        for i in range(2, len(parts)):
            seen.setdefault(str(Path(*parts[:i])), set()).add(parts[i])
    return {d: sorted(names) for d, names in seen.items()}


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
        if name == "bwrap":
            raise NoSandbox("bubblewrap (bwrap) is not installed", INSTALL)
        raise NoSandbox(f"{name} is not installed",
                        f"install util-linux (Debian: apt-get install util-linux), which has "
                        f"{name}")
    found = os.path.realpath(found)
    if inside and not found.startswith("/usr/"):
        raise NoSandbox(f"{found} runs inside the sandbox, which holds only /usr of the host",
                        f"use the system's {name} (/usr/bin/{name}) first on PATH")
    return found


def _run(argv: list[str], stdin: bytes, timeout_s: float,
         channel: IO[bytes] | None = None) -> tuple[int | None, str, str]:
    """(exit status or None on timeout, stdout, stderr): each read back at most
    :data:`OUTPUT_BYTES`, from files the sandbox cannot grow past :data:`FILE_BYTES`.
    ``channel``: a file the sandbox gets as an open descriptor (its number is argv's last)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            done = subprocess.run(argv, input=stdin, stdout=out, stderr=err, env={},
                                  timeout=timeout_s, close_fds=True,
                                  pass_fds=() if channel is None else (channel.fileno(),))
            status: int | None = done.returncode
        except subprocess.TimeoutExpired:
            status = None  # bwrap was killed: --die-with-parent and its PID namespace take the rest
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read(OUTPUT_BYTES).decode("utf-8", "replace"))
    return status, texts[0], texts[1]


def identity_grants(trees: Iterable[str], uid: int, gids: set[int]) -> list[str]:
    """Entries under ``trees`` (symlinks not followed) that open to ``uid`` as their owner, or
    to one of ``gids`` as their group, a read or a search that everyone else is refused: what
    an account's identity would open inside the sandbox. Directories this account cannot read
    are not entered (the code, with its identity, cannot read them either)."""
    found: list[str] = []
    stack = list(trees)
    while stack:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            other = st.st_mode & 0o5
            if (st.st_uid == uid and (st.st_mode >> 6) & 0o5 & ~other) or \
                    (st.st_gid in gids and (st.st_mode >> 3) & 0o5 & ~other):
                found.append(f"{entry.path} ({stat.filemode(st.st_mode)} uid {st.st_uid} "
                             f"gid {st.st_gid})")
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
    return sorted(found)


def _judge_probe(status: int | None, out: str, err: str, *, root: bool,
                 listing: dict[str, list[str]]) -> NoSandbox | None:
    """Why the probe's sandbox is not the one :func:`command` asks for (None: it is)."""
    if status != 0:
        last = (err.strip().splitlines() or [f"exit status {status}"])[-1][:300]
        if _NAMESPACE_REFUSED.search(err) and root:
            return NoSandbox(f"bubblewrap is refused the namespaces it needs here (root without "
                             f"CAP_SYS_ADMIN, as in a container): {last}",
                             "run the evaluation as an account that is not root (a pod: "
                             "securityContext.runAsNonRoot and runAsUser) and "
                             + USER_NAMESPACES)
        if _NAMESPACE_REFUSED.search(err):
            return NoSandbox(f"bubblewrap is refused the namespaces it needs here (unprivileged "
                             f"user namespaces): {last}", USER_NAMESPACES)
        return NoSandbox(f"the sandbox does not start here: {last}", _SEE_WHY)
    try:
        seen = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return NoSandbox(f"the sandbox's probe printed {out[:200]!r}", _SEE_WHY)
    wrong = []
    # Root's setpriv clears the groups; any other account keeps its own, which the user
    # namespace shows as the overflow gid (what they open is checked from outside).
    groups_ok = not seen["groups"] if root else \
        all(g == seen["overflowgid"] for g in seen["groups"])
    if (seen["uid"], seen["gid"]) != (UID, UID) or not groups_ok:
        wrong.append(f"uid {seen['uid']} gid {seen['gid']} groups {seen['groups']}")
    if set(seen["env"]) - _OWN_ENV:
        wrong.append(f"environment variables {sorted(set(seen['env']) - _OWN_ENV)}")
    if seen["interfaces"] != ["lo"]:
        wrong.append(f"network interfaces {seen['interfaces']}")
    if seen["listing"] != listing:
        wrong.append(f"directories holding {seen['listing']}, not {listing}")
    if seen["usr_writable"]:
        wrong.append("/usr writable")
    if seen["pid"] > 8:
        wrong.append(f"PID {seen['pid']} (no PID namespace of its own)")
    if seen["nproc"] != PROCESSES:
        wrong.append(f"process limit {seen['nproc']}")
    if not wrong:
        return None
    return NoSandbox(f"the sandbox leaks: {', '.join(wrong)}",
                     "use Debian's bubblewrap (0.8 or later) and util-linux, unmodified")


@cache
def _checked(bwrap: str, setpriv: str | None, prlimit: str) -> Sandbox | NoSandbox:
    """The sandbox, or why there is none: found once per process, either way."""
    root = setpriv is not None
    box = Sandbox(bwrap, setpriv, prlimit)
    listing = layout()
    status, out, err = _run([*box.argv(int(PROBE_TIMEOUT_S)), "-I", "-S", "-c", _PROBE,
                             json.dumps(sorted(listing))], b"", PROBE_TIMEOUT_S)
    problem = _judge_probe(status, out, err, root=root, listing=listing)
    if problem is not None:
        return problem
    if not root:
        grants = identity_grants(shown(), os.getuid(), {os.getegid(), *os.getgroups()})
        if grants:
            return NoSandbox(
                f"the sandbox would show files that this account's uid or groups open to it "
                f"and not to everyone ({len(grants)}): {'; '.join(grants[:NAMED])}",
                "make those files as readable by everyone as by their owner and group (or "
                "move them out of /usr and the Python installation), or run k3a as an account "
                "that neither owns them nor is in their groups")
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True,
                             env={}, timeout=PROBE_TIMEOUT_S).stdout.strip()
    groups = "no groups" if root else "its groups opening nothing inside"
    return Sandbox(bwrap, setpriv, prlimit, (
        f"{version or 'bubblewrap'} ({'setpriv' if root else 'user namespace'}): uid "
        f"{UID}, {groups}, empty environment, no network, read-only /usr and Python, private "
        f"/tmp, own PID namespace; {MEMORY_BYTES >> 20} MiB, {FILE_BYTES >> 20} MiB per file, "
        f"{PROCESSES} processes"))


def sandbox() -> Sandbox:
    """The checked sandbox of this machine; :class:`NoSandbox` with the reason and the next
    step where there is none (bwrap missing, namespaces refused, a probe that sees more than
    it should, files the account's identity would open inside)."""
    if not sys.platform.startswith("linux"):
        raise NoSandbox(f"bubblewrap needs Linux, this is {sys.platform}",
                        "run the evaluation on Linux")
    root = os.geteuid() == 0
    found = _checked(_tool("bwrap", inside=False), _tool("setpriv") if root else None,
                     _tool("prlimit"))
    if isinstance(found, NoSandbox):
        raise found
    return found


def missing() -> NoSandbox | None:
    """Why this machine has no sandbox (None: it has one)."""
    try:
        sandbox()
    except NoSandbox as exc:
        return exc
    return None


def source_of(answer: str) -> str:
    """The code in an answer: the first fenced block if there is one, else the whole text."""
    fenced = re.search(r"```[a-zA-Z0-9_+-]*\n(.*?)```", answer, re.DOTALL)
    return fenced.group(1) if fenced else answer


def run_cases(box: Sandbox, answer: str, entry: str, cases: list[tuple[list[Any], Any]],
              timeout_s: float, *, scrub: Callable[[str], str] = str) -> tuple[bool, str]:
    """Run ``entry`` of ``answer`` on each case's arguments in ``box``: (passed, detail). The
    expected values stay here; the values come back over a file of their own, with a nonce.
    ``scrub``: applied to what the code printed before any of it is cut for the detail."""
    nonce = secrets.token_hex(16)
    spec = json.dumps({"source": source_of(answer), "entry": entry, "nonce": nonce,
                       "inputs": [args for args, _ in cases]}).encode()
    with tempfile.TemporaryFile() as channel:
        argv = [*box.argv(int(timeout_s) + 1), "-I", "-S", "-c", _HARNESS,
                str(channel.fileno())]
        status, out, err = _run(argv, spec, timeout_s, channel)
        channel.seek(0)
        reply = channel.read(FILE_BYTES + 1)
    out, err = scrub(out).strip(), scrub(err)
    if status is None:
        return False, f"{entry} did not finish within {timeout_s:g} s"
    if status != 0:
        last = (err.strip().splitlines() or [f"no output (exit status {status})"])[-1]
        return False, f"{entry} failed: {last[:200]}"
    try:
        got = json.loads(reply)
    except ValueError:
        got = None
    if not isinstance(got, dict) or got.get("nonce") != nonce:
        printed = f" (it printed {out[-120:]!r})" if out else ""
        return False, (f"{entry} was never called to the end: the answer's process exited "
                       f"without the harness's reply{printed}")
    values = got.get("values")
    if not isinstance(values, list) or len(values) != len(cases):
        return False, f"{entry} returned {len(values) if isinstance(values, list) else 'no'} " \
            f"value(s) for {len(cases)} input(s)"
    wrong = [f"{entry}({', '.join(map(repr, args))}) = {scrub(repr(g))}, expected {want!r}"
             for (args, want), g in zip(cases, values, strict=True)
             if json.loads(json.dumps(want)) != g]
    if wrong:
        return False, "; ".join(wrong[:3])
    return True, f"{entry} right on {len(cases)} input(s)"
