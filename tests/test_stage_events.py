"""The staging events an observer sees when a run continues a partial file a failed run left."""

from __future__ import annotations

import threading

import pytest

from k3artifacts.errors import Unavailable
from k3artifacts.net.policy import RetryPolicy
from k3artifacts.staging.engine import StageOptions, stage
from k3artifacts.staging.events import StageObserver
from k3artifacts.staging.hub import HubSource
from tests.staging_helpers import FAST_RETRY, REPO, small_release
from tests.support.hubfaults import Fault

SHARD = "model-00001-of-00002.safetensors"


class Recorder(StageObserver):
    def __init__(self):
        self.lock = threading.Lock()
        self.resumed: list[tuple[str, int]] = []
        self.advanced: dict[str, int] = {}

    def file_resumed(self, path: str, offset: int) -> None:
        with self.lock:
            self.resumed.append((path, offset))

    def advance(self, path: str, nbytes: int) -> None:
        with self.lock:
            self.advanced[path] = self.advanced.get(path, 0) + nbytes


def test_a_resumed_file_is_announced_once_with_its_offset(local_hub, file_store, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    quarantine = tmp_path / "q"
    local_hub.hub.faults.add(SHARD, Fault.drop(after_bytes=100_000))
    source = HubSource(endpoint=local_hub.endpoint, token=False, retry=RetryPolicy(attempts=1))
    first = Recorder()
    with pytest.raises(Unavailable):
        stage(source, file_store, REPO, "main", quarantine, StageOptions(retry=RetryPolicy(
            attempts=1)), first)
    assert first.resumed == []  # nothing was left to resume in a first run
    (part,) = (quarantine / "moonshotai--Kimi-K3" / commit / "partial").glob("*.part")
    kept = part.stat().st_size
    assert kept > 0

    local_hub.hub.faults.clear()
    second = Recorder()
    source = HubSource(endpoint=local_hub.endpoint, token=False, retry=FAST_RETRY)
    result = stage(source, file_store, REPO, "main", quarantine,
                   StageOptions(retry=FAST_RETRY), second)
    assert second.resumed == [(SHARD, kept)]
    size = file_store.read_manifest(REPO, commit).file(SHARD).size
    assert second.advanced[SHARD] == size  # resumed bytes still count as done, once
    assert result.files == 7
