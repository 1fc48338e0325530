"""The benchmark's machinery: a work directory, the hub in its own process, child processes
timed with their peak RSS, page-cache control, and the table rows figures return."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.own_usage import launched, read_usage

REPO_ROOT = Path(__file__).resolve().parent.parent
MB = 1e6


@dataclass
class Row:
    """One line of the table: a figure against its limit or baseline."""

    figure: str
    value: float
    unit: str
    baseline_name: str = ""
    baseline: float | None = None
    #: value / baseline, oriented so that bigger is better.
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None
    note: str = ""
    extra: dict[str, object] = field(default_factory=dict)


@dataclass
class Child:
    seconds: float
    max_rss: int  # bytes
    cpu_seconds: float  # user + system
    stdout: str
    stderr: str
    returncode: int
    started_at: float = 0.0  # time.time() at the child's start
    #: Its /proc io counters, with those of every process it waited for (own_usage).
    io: dict[str, int] = field(default_factory=dict)

    def json(self) -> dict:
        return json.loads(self.stdout)


def force_rmtree(path: Path) -> None:
    """rmtree that also removes read-only published trees."""

    if path.exists():
        for dirpath, _, _ in os.walk(path):
            os.chmod(dirpath, os.stat(dirpath).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        shutil.rmtree(path)


def tree_bytes(paths: Sequence[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


class Bench:
    """Shared state of one run: where things live and how children are started."""

    def __init__(self, workdir: Path, *, cold: bool, verbose: bool = True):
        self.workdir = workdir.absolute()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cold = cold
        self.verbose = verbose
        self.hub_root = self.workdir / "hub"
        self.scratch = self.workdir / "scratch"
        #: Extra arguments of every ``k3a stage`` a figure runs (``--streams``).
        self.stage_args: tuple[str, ...] = ()
        force_rmtree(self.scratch)
        self.scratch.mkdir()
        self.env = dict(os.environ)
        self.env.update(
            PYTHONPATH=str(REPO_ROOT) + os.pathsep + self.env.get("PYTHONPATH", ""),
            HOME=str(self.workdir / "home"),
            XDG_DATA_HOME=str(self.workdir / "home" / "data"),
            # The bench's own identity key and pinned roots, never the account's.
            XDG_CONFIG_HOME=str(self.workdir / "home" / "config"),
            XDG_CACHE_HOME=str(self.workdir / "home" / "cache"),
            HF_HOME=str(self.workdir / "home" / "hf"),
            HF_HUB_DISABLE_XET="1",
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            DO_NOT_TRACK="1",
        )
        for var in ("K3A_STORE", "K3A_QUARANTINE", "HF_TOKEN", "HF_ENDPOINT", "AWS_PROFILE"):
            self.env.pop(var, None)
        self._seq = 0

    def log(self, message: str) -> None:
        if self.verbose:
            print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    def fresh(self, name: str) -> Path:
        """A new, empty directory under scratch/."""
        self._seq += 1
        path = self.scratch / f"{self._seq:03d}-{name}"
        path.mkdir(parents=True)
        return path

    # ----- releases ----------------------------------------------------------------------------

    def release(self, total_bytes: int, shards: int, seed: int = 0) -> dict[str, Path]:
        """The synthetic Kimi-K3-shaped release for these parameters (generated once, cached)."""
        key = hashlib.sha256(json.dumps([total_bytes, shards, seed]).encode()).hexdigest()[:12]
        out = self.workdir / "releases" / f"{total_bytes}-{shards}-{seed}-{key}"
        done = out / ".complete.json"
        if done.exists():
            return {p: Path(f) for p, f in json.loads(done.read_text()).items()}
        from k3artifacts.localhub.synthetic import write_release

        self.log(f"writing a synthetic release: {total_bytes / 2**30:.2f} GiB, {shards} shard(s)")
        force_rmtree(out)
        files = write_release(out, total_bytes=total_bytes, shards=shards, seed=seed)
        done.write_text(json.dumps({p: str(f) for p, f in files.items()}))
        return files

    def tiny_release(self, count: int, size: int = 1024) -> dict[str, Path]:
        """``count`` small config-like files in a few directories (per-file overhead)."""
        out = self.workdir / "releases" / f"tiny-{count}-{size}"
        done = out / ".complete.json"
        if done.exists():
            return {p: Path(f) for p, f in json.loads(done.read_text()).items()}
        force_rmtree(out)
        files: dict[str, Path] = {}
        for i in range(count):
            rel = f"extra/{i % 20:02d}/file-{i:05d}.json"
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            body = json.dumps({"i": i, "pad": "x" * size})[:size - 2] + '"}'
            path.write_text(body)
            files[rel] = path
        files["LICENSE"] = out / "LICENSE"
        files["LICENSE"].write_text("Modified MIT License\n")
        done.write_text(json.dumps({p: str(f) for p, f in files.items()}))
        return files

    def publish_on_hub(self, repo_id: str, files: Mapping[str, Path]) -> str:
        """Make ``files`` the head of ``repo_id`` on the local hub (on disk); return the commit."""
        from k3artifacts.localhub import LocalHub

        hub = LocalHub(self.hub_root)
        commit = hub.add_commit(repo_id, dict(files))
        return commit

    def blob_paths(self, repo_id: str, commit: str) -> list[Path]:
        from k3artifacts.localhub import LocalHub

        hub = LocalHub(self.hub_root)
        return [hub.repos.blob_path(e.sha256) for e in hub.files(repo_id, commit).values()]

    # ----- processes ---------------------------------------------------------------------------

    @contextmanager
    def hub(self, stream_rate: float | None = None) -> Iterator[str]:
        """The local hub serving ``hub_root`` from its own process; yields the endpoint.
        ``stream_rate``: bytes/s each file answer is paced to."""
        rate = [] if stream_rate is None else [str(stream_rate)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.hubserve", str(self.hub_root), *rate],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
            cwd=REPO_ROOT,
            text=True,
        )
        try:
            endpoint = proc.stdout.readline().strip()
            if not endpoint.startswith("http://127.0.0.1:"):
                raise RuntimeError(f"the hub process did not start (said {endpoint!r})")
            yield endpoint
        finally:
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        stdout_to: Path | None = None,
    ) -> Child:
        """Run a child to completion; its wall time, peak RSS and CPU time, its own (through
        tests.support.own_usage: wait4 on a child of this process reports at least this
        process's size as the child's peak)."""
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(open(stdout_to, "wb")) if stdout_to else subprocess.PIPE
            err = stack.enter_context(tempfile.TemporaryFile())
            report = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "usage.json"
            proc = subprocess.Popen(
                launched(list(map(str, argv)), report), stdout=out, stderr=err,
                env=dict(env or self.env), cwd=REPO_ROOT,
            )
            stdout, _ = proc.communicate()
            err.seek(0)
            stderr = err.read()
            usage = read_usage(report)
        child = Child(
            usage.seconds, usage.max_rss, usage.cpu_seconds,
            (stdout or b"").decode(errors="replace"), stderr.decode(errors="replace"),
            proc.returncode, usage.started_at, usage.io,
        )
        if check and child.returncode != 0:
            raise RuntimeError(
                f"{' '.join(map(str, argv))} exited {child.returncode}:\n{child.stderr[-3000:]}"
            )
        return child

    def k3a(self, *args: str, **kwargs) -> Child:
        return self.run([sys.executable, "-m", "k3artifacts", *args], **kwargs)

    def python(self, code: str, *args: str, **kwargs) -> Child:
        return self.run([sys.executable, "-c", code, *args], **kwargs)

    # ----- page cache --------------------------------------------------------------------------

    def settle(self, read_back: Sequence[Path] = ()) -> None:
        """Before each timed side: flush dirty pages, then either drop the page cache (--cold)
        or read ``read_back`` so every side starts with its input in memory."""
        os.sync()
        if self.cold:
            try:
                Path("/proc/sys/vm/drop_caches").write_text("3\n")
            except OSError as exc:
                raise SystemExit(f"--cold needs root to drop the page cache: {exc}") from None
            return
        for p in read_back:
            with open(p, "rb", buffering=0) as fh:
                while fh.read(8 << 20):
                    pass

    def prefault(self, nbytes: int) -> None:
        """Before the first timed side of a figure: write ``nbytes`` under scratch, sync, delete.

        On a virtual machine the first process to fill that much page cache since the machine
        (or the figure's SeaweedFS) started also pays for the hypervisor handing the guest its
        memory, and the side that runs first is always the same one. Measured on the 2-core
        VM, a 1 GiB ``k3a pull`` right after publishing: 2.8-3.0 s with 3.0 s of system time;
        every later run 1.35-1.55 s; the same first run after this untimed write 1.55 s."""
        path = self.scratch / "prefault.bin"
        block = bytes(8 << 20)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            left = nbytes
            while left > 0:
                left -= os.write(fd, block[: min(len(block), left)])
            os.fsync(fd)
        finally:
            os.close(fd)
            path.unlink()
        os.sync()


def cache_note(bench: Bench) -> str:
    return "page cache dropped before each side" if bench.cold else "inputs warm in page cache"
