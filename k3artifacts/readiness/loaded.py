"""The ``loaded`` check: the weights and context length the server says it loaded are the
tuple's.

Every tuple of a profile shares its served model name, and a server answers to whatever tuple
id it was started with, so neither says which weights answer. vLLM's ``/v1/models`` does: each
entry's ``root`` is the ``--model`` path it read and ``max_model_len`` its context length. A
rendered pod reads the tuple's revision at the profile's model path (``/opt/ml/model``); a
server started on a revision's own directory (the node cache's ``models/<org>/<name>/<commit>``,
a store's revision path) names the commit in it. Any other path, another commit, or another
context length than the tuple's ``--max-model-len`` is named, and the endpoint is not ready.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from k3artifacts.readiness.checks import Probe, timed
from k3artifacts.releases.evaluations import CheckResult
from k3artifacts.releases.tuples import ReleaseTuple

COMMIT = re.compile(r"^[0-9a-f]{40}$")


def tuple_max_len(release: ReleaseTuple) -> int | None:
    """The tuple's ``--max-model-len``; None where its profile leaves vLLM's default."""
    args = release.binding.serving.args
    for i, arg in enumerate(args):
        if arg.startswith("--max-model-len="):
            return int(arg.split("=", 1)[1])
        if arg == "--max-model-len" and i + 1 < len(args):
            return int(args[i + 1])
    return None


def _root(root: object, release: ReleaseTuple) -> tuple[bool, str]:
    commit = release.binding.weights.commit
    model_path = release.binding.serving.model_path
    if not isinstance(root, str) or not root:
        return False, ("the server does not say what it loaded (no `root` in /v1/models): "
                       "which weights answer cannot be told")
    commits = [p for p in PurePosixPath(root).parts if COMMIT.match(p)]
    if commit in commits:
        return True, f"loaded {root} (the tuple's commit {commit[:12]})"
    if commits:
        return False, (f"loaded {root}: commit {commits[-1][:12]}, but the tuple binds "
                       f"{commit[:12]}: the server was started on another revision's weights")
    if root.rstrip("/") == model_path.rstrip("/"):
        return True, f"loaded {root}, the tuple's model path (where a render mounts its revision)"
    return False, (f"loaded {root}: neither the tuple's model path {model_path} nor a path of "
                   f"its commit {commit[:12]}")


def _max_len(listed: object, release: ReleaseTuple) -> tuple[bool, str]:
    want = tuple_max_len(release)
    if not isinstance(listed, int) or isinstance(listed, bool):
        if want is None:
            return True, "no max_model_len reported (the profile sets none)"
        return False, f"no max_model_len reported; the profile's --max-model-len is {want}"
    if want is None:
        return True, f"max_model_len {listed} (the profile leaves vLLM's default)"
    if listed != want:
        return False, (f"max_model_len {listed}, but the profile's --max-model-len is {want}: "
                       "not started with the tuple's serving arguments")
    return True, f"max_model_len {listed} as the profile says"


def loaded_check(probe: Probe, release: ReleaseTuple) -> CheckResult:
    def run() -> tuple[bool, str]:
        card = probe.card()
        if card is None:
            return False, f"/v1/models has no entry {probe.model}: what answers as it is unknown"
        scrub = probe.redactor.scrub
        root = card.get("root")
        parts = [_root(scrub(root) if isinstance(root, str) else root, release),
                 _max_len(card.get("max_model_len"), release)]
        return all(ok for ok, _ in parts), "; ".join(detail for _, detail in parts)

    return timed("loaded", run, retries=probe.settings.max_retries)
