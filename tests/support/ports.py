"""Free loopback ports and waiting for a server to listen."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 right now (held open together while chosen,
    so they differ)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def wait_listening(port: int, proc: subprocess.Popen, log: Path, what: str,
                   timeout: float = 60.0) -> None:
    """Return once 127.0.0.1:``port`` accepts connections; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early (code {proc.returncode}): "
                               f"{log.read_text(errors='replace')[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within "
                                   f"{timeout:.0f} s; log: {log}") from None
            time.sleep(0.1)


def stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds (``weed`` ignores SIGTERM for a while)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
