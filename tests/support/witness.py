"""Witnesses that a refused move touched nothing: an HTTP stand-in on 127.0.0.1 that records
every request it is sent (any method), and a snapshot of every file under a file store's root
(hidden ones too: locks, in-progress revisions, a quarantine beside the store) with its bytes."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: (method, path, JSON body or None) -> (status, JSON answer)
Answer = Callable[[str, str, Any], tuple[int, Any]]


@dataclass(frozen=True)
class Call:
    at: float
    method: str
    path: str
    content_type: str | None
    body: Any


def _not_found(method: str, path: str, body: Any) -> tuple[int, Any]:
    return 404, {"message": f"{method} {path}: nothing here"}


class RecordingServer:
    """Answers with ``answer`` (default 404) and keeps every request in :attr:`calls`."""

    def __init__(self, answer: Answer = _not_found):
        import time

        self.calls: list[Call] = []
        calls = self.calls

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                calls.append(Call(time.monotonic(), self.command, self.path,
                                  self.headers.get("Content-Type"), body))
                status, doc = answer(self.command, self.path, body)
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _any  # noqa: N815

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig whose current context's API server is this stand-in."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "k3",
            "clusters": [{"name": "k3", "cluster": {"server": self.url}}],
            "users": [{"name": "k3", "user": {"token": "t"}}],
            "contexts": [{"name": "k3", "context": {"cluster": "k3", "user": "k3"}}]}))
        return path

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> RecordingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tree_snapshot(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root``: a file with its bytes, a directory as None."""
    found: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in dirnames:
            found[str((base / name).relative_to(root))] = None
        for name in filenames:
            found[str((base / name).relative_to(root))] = (base / name).read_bytes()
    return found
