"""moto in server mode on loopback, in its own process, for the S3 figures."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .env import Bench

#: Fake credentials, as the test fixtures use: nothing can reach a real account.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


@contextmanager
def moto(bench: Bench) -> Iterator[str]:
    """A moto_server on 127.0.0.1; sets the fake AWS environment here and for children."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(AWS_ENV)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    bench.env.update(AWS_ENV)
    exe = Path(sys.executable).with_name("moto_server")
    with open(bench.scratch / f"moto-{port}.log", "wb") as log:
        proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, env=bench.env)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError("moto_server exited early")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start within 60 s") from None
                time.sleep(0.1)
        bench.env["K3A_S3_ENDPOINT_URL"] = endpoint
        yield endpoint
    finally:
        bench.env.pop("K3A_S3_ENDPOINT_URL", None)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bucket(endpoint: str) -> str:
    """A fresh versioned bucket, as production uses."""
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}))
    name = f"k3a-bench-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name
