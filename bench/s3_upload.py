"""Upload throughput of S3Store against moto on loopback, as a ratio to plain boto3.

moto is far slower than S3 and its speed varies with the machine, so the absolute MiB/s mean
little; the ratio (S3Store publish time / plain ``upload_file`` of the same bytes to the same
server in the same run) shows what our checksums, metadata and read-back cost. Also reports the
bytes moved for a second revision that changes one small file.

    python bench/s3_upload.py --shards 4 --shard-mib 128

moto keeps every object in memory (several times its size at peak): mind the RAM.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from k3artifacts.stores.s3 import MiB, S3Store
from tests.support.revisions import publish, write_revision


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mib", type=int, default=128)
    args = ap.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    moto = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H",
                             "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.1)
        plain = boto3.client("s3", endpoint_url=endpoint,
                             config=Config(s3={"addressing_style": "path"}))
        plain.create_bucket(Bucket="bench-plain")
        plain.create_bucket(Bucket="bench-store")
        plain.put_bucket_versioning(Bucket="bench-store",
                                    VersioningConfiguration={"Status": "Enabled"})
        with tempfile.TemporaryDirectory() as tmp:
            shards = {f"model-{i:05d}.safetensors": os.urandom(args.shard_mib * MiB)
                      for i in range(args.shards)}
            rev1 = write_revision(Path(tmp) / "r1", {**shards, "config.json": b'{"v":1}'})
            total = sum(rec.size for rec, _ in rev1.values())
            store = S3Store.from_url("s3://bench-store/k3a", endpoint_url=endpoint)
            # Same part size and concurrency for both, so the difference is our own work.
            config = TransferConfig(multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB,
                                    max_concurrency=8)
            t0 = time.perf_counter()
            for rec, local in rev1.values():
                plain.upload_file(str(local), "bench-plain", rec.path, Config=config)
            plain_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            publish(store, "1" * 40, rev1)
            store_s = time.perf_counter() - t0
            rev2 = write_revision(Path(tmp) / "r2", {**shards, "config.json": b'{"v":2}'})
            t0 = time.perf_counter()
            w2, _ = publish(store, "2" * 40, rev2)
            second_s = time.perf_counter() - t0
    finally:
        moto.terminate()
        moto.wait()
    print(json.dumps({
        "release_bytes": total,
        "plain_upload_file_s": round(plain_s, 2),
        "s3store_publish_s": round(store_s, 2),
        "ratio_store_to_plain": round(store_s / plain_s, 2),
        "plain_MiB_per_s": round(total / MiB / plain_s, 1),
        "s3store_MiB_per_s": round(total / MiB / store_s, 1),
        "second_revision": {"seconds": round(second_s, 2), **w2.counters.as_dict()},
    }, indent=2))


if __name__ == "__main__":
    main()
