"""Shared tools of the fault suite: run ``k3a`` as a real process, stop it at a chosen point,
kill it with SIGKILL, and check what a reader of the store can see."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from k3artifacts.staging.quarantine import Quarantine
from k3artifacts.stores.base import Store
from k3artifacts.stores.file import FileStore
from tests.staging_helpers import REPO
from tests.support.waiting import wait_until

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
#: Waits for a subprocess to reach a point; generous because the machine is shared.
WAIT = 30.0


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler],
            tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """A one-off misbehaving HTTP server on 127.0.0.1 (a thread of this process), for answers
    the local hub has no fault for; yields its base URL and is shut down on exit. ``tls``: a
    certificate and key file to serve HTTPS with."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def send_slowly(wfile, data: bytes, seconds: float = 0.1) -> None:
    """Write ``data`` a byte every ``seconds``: a peer always just fast enough to beat a read
    timeout. Stops when the client hangs up."""
    for i in range(len(data)):
        try:
            wfile.write(data[i:i + 1])
        except OSError:
            return
        time.sleep(seconds)


@dataclass
class Running:
    """A ``k3a`` subprocess whose stderr is collected line by line as it arrives."""

    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_line(self, text: str, timeout: float = WAIT) -> str:
        return wait_until(
            lambda: next((line for line in self.lines if text in line), None),
            f"{text!r} on stderr", timeout, proc=self.proc,
        )

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=WAIT)
        self._reader.join(timeout=WAIT)
        assert self.proc.returncode == -signal.SIGKILL

    def finish(self, timeout: float = 120) -> int:
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=WAIT)
        return self.proc.returncode


def start_k3a(k3a_cmd: list[str], env: dict[str, str], *args: str, **extra_env: str) -> Running:
    proc = subprocess.Popen(
        [*k3a_cmd, *args],
        env={**env, **extra_env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return Running(proc)


def stage_args(endpoint: str, store: Store, quarantine: Path, *more: str) -> list[str]:
    return ["stage", REPO, "--endpoint", endpoint, "--store", store.url,
            "--quarantine", str(quarantine), "--retries", "3", "-q", *more]


def quarantine_of(root: Path, commit: str) -> Quarantine:
    """The quarantine layout of a revision (not locked: only for looking at it)."""
    return Quarantine(root, REPO, commit)


def verified_paths(root: Path, commit: str) -> set[str]:
    log = quarantine_of(root, commit).dir / "verified.jsonl"
    if not log.exists():
        return set()
    import json

    return {json.loads(line)["record"]["path"] for line in log.read_text().splitlines() if line}


def assert_not_visible(store: Store, commit: str) -> None:
    """What every reader may see of an unpublished revision: nothing at all."""
    assert commit not in store.list_revisions(REPO)
    assert store.read_manifest(REPO, commit) is None
    assert store.list_keys(f"models/{REPO}/{commit}/") == []
    if isinstance(store, FileStore):
        # vLLM and the operator read the directory itself, not through list_keys.
        assert not (store.root / "models" / REPO / commit).exists()


def assert_nothing_published(store: Store) -> None:
    assert store.list_revisions(REPO) == []
    assert store.list_keys("models/") == []
    assert store.list_keys("releases/") == []


def file_gets(hub, since: int = 0, path: str | None = None) -> list:
    """GETs of file bytes (on the CDN, or resolves the hub answered itself) answered since
    request number ``since``."""
    return [r for r in hub.requests[since:]
            if r.method == "GET" and r.is_file and (path is None or r.target == path)]
