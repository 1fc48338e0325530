"""moto in server mode as a subprocess on 127.0.0.1 (its memory grows with every object it
stores; a subprocess keeps that out of the caller). It answers S3, STS, ECR and FSx."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import TracebackType

from tests.support.ports import free_ports, stop, wait_listening

#: Fake credentials and region: boto3 needs some; moto accepts any, no real account is reached.
AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    # No profile or config file of the machine leaks in.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
#: Variables that would point a client somewhere else.
AWS_UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
             "AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS", "K3A_S3_ENDPOINT_URL")


def moto_server_argv() -> list[str]:
    exe = Path(sys.executable).with_name("moto_server")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("moto_server")
    return [found] if found else [sys.executable, "-m", "moto.server"]


class MotoServer:
    def __init__(self, log: Path, env: dict[str, str] | None = None):
        self.log = Path(log)
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.endpoint = ""

    def start(self) -> MotoServer:
        (port,) = free_ports(1)
        with open(self.log, "wb") as log_fh:
            self.proc = subprocess.Popen(
                [*moto_server_argv(), "-H", "127.0.0.1", "-p", str(port)],
                stdout=log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env if self.env is not None else {**os.environ, **AWS_TEST_ENV},
            )
        try:
            wait_listening(port, self.proc, self.log, "moto_server")
        except BaseException:
            self.stop()
            raise
        self.endpoint = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, grace=10.0)
            self.proc = None

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
