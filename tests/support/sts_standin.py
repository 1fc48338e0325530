"""A stand-in STS on 127.0.0.1 that answers every ``GetCallerIdentity`` with an identity of
its choosing (``--arn``), as one pointed to by ``AWS_ENDPOINT_URL_STS`` or
``K3A_STS_ENDPOINT_URL`` would; each request it receives is appended to ``--log`` (one line,
the action asked), so a test can tell that nobody asked it anything.

    python -m tests.support.sts_standin --port 0 --arn arn:aws:iam::999999999999:user/mallory \\
        --log /tmp/sts.log
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

from tests.support.ports import free_ports, stop, wait_listening

ANSWER = """<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <GetCallerIdentityResult><Arn>{arn}</Arn><UserId>AIDASTANDIN</UserId>
  <Account>999999999999</Account></GetCallerIdentityResult>
  <ResponseMetadata><RequestId>standin</RequestId></ResponseMetadata>
</GetCallerIdentityResponse>"""


def serve(port: int, arn: str, log: Path) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            action = (parse_qs(body).get("Action") or ["?"])[0]
            with log.open("a") as out:
                out.write(action + "\n")
            answer = ANSWER.format(arn=arn).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/xml")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


@dataclass(frozen=True)
class StandIn:
    url: str
    log: Path

    def asked(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []


@contextlib.contextmanager
def sts_standin(workdir: Path, arn: str) -> Iterator[StandIn]:
    """The stand-in, running as its own process, stopped by its PID on exit."""
    (port,) = free_ports(1)
    log, out = workdir / "sts-asked.log", workdir / "sts-standin.out"
    with out.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.sts_standin", "--port",
                                 str(port), "--arn", arn, "--log", str(log)],
                                stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_listening(port, proc, out, "the stand-in STS")
        yield StandIn(f"http://127.0.0.1:{port}", log)
    finally:
        stop(proc)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--arn", required=True)
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()
    serve(args.port, args.arn, args.log)
