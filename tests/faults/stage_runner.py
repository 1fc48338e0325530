"""``python -m tests.faults.stage_runner S3_URL HUB_ENDPOINT QUARANTINE``: the body of
``k3a stage`` (:func:`k3artifacts.cli.stage.run_stage`) on an S3 store whose multipart threshold
is 5 MiB, which the CLI has no flag for, so that a test can kill -9 a real process between the
parts of one upload. The S3 endpoint comes from ``K3A_S3_ENDPOINT_URL`` as for ``k3a``."""

from __future__ import annotations

import sys
from pathlib import Path

from k3artifacts.cli.stage import print_stage_result, run_stage, unreviewed_staged_code
from k3artifacts.net.policy import RetryPolicy
from k3artifacts.staging.engine import StageOptions
from k3artifacts.stores.s3 import MiB, S3Store, TransferTuning
from tests.staging_helpers import REPO


def main(store_url: str, endpoint: str, quarantine: str) -> None:
    store = S3Store.from_url(store_url, tuning=TransferTuning(
        multipart_threshold=5 * MiB, min_part_size=5 * MiB, max_concurrency=2))
    result = run_stage(store, REPO, "main", endpoint=endpoint, quarantine=Path(quarantine),
                       options=StageOptions(retry=RetryPolicy(attempts=3, backoff=0.05)),
                       as_json=False, quiet=True)
    print_stage_result(result, unreviewed_staged_code(store, result))


if __name__ == "__main__":
    main(*sys.argv[1:])
