"""The Prefect UI itself, in a real headless browser (Debian ``chromium``), on a staging run
and a blocked promotion: the pages show the run names, tags and artifacts the flows write.

Needs ``chromium`` on PATH (skipped otherwise) and starts its own ``prefect server`` with the
UI (the session's API runs ``--no-ui``). ``K3A_SCREENSHOT_DIR=docs/cockpit`` keeps the PNGs.
"""

from __future__ import annotations

import contextvars
import os
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactCollectionFilter, ArtifactCollectionFilterKey
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.common import slug
from flows.promote import promote_release
from flows.stage_release import stage_release
from k3artifacts.stores.file import FileStore
from tests.fixtures.prefect_api import _free_port, _healthy
from tests.staging_helpers import REPO, small_release
from tests.support.hubfaults import Fault
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium"),
]


@pytest.fixture
def store(tmp_path):
    return FileStore(tmp_path / "store")


@pytest.fixture
def ui_server(tmp_path):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = os.environ | {"PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
                        "PREFECT_UI_API_URL": f"{base}/api",
                        "PREFECT_HOME": str(tmp_path / "prefect-home")}
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host",
                             "127.0.0.1", "--port", str(port)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        try:
            wait_until(lambda: _healthy(f"{base}/api"), "the Prefect server to answer", 120,
                       interval=0.25, proc=proc)
        except AssertionError as exc:
            raise AssertionError((tmp_path / "server.log").read_text()[-3000:]) from exc
        with urllib.request.urlopen(base, timeout=10) as resp:  # the UI is served
            assert resp.status == 200
        with temporary_settings({PREFECT_API_URL: f"{base}/api"}):
            yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def browse(url: str, png: Path) -> str:
    """Render ``url`` (the UI is a single-page app: give its scripts time), save a screenshot
    and return the rendered DOM's text."""
    common = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--window-size=1440,1100", "--virtual-time-budget=20000"]
    subprocess.run([*common, f"--screenshot={png}", url], check=True, capture_output=True,
                   timeout=120)
    dom = subprocess.run([*common, "--dump-dom", url], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    keep = os.environ.get("K3A_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / png.name)
    return dom


def artifact_page(base: str, key: str) -> str:
    """The page showing the latest artifact of ``key`` (its content, not the key's timeline)."""
    with get_client(sync_client=True) as client:
        (latest,) = client.read_latest_artifacts(
            artifact_filter=ArtifactCollectionFilter(key=ArtifactCollectionFilterKey(any_=[key])))
    return f"{base}/artifacts/artifact/{latest.latest_id}"


def _latest_data(key: str) -> str:
    with get_client(sync_client=True) as client:
        found = client.read_latest_artifacts(
            artifact_filter=ArtifactCollectionFilter(key=ArtifactCollectionFilterKey(any_=[key])))
    return str(found[0].data) if found else ""


def test_run_pages_show_names_tags_and_decisions(ui_server, local_hub, tmp_path, store,
                                                 releases, policies):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path, seed=1801))
    staged = stage_release(repo_id=REPO, store_url=store.url, endpoint=local_hub.endpoint,
                           quarantine=str(tmp_path / "q"), return_state=True)
    assert staged.is_completed()
    dom = browse(f"{ui_server}/runs/flow-run/{staged.state_details.flow_run_id}",
                 tmp_path / "stage-run.png")
    assert f"stage {REPO}@{commit[:7]}" in dom and f"commit:{commit}" in dom

    key = slug("k3a", REPO, commit[:12])
    dom = browse(artifact_page(ui_server, f"{key}-summary"), tmp_path / "stage-summary.png")
    assert "throughput" in dom and "k3a tuple create" in dom
    dom = browse(artifact_page(ui_server, f"{key}-status"), tmp_path / "stage-status.png")
    assert "ETA" in dom and "published" in dom
    dom = browse(artifact_page(ui_server, f"{key}-files"), tmp_path / "stage-files.png")
    assert "verified" in dom and "sha256:" in dom

    # While a slow stage runs, its live status page shows bytes, rate and ETA.
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path, seed=1802))
    # Long enough for a loaded machine's browser to render the page while the stage is held
    # (the 60 s read timeout is not reached: the stage then completes untouched).
    local_hub.hub.faults.add("*.safetensors", Fault.stall(20, after_bytes=128 << 10, times=None))
    outcome: list = []
    thread = threading.Thread(target=contextvars.copy_context().run, args=(lambda: outcome.append(
        stage_release(repo_id=REPO, store_url=store.url, endpoint=local_hub.endpoint,
                      quarantine=str(tmp_path / "q2"), progress_interval=0.5,
                      return_state=True)),))
    thread.start()
    status = f"{slug('k3a', REPO, commit[:12])}-status"

    def bytes_staged() -> bool:
        assert thread.is_alive(), _latest_data(status)
        data = _latest_data(status)
        return "% staged" in data and "(0 of" not in data

    wait_until(bytes_staged, "the live status to show bytes staged", 60, interval=0.2)
    dom = browse(artifact_page(ui_server, status), tmp_path / "stage-live-status.png")
    thread.join(120)
    assert outcome and outcome[0].is_completed()
    assert "% staged" in dom and "ETA" in dom and "in flight" in dom

    release = releases.release()  # never reviewed: the license gate blocks it
    blocked = promote_release(tuple_id=release.id, channel="staging", store_url=store.url,
                              requested_by="ci",
                              reason="nightly candidate", return_state=True)
    assert blocked.name == "Blocked by gate"
    dom = browse(f"{ui_server}/runs/flow-run/{blocked.state_details.flow_run_id}",
                 tmp_path / "promote-blocked.png")
    assert "Blocked by gate" in dom
    assert f"promote {release.id} -&gt; staging" in dom or f"promote {release.id} -> staging" in dom
    dom = browse(artifact_page(ui_server, "k3a-promote-staging-refused"),
                 tmp_path / "promote-refused.png")
    assert "**FAIL**" not in dom and "FAIL" in dom and "license" in dom
