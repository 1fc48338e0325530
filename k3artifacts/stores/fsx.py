"""Preload a published revision into an FSx for Lustre file system linked to the bucket.

An FSx for Lustre file system linked to S3 (a data repository association, DRA) shows S3
objects as files, loading their bytes lazily on first read. A new revision written to S3 after
the link was made appears in the file system only once its *metadata* is imported: automatic
import does that eventually, an ``IMPORT_METADATA_FROM_REPOSITORY`` data repository task does it
now, for exactly the revision's prefix. That is the task ``k3a fsx preload`` starts.

The other task types do not fit: ``EXPORT_TO_REPOSITORY`` goes the other way,
``RELEASE_DATA_FROM_FILESYSTEM`` evicts file contents, ``AUTO_RELEASE_DATA`` is for File Cache.
No task type copies file *contents* in ahead of time: after the import finishes, hydrate the
bytes from a client that mounts the file system (``lfs hsm_restore``, see
docs/guides/s3-and-fsx.md) so the
first pod does not pay for 1.5 TB of lazy loads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from k3artifacts.errors import ConfigError, NotFound
from k3artifacts.stores.awsclients import aws_errors

PRELOAD_TASK_TYPE = "IMPORT_METADATA_FROM_REPOSITORY"
#: Where the FSx endpoint is set (``k3a fsx preload``), for a hint naming what to check.
FSX_ENDPOINT_SETTINGS = "--fsx-endpoint-url / AWS_ENDPOINT_URL_FSX"


def preload_request(file_system_id: str, s3_path: str) -> dict[str, Any]:
    """``CreateDataRepositoryTask`` arguments importing the metadata under ``s3_path``.

    For import tasks ``Paths`` are S3 URLs (not file system paths), and the prefix must lie
    inside a data repository linked to the file system.
    """
    if not s3_path.startswith("s3://"):
        raise ConfigError(f"{s3_path!r} is not an s3:// path")
    return {
        "Type": PRELOAD_TASK_TYPE,
        "FileSystemId": file_system_id,
        "Paths": [s3_path.rstrip("/") + "/"],
        # Failures show in the task's FailureDetails and counters; a CSV report would need a
        # writable export path in the (read-mostly) release bucket.
        "Report": {"Enabled": False},
    }


def covering_repository(associations: list[dict[str, Any]], s3_path: str) -> str | None:
    """The linked S3 path (of a DescribeDataRepositoryAssociations result) containing
    ``s3_path``, or None."""
    target = s3_path.rstrip("/") + "/"
    for assoc in associations:
        repo = str(assoc.get("DataRepositoryPath", "")).rstrip("/") + "/"
        if assoc.get("Lifecycle", "AVAILABLE") == "AVAILABLE" and target.startswith(repo):
            return repo
    return None


@dataclass(frozen=True)
class PreloadStarted:
    task_id: str
    lifecycle: str
    file_system_id: str
    task_type: str
    paths: list[str]
    linked_repository: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_lustre(client: Any, file_system_id: str) -> dict[str, Any]:
    with aws_errors(f"describing FSx file system {file_system_id}",
                    endpoint_settings=FSX_ENDPOINT_SETTINGS):
        found = client.describe_file_systems(FileSystemIds=[file_system_id])["FileSystems"]
    if not found:
        raise NotFound(f"FSx file system {file_system_id} does not exist in this account/region")
    fs = found[0]
    if fs.get("FileSystemType") != "LUSTRE":
        raise ConfigError(
            f"{file_system_id} is an FSx for {fs.get('FileSystemType')} file system; "
            "preloading from S3 needs FSx for Lustre"
        )
    return fs


def start_preload(client: Any, file_system_id: str, s3_path: str) -> PreloadStarted:
    """Check the file system is Lustre and linked to ``s3_path``, then start the import."""
    request = preload_request(file_system_id, s3_path)
    describe_lustre(client, file_system_id)
    with aws_errors(f"listing data repository associations of {file_system_id}",
                    endpoint_settings=FSX_ENDPOINT_SETTINGS):
        pages = client.get_paginator("describe_data_repository_associations").paginate(
            Filters=[{"Name": "file-system-id", "Values": [file_system_id]}]
        )
        associations = [a for page in pages for a in page.get("Associations", [])]
    linked = covering_repository(associations, s3_path)
    if linked is None:
        raise ConfigError(
            f"{file_system_id} has no available data repository association covering {s3_path}",
            hint="link the bucket prefix to the file system (create-data-repository-association)"
            " or use a file system that is linked to this store",
        )
    with aws_errors(f"starting the FSx import of {s3_path} into {file_system_id}",
                    endpoint_settings=FSX_ENDPOINT_SETTINGS):
        task = client.create_data_repository_task(**request)["DataRepositoryTask"]
    return PreloadStarted(
        task_id=task["TaskId"],
        lifecycle=task["Lifecycle"],
        file_system_id=file_system_id,
        task_type=task["Type"],
        paths=list(task.get("Paths", request["Paths"])),
        linked_repository=linked,
    )
