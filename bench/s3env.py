"""moto in server mode on loopback, in its own process, for the S3 figures."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.moto import AWS_TEST_ENV as AWS_ENV
from tests.support.moto import MotoServer

from .env import Bench


@contextmanager
def moto(bench: Bench) -> Iterator[str]:
    """A moto_server on 127.0.0.1; sets the fake AWS environment here and for children."""
    os.environ.update(AWS_ENV)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    bench.env.update(AWS_ENV)
    server = MotoServer(bench.scratch / "moto.log", env=bench.env)
    try:
        bench.env["K3A_S3_ENDPOINT_URL"] = server.start().endpoint
        yield server.endpoint
    finally:
        bench.env.pop("K3A_S3_ENDPOINT_URL", None)
        server.stop()


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
