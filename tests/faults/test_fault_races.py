"""Release-state races: two stagings of one revision, tuple writes with the same id, movers of
one channel. Outcome: exactly one winner, a complete history, nothing overwritten.

The promotion-versus-promotion and promotion-versus-rollback races with a barrier in front of
the compare-and-swap are in tests/test_promotion.py and tests/test_channels_cli.py (see the
README table); here they run as separate ``k3a`` processes and through a store that loses
answers.
"""

from __future__ import annotations

import pytest

from k3artifacts.verify import verify_revision
from tests.faults.faultkit import (
    run_k3a,
    stage_args,
    start_k3a,
    wait_for,
)
from tests.staging_helpers import REPO, small_release

pytestmark = pytest.mark.faults


def waiting_on_a_lock(pid: int) -> bool:
    """Whether process ``pid`` is blocked in flock() (the kernel lists it with ``->``)."""
    with open("/proc/locks") as fh:
        return any(f" {pid} " in line for line in fh if "->" in line)


def test_two_stagings_of_one_revision_into_one_file_store(local_hub, file_store, tmp_path,
                                                          k3a_cmd, k3a_env):
    """Two workers (own quarantines) stage the same revision onto one FSx tree; the first is
    held inside its publication while the second runs. Both succeed, the revision is published
    once, whole, and nothing of either run is left beside it."""
    files = small_release(tmp_path)
    files["tokenizer/tokenizer_config.json"] = b"{}"
    commit = local_hub.hub.add_commit(REPO, files)
    go = tmp_path / "go"
    first = start_k3a(k3a_cmd, k3a_env,
                      *stage_args(local_hub.endpoint, file_store, tmp_path / "q1"),
                      K3A_FAULT_PAUSE="publish:60", K3A_FAULT_RESUME=str(go))
    first.wait_line("paused at publish")
    second = start_k3a(k3a_cmd, k3a_env,
                       *stage_args(local_hub.endpoint, file_store, tmp_path / "q2"))
    wait_for(lambda: second.proc.poll() is not None or waiting_on_a_lock(second.proc.pid),
             "the second staging to finish or wait for the first")
    go.touch()

    assert first.finish() == 0, first.stderr
    assert second.finish() == 0, second.stderr
    assert file_store.list_revisions(REPO) == [commit]
    assert verify_revision(store=file_store, repo_id=REPO, commit=commit, full=True).ok
    beside = sorted(p.name for p in (file_store.root / "models" / REPO).iterdir()
                    if not p.name.endswith(".lock"))
    assert beside == [commit]
